"""A run over several machines, as one node's launcher sees it: how many nodes, which this is,
where node 0 listens, and how long every node has to join. Framework-free: torch's launcher
(torchrun's c10d rendezvous) and MXNet's (ps-lite's scheduler) take it from `--nnodes`,
`--node-rank`, `--rdzv-endpoint` and `--rdzv-timeout`; JAX reads the same values as its own
variables (jax_impl/guard.py)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from common import cli, config, cores, processes, supervise

_HELD: list[int] = []  # node 0's claim: its lock stays open, and held, while this process lives


@dataclass(frozen=True)
class Nodes:
    """A run over `count` machines; this is node `rank`; node 0 listens at `endpoint`."""

    count: int
    rank: int
    endpoint: str  # HOST:PORT, HOST being node 0's address
    timeout: int  # seconds for every node to join and this node's workers to start

    @classmethod
    def of(cls, args) -> Nodes | None:
        """From the command line (checked by checks.check_nodes); None on one machine."""
        if getattr(args, "nnodes", None) is None:
            return None
        timeout = args.rdzv_timeout or cli.RDZV_TIMEOUT_S
        return cls(args.nnodes, args.node_rank, args.rdzv_endpoint, timeout)

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.endpoint.rpartition(":")
        return host.strip("[]"), int(port)

    def local(self, env: dict) -> str:
        """This node's address toward node 0, never its host name (which may resolve to
        loopback); gloo (and NCCL's bootstrap) bind to the interface that holds it."""
        address, interface = processes.route_to(*self.host_port)
        if interface:
            env.setdefault("GLOO_SOCKET_IFNAME", interface)
            env.setdefault("NCCL_SOCKET_IFNAME", interface)
        return address

    def check(self, what: str = "rendezvous") -> None:
        """HOST resolves here, and on node 0 nothing else holds PORT (a client of another
        program's port would wait forever)."""
        host, port = self.host_port
        try:
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            raise config.ConfigError(
                f"--rdzv-endpoint {self.endpoint}: this node cannot resolve {host} "
                f"({e.strerror}); give node 0's address"
            ) from None
        if self.rank == 0:
            processes.check_own_address(
                host,
                port,
                f"--node-rank 0 hosts the {what} at --rdzv-endpoint {self.endpoint}, but {host} "
                "is not this machine's address: run node 0 where it is, or give this "
                "machine's address",
            )
            processes.check_port_free(
                port,
                "--rdzv-endpoint",
                taken=f"the {what} port {self.endpoint} is in use by another program; "
                "choose another --rdzv-endpoint port, the same on every node",
            )

    def timed_out(self) -> str:
        """The line that ends a rendezvous which did not complete in time."""
        others = [str(i) for i in range(self.count) if i != self.rank]
        who = f"node {others[0]}" if len(others) == 1 else f"one of nodes {', '.join(others)}"
        return (
            f"{who} did not join the rendezvous at {self.endpoint} within {self.timeout} s "
            f"(this is node {self.rank} of {self.count}): start the same command on every node "
            f"with its own --node-rank (0 to {self.count - 1}) and --nnodes {self.count}, and "
            f"check that {self.endpoint} is node 0's address, reachable from here, and not "
            "another program's port"
        )

    def claim(self, what: str) -> None:
        """Node 0's claim on its endpoint in this machine's network (a lock the kernel releases
        as this process ends). Two nodes here both given --node-rank 0 would both start the
        `what` on one port: the second is refused in one line, and leaves word for the first,
        whose run then ends in one line too (a check of supervise.watch), instead of waiting
        for a node that will not come."""
        base = cores.LOCK_DIR / f"multidevice-net{os.stat('/proc/self/ns/net').st_ino}"
        lock, refused = (Path(f"{base}-port{self.host_port[1]}.{end}") for end in ("lock", "no"))
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:  # another user's lock, or no lock folder to write in: no claim
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 40, 0).decode(errors="replace").strip()
            os.close(fd)
            with contextlib.suppress(OSError):
                refused.write_text(f"{holder} {os.getpid()}")
            raise config.ConfigError(
                f"another node 0 (pid {holder or '?'}) already hosts the {what} at "
                f"{self.endpoint} on this machine: {self._own_ranks()}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        _HELD.append(fd)
        supervise.WATCH_ALSO.append(lambda: self._refused(refused))

    def _refused(self, refused: Path) -> str | None:
        """Whether another node here was refused node 0's claim while this one held it."""
        try:
            with_pids = refused.read_text().split()
        except OSError:
            return None
        if len(with_pids) != 2 or with_pids[0] != str(os.getpid()):
            return None
        with contextlib.suppress(OSError):  # said once, here
            refused.unlink()
        return (
            f"another node on this machine (pid {with_pids[1]}) was also given --node-rank 0 "
            f"and was refused: {self._own_ranks()}"
        )

    def _own_ranks(self) -> str:
        return f"give each node its own --node-rank (0 to {self.count - 1})"
