"""torchrun, the way this project starts one process per device (resnet18's DDP, resnet50's
gpipe and 1f1b), and the worker's side of it: `python -m torch.distributed.run --standalone
--nproc-per-node=N -m torch_impl ARGV` (through torch_impl/torchrun.py, which ends quietly when
it is stopped). Each worker is the user's command again (`cli.worker_argv`), which knows itself
a worker by torchrun's environment (`is_worker`) and runs `worker_main`.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous in each worker's environment;
`join` joins the group with them (init_process_group): the worker's world (common.world).

Several machines (resnet18 ddp): the same command on every node, with `--gpus` per node:

  python -m torch_impl --workload resnet18 --gpus G --nnodes 2 --node-rank R \
      --rdzv-endpoint HOST:29500 [--rdzv-timeout 300] [--preset ...] [--results ...]

R = 0 on HOST, whose torchrun hosts the rendezvous on port 29500, and 1 on the other. The world
size is nnodes x G and the batch and lr scale with it; the record (extra.nnodes) is appended to
`--results` on the node that torchrun makes rank 0 (c10d numbers the nodes itself). Two "nodes"
on one machine work the same with HOST=127.0.0.1. What each node runs (through
torch_impl/torchrun.py):

  python -m torch.distributed.run --nnodes=2 --nproc-per-node=G --rdzv-backend=c10d \
      --rdzv-endpoint=HOST:29500 --rdzv-id=multidevice \
      --rdzv-conf=is_host=true,join_timeout=360,read_timeout=360 --local-addr=ADDR \
      -m torch_impl ...

(is_host=false on the other nodes; ADDR this node's address toward HOST, GLOO_SOCKET_IFNAME its
interface: `Nodes.local`). torch's waits at that rendezvous (its store on node 0) end in
tracebacks, or never (a client of a port that another program holds waits forever), so this
launcher checks the port on node 0 first, gives torch's timeouts a margin above its own bound,
and stops torchrun with one line when no worker of this node has started training (each says
so in a file, READY_FILE_ENV) within `--rdzv-timeout` seconds.

torchrun runs in a session of its own: a Ctrl-C reaches the launcher only, which stops torchrun
(which stops its workers, in sessions of their own) within a bound and kills any worker left;
one reaching torchrun too would have subprocess SIGKILL it before it stopped its workers.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from common import cli, config, devices, processes, signals, supervise
from common.world import World, alone

ROOT = Path(__file__).resolve().parent.parent
ERROR_FILE_ENV = "MULTIDEVICE_WORKER_ERROR_FILE"  # where a worker leaves its one-line error
READY_FILE_ENV = "MULTIDEVICE_WORKER_READY_FILE"  # made by a worker once its process group is up
PIDS_FILE_ENV = "MULTIDEVICE_WORKER_PIDS_FILE"  # each worker's pid, for the launcher to stop it
RDZV_ID = "multidevice"  # the same on every node: the nodes of one command meet under it
TORCH_MARGIN_S = 60  # torch's own rendezvous timeouts end this much after the launcher's
POLL_S = 0.2
STOP_WAIT_S = 40  # after SIGTERM torchrun gives its workers 30 s to end, then kills them
LOOPBACK_ENV = "MULTIDEVICE_LOOPBACK"  # one machine: every socket on 127.0.0.1 (_loopback)
COLLECTIVE_TIMEOUT_S = 300  # a rank stuck in a collective fails after this, never hangs forever


@dataclass(frozen=True)
class Nodes:
    """A run over `count` machines; this is node `rank`; node 0 hosts the rendezvous."""

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

    def torchrun_options(self, address: str) -> list[str]:
        """`address`: this node's own (`local`): torchrun advertises it for the workers' store."""
        # c10d numbers the nodes itself (torchrun ignores --node-rank there): the node rank
        # says which one hosts the store (is_host). torch's timeouts end after the launcher's,
        # so its line, not a torch traceback, is the one a user reads.
        limit = self.timeout + TORCH_MARGIN_S
        host = "true" if self.rank == 0 else "false"
        return [
            f"--nnodes={self.count}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.endpoint}",
            f"--rdzv-id={RDZV_ID}",
            f"--rdzv-conf=is_host={host},join_timeout={limit},read_timeout={limit}",
            f"--local-addr={address}",
        ]

    def local(self, env: dict) -> str:
        """This node's address toward node 0, never its host name (which may resolve to
        loopback); gloo (and NCCL's bootstrap) bind to the interface that holds it."""
        address, interface = processes.route_to(*self.endpoint.rsplit(":", 1))
        if interface:
            env.setdefault("GLOO_SOCKET_IFNAME", interface)
            env.setdefault("NCCL_SOCKET_IFNAME", interface)
        return address

    def check(self) -> None:
        """HOST resolves here, and on node 0 nothing else holds PORT (a client of another
        program's port would wait forever)."""
        host, _, port = self.endpoint.rpartition(":")
        try:
            socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            raise config.ConfigError(
                f"--rdzv-endpoint {self.endpoint}: this node cannot resolve {host} "
                f"({e.strerror}); give node 0's address"
            ) from None
        if self.rank == 0:
            processes.check_port_free(
                int(port),
                "--rdzv-endpoint",
                taken=f"the rendezvous port {self.endpoint} is in use by another program; "
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


def torchrun(argv: list[str], nproc: int, what: str, nodes: Nodes | None = None, env=None):
    """Run `python -m torch_impl *argv` in `nproc` worker processes on this machine (and, with
    `nodes`, as one node of several), `env` added to theirs; raise SystemExit with one line if
    any of them fails (torchrun then stops the others)."""
    env = {**os.environ, **(env or {})}
    # torchrun sets OMP_NUM_THREADS=1 when it is unset (docs/design.md, traps): the processes
    # share the cores instead.
    env.setdefault(devices.OMP_THREADS_ENV, str(max(1, devices.cores_allowed() // nproc)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env[cli.NOTE_SHOWN_ENV] = "1"  # this process (cli.run) already said the devices are virtual
    env[signals.PARENT_ENV] = str(os.getpid())  # torchrun ends with this launcher, even killed
    env.setdefault("LOGLEVEL", "ERROR")  # torchrun's warnings as it stops: the launcher says it
    cmd = [sys.executable, "-m", "torch_impl.torchrun"]  # torch.distributed.run, quiet if stopped
    with contextlib.ExitStack() as stack:
        if nodes:
            nodes.check()
            cmd += nodes.torchrun_options(nodes.local(env))
        else:
            cmd += stack.enter_context(_loopback(env))
        cmd += [f"--nproc-per-node={nproc}", "--monitor-interval=0.5", "-m", "torch_impl", *argv]
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        _torchrun(cmd, env, tmp, what, nodes)


def _torchrun(cmd: list[str], env: dict, tmp: str, what: str, nodes: Nodes | None) -> None:
    """torchrun run to its end (_run); a failure ends in one line (SystemExit)."""
    for name in (ERROR_FILE_ENV, READY_FILE_ENV, PIDS_FILE_ENV):
        env[name] = str(Path(tmp) / name.lower())
    rc = _run(cmd, env, nodes)
    if rc == 0:
        return
    # A worker's own error is the line to end on, with its code (the first, where several
    # workers failed), not torchrun's summary of it.
    said = Path(env[ERROR_FILE_ENV])
    if said.is_file():
        code, line = said.read_text().splitlines()[0].split(" ", 1)
        print(line, file=sys.stderr)
        raise SystemExit(int(code))
    met = nodes is None or Path(env[READY_FILE_ENV]).exists()
    raise SystemExit(_failure(what, rc, nodes, met))


@contextlib.contextmanager
def _loopback(env: dict):
    """One machine's rendezvous on 127.0.0.1 only (torchrun's options for it): these engines
    authenticate nobody, and torch's stores listen on every interface whatever address they
    are given. So this launcher hosts the rendezvous store on a socket of its own bound to
    127.0.0.1, torchrun joins it as a client and shares no store of its own, the workers'
    store is made the same way (`join`), and gloo and NCCL use the loopback
    interface unless told otherwise."""
    import torch.distributed as dist

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    # The store owns the socket from here (and closes it when it goes).
    store = dist.TCPStore("127.0.0.1", port, is_master=True, master_listen_fd=sock.detach())
    env.update({LOOPBACK_ENV: "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    try:
        yield [
            "--nnodes=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id={RDZV_ID}-{os.getpid()}",
            "--rdzv-conf=is_host=false",
            "--local-addr=127.0.0.1",
        ]
    finally:
        del store


def _failure(what: str, rc: int, nodes: Nodes | None, met: bool) -> str:
    """The line for a torchrun that failed without a worker's error line; `met`: the nodes
    had met (a worker's process group was up)."""
    if nodes is None:
        return (
            f"error: {what} failed: a worker exited with an error (torchrun exit {rc}); "
            "see the worker output above"
        )
    if not met:
        return (
            f"error: {what} failed: torchrun exited with code {rc} before the workers of node "
            f"{nodes.rank} had joined the others (rendezvous at {nodes.endpoint}); see its "
            "output above"
        )
    # torchrun also fails when another node's does
    return (
        f"error: {what} failed on node {nodes.rank}: torchrun exited with code {rc} (a worker "
        "here or another node failed); see the output above and on the other nodes"
    )


def _run(cmd: list[str], env: dict, nodes: Nodes | None) -> int:
    """torchrun in a session of its own, to its end; a Ctrl-C or an error here, or (one node
    of several) a rendezvous not complete within `nodes.timeout`, stops it and its workers:
    SIGTERM lets torchrun stop them first, SIGKILL if it has not within STOP_WAIT_S."""
    if nodes:
        print(
            f"node {nodes.rank} of {nodes.count}: waiting up to {nodes.timeout} s for every "
            f"node to join the rendezvous at {nodes.endpoint}",
            file=sys.stderr,
            flush=True,
        )
    with supervise.Group("torchrun") as group:
        proc = group.start("torchrun", cmd, env, capture=None, cwd=ROOT).popen
        try:
            if nodes:
                ready, deadline = Path(env[READY_FILE_ENV]), time.monotonic() + nodes.timeout
                while proc.poll() is None and not ready.exists():
                    if time.monotonic() > deadline:
                        raise config.ConfigError(nodes.timed_out())
                    time.sleep(POLL_S)
            return _wait(group)
        finally:
            group.stop(STOP_WAIT_S)
            _kill_workers(Path(env[PIDS_FILE_ENV]))


def _wait(group: supervise.Group) -> int:
    """torchrun's exit code; a worker stopped (SIGSTOP) ends the run in one line, where its
    peers would wait for it in a collective for COLLECTIVE_TIMEOUT_S."""
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return group.members[0].popen.wait(supervise.CHECK_S)
        if reason := supervise.stopped_member(group):
            group.stop()  # at once: a stopped worker would hold torchrun's own stop
            print(f"error: {reason}; every process was stopped", file=sys.stderr)
            raise SystemExit(1)


def _kill_workers(pids_file: Path) -> None:
    """SIGKILL the workers that outlived torchrun (one SIGKILLed before it had stopped them):
    the pids they wrote in `pids_file`, each only if its environment still names that file (a
    pid may have been reused)."""
    mark = f"{PIDS_FILE_ENV}={pids_file}".encode()
    pids = pids_file.read_text().split() if pids_file.is_file() else []
    for pid in map(int, pids):
        with contextlib.suppress(OSError):  # gone already, or not ours to read
            if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                os.kill(pid, signal.SIGKILL)


def is_worker() -> bool:
    """Whether this process is one of torchrun's workers (its environment says so)."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "LOCAL_RANK" in os.environ


def join(plan: devices.DevicePlan, args=None) -> World:
    """This process's world: a DDP rank that torchrun started (`is_worker`) joins the group its
    environment describes (NCCL on GPUs, gloo on CPUs) on its one device, and leaves it as it
    ends (`worker_main`); any other process is alone on the plan's devices. `args`: unused."""
    import torch
    import torch.distributed as dist

    from torch_impl import devices as tdev

    if not is_worker():
        return World.single(tdev.get_devices(plan), plan)
    local, gpu = int(os.environ["LOCAL_RANK"]), plan.platform == "gpu"
    device = torch.device(f"cuda:{local}") if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    backend, device_id = ("nccl", device) if gpu else ("gloo", None)  # NCCL: its GPU, unguessed
    dist.init_process_group(backend, timeout=timeout, device_id=device_id, **_loopback_store())
    if os.environ.get(READY_FILE_ENV):  # every node has joined: the launcher's wait ends
        Path(os.environ[READY_FILE_ENV]).touch()

    def total(x):  # float64, on the rank's device: NCCL reduces CUDA tensors only
        t = torch.tensor(x, dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return t.cpu().numpy()

    rank, size = dist.get_rank(), dist.get_world_size()
    everyone = replace(plan, count=size)  # one device per rank
    return World(rank, size, [device], total if size > 1 else alone, everyone, dist.group.WORLD)


def _loopback_store() -> dict:
    """init_process_group's store on one machine (`_loopback`): rank 0 hosts it on a socket
    bound to 127.0.0.1, at the port torchrun chose; {} elsewhere (torch makes its own)."""
    if not os.environ.get(LOOPBACK_ENV):
        return {}
    import torch.distributed as dist

    rank, world, port = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT"))
    timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    if rank:
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timeout)
        return {"store": store, "rank": rank, "world_size": world}
    sock = socket.socket()  # the store's for as long as this process lives
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    store = dist.TCPStore(
        "127.0.0.1", port, world, is_master=True, timeout=timeout, master_listen_fd=sock.detach()
    )
    return {"store": store, "rank": rank, "world_size": world}


def end_process_group() -> None:
    """Leave the group `join` joined, if any (a worker's `finally`, `worker_main`): first every
    rank waits for the others where its run ended well or diverged (every rank's training then
    stops), so none leaves while another still uses it (rank 0 writing the record); after another
    error they may never come. exit_worker then ends the worker: gloo's threads live on."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if sys.exc_info()[0] in (None, cli.training.Diverged):
        try:
            dist.barrier()
        except RuntimeError:  # gloo's and NCCL's errors: a rank left (rank 0 on a full disk)
            raise PeerLeft from None
    dist.destroy_process_group()


class PeerLeft(Exception):
    """Another rank left the group, with an error its own line says: this rank ends quietly."""


def worker_main(entry) -> None:
    """Run a worker's `entry()` and end it with exit_worker: a user error is one line with its
    exit code, left for the launcher to end on (said here without one), Ctrl-C ends quietly;
    the exit code tells torchrun. Any other exception ends in its traceback, as a bug should."""
    if os.environ.get(PIDS_FILE_ENV):  # for the launcher to stop it, should torchrun not
        with open(os.environ[PIDS_FILE_ENV], "a") as f:
            f.write(f"{os.getpid()}\n")
    signals.watch_parent()  # torchrun gone, even SIGKILLed: this worker stops, writing nothing
    code = 0
    try:
        with signals.as_interrupt():
            try:
                entry()
            finally:
                end_process_group()
    except cli.USER_ERRORS as e:
        line, code = f"error: {e}", cli.exit_code(e)
        if os.environ.get(ERROR_FILE_ENV):  # the launcher says it, once for all its workers
            with open(os.environ[ERROR_FILE_ENV], "a") as f:
                f.write(f"{code} {line}\n")
        else:
            print(line, file=sys.stderr)
    except KeyboardInterrupt as e:
        code = signals.exit_code(e)
    except PeerLeft:
        code = 1
    exit_worker(code)


def exit_worker(code: int) -> None:
    """End a worker whose process group is gone, skipping the interpreter's shutdown, where
    gloo's threads, which outlive destroy_process_group, can abort it (SIGABRT; docs/design.md,
    "Traps"). Its files are written and closed by now: the streams are flushed and the process
    leaves at once, as a forked multiprocessing child does."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stream: nothing to say
            stream.flush()
    os._exit(code)
