"""A run over several machines, as one node's launcher sees it: how many nodes, which this is,
where node 0 listens, and how long every node has to join. Framework-free: torch's launcher
(torchrun's c10d rendezvous) and MXNet's (ps-lite's scheduler) take it from `--nnodes`,
`--node-rank`, `--rdzv-endpoint` and `--rdzv-timeout`; JAX reads the same values as its own
variables (jax_impl/guard.py)."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from common import cli, config, processes


@dataclass(frozen=True)
class Nodes:
    """A run over `count` machines; this is node `rank`; node 0 listens at `endpoint`."""

    count: int
    rank: int
    endpoint: str  # HOST:PORT, HOST being node 0's address
    timeout: int  # seconds for every node to join and this node's workers to start
    peer_timeout: int = cli.PEER_TIMEOUT_S  # seconds for a lost peer or link, once joined

    @classmethod
    def of(cls, args) -> Nodes | None:
        """From the command line (checked by checks.check_nodes); None on one machine."""
        if getattr(args, "nnodes", None) is None:
            return None
        timeout = args.rdzv_timeout or cli.RDZV_TIMEOUT_S
        peers = getattr(args, "peer_timeout", None) or cli.PEER_TIMEOUT_S
        return cls(args.nnodes, args.node_rank, args.rdzv_endpoint, timeout, peers)

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
            f"with its own --node-rank (0 to {self.count - 1}), and check that {self.endpoint} "
            "is node 0's address, reachable from here, and not another program's port"
        )
