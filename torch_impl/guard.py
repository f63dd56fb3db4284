"""The operations layer around torch_impl/launch.py: what keeps a torchrun run robust, applied
around the lesson's calls and not inside them (docs/design.md, "Traps").

- Sockets. torch's TCPStore listens on every interface whatever address it is given, and none
  of these engines authenticates its peers. On one machine this launcher hosts the rendezvous
  store on a socket of its own bound to 127.0.0.1, torchrun joins it as a client and shares no
  store of its own, rank 0 hosts the workers' store the same way (`group_options`), and gloo and
  NCCL use the loopback interface unless told otherwise.
- Supervision (`run_torchrun`): torchrun runs in a session of its own, watched from outside
  (common.supervise.run_launcher): a Ctrl-C reaches this launcher only, which stops torchrun
  (which stops its workers) within a bound and kills any worker left; a run over several
  machines waits a bounded time for every node (nodes given different --nnodes are named as
  that: each notes its count in node 0's store); a failure is one line.
- torchrun itself runs as `python -m torch_impl.guard`, which is torchrun (`run.main`) made
  quiet: it turns a stop signal into a traceback and a failed worker into a traceback and a
  box; here they are exit 128 + the signal's number and one line. A launcher killed outright
  takes the store along, and torchrun stops its workers without a word then.
- Each worker (`worker_main`) notes its pid for the launcher, leaves its one-line error there,
  leaves the group at a barrier (`end_process_group`) and ends with `exit_worker`.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import cli, devices, processes, signals, supervise, watchdog
from common.nodes import Nodes
from torch_impl import counts

ROOT = Path(__file__).resolve().parent.parent
LOOPBACK_ENV = "MULTIDEVICE_LOOPBACK"  # one machine: every socket on 127.0.0.1
TORCH_MARGIN_S = 60  # torch's own rendezvous timeouts end this much after the launcher's
COLLECTIVE_TIMEOUT_S = 300  # a rank stuck in a collective fails after this, never hangs forever
CPP_LOG_ENV = "TORCH_CPP_LOG_LEVEL"  # read by c10 as torch loads
LOST_RENDEZVOUS = 3  # torchrun's exit code when its rendezvous store went


# --- the launcher's side ----------------------------------------------------------------------


def run_torchrun(cmd: list[str], nproc: int, what: str, nodes: Nodes | None, env=None) -> None:
    """Run launch.torchrun_command's `cmd` supervised, quiet and on loopback (one machine);
    return when every worker has finished, else end with one line (SystemExit)."""
    env = {**os.environ, **(env or {})}
    # torchrun sets OMP_NUM_THREADS=1 when it is unset: the processes share the cores instead.
    env.setdefault(devices.OMP_THREADS_ENV, str(max(1, devices.cores_allowed() // nproc)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env[cli.NOTE_SHOWN_ENV] = "1"  # this process (cli.run) already said the devices are virtual
    env[signals.PARENT_ENV] = str(os.getpid())  # torchrun ends with this launcher, even killed
    env.setdefault("LOGLEVEL", "ERROR")  # torchrun's warnings as it stops: the launcher says it
    # c10d's warnings (a client's host name it cannot look up; each failed send, with its C++
    # stack, once a peer has gone): a failure is the launcher's one line.
    env.setdefault(CPP_LOG_ENV, "ERROR")
    assert cmd[1:3] == ["-m", "torch.distributed.run"], cmd
    cmd = [cmd[0], "-m", "torch_impl.guard", *cmd[3:]]  # torchrun, quiet
    at = cmd.index("-m", 3)  # the worker's module: torchrun's own options go before it
    with contextlib.ExitStack() as stack:
        if nodes:
            nodes.check()
            if here := processes.loopback(nodes.host_port[0]):  # every node on this machine
                stack.enter_context(_loopback(env, here, nodes.host_port[1], nodes.rank == 0))
            cmd[at:at] = _node_options(nodes, nodes.local(env), nodes.rank == 0 and not here)
        else:
            cmd[at:at] = stack.enter_context(_loopback(env))
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        env.update({name: str(Path(tmp) / name.lower()) for name in supervise.WORKER_FILES})
        if nodes:
            print(
                f"node {nodes.rank} of {nodes.count}: waiting up to {nodes.timeout} s for every "
                f"node to join the rendezvous at {nodes.endpoint}",
                file=sys.stderr,
                flush=True,
            )
        if nodes:
            env[counts.COUNTS_ENV] = f"{nodes.rank} {nodes.count} {nodes.timeout} {nodes.endpoint}"
            env[counts.COUNTS_FILE_ENV] = str(Path(tmp) / "counts")
        wait = (nodes.timeout, lambda: counts.not_joined(nodes, env)) if nodes else (None, "")
        rc = supervise.run_launcher(
            cmd, env, nproc, *wait, cwd=ROOT, stop_s=watchdog.peer_timeout()
        )
        if rc:
            _failed(what, rc, nodes, env)


def _node_options(nodes: Nodes, address: str, hosts: bool) -> list[str]:
    """torchrun's settings as one node of several: whether it hosts the store (c10d numbers
    the nodes itself and ignores --node-rank), torch's timeouts after the launcher's (its line,
    not a torch traceback, is the one a user reads), and this node's own address (`local`)."""
    limit = nodes.timeout + TORCH_MARGIN_S
    host = "true" if hosts else "false"
    conf = f"--rdzv-conf=is_host={host},join_timeout={limit},read_timeout={limit}"
    return [conf, f"--local-addr={address}", "--monitor-interval=0.5"]


@contextlib.contextmanager
def _loopback(env: dict, address: str = "127.0.0.1", port: int = 0, hosts: bool = True):
    """The rendezvous on loopback only: a store this launcher `hosts` at `address`:`port` (0: any
    free port), which torchrun joins as a client (one machine's options, yielded)."""
    import torch.distributed as dist

    store = None
    if hosts:  # the store owns the socket from here (and closes it when it goes)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.create_server((address, port), family=family, backlog=128)
        port = sock.getsockname()[1]
        store = dist.TCPStore(address, port, is_master=True, master_listen_fd=sock.detach())
    env.update({LOOPBACK_ENV: "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    try:
        yield [
            "--nnodes=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id=multidevice-{os.getpid()}",
            "--rdzv-conf=is_host=false",
            "--local-addr=127.0.0.1",
            "--monitor-interval=0.5",
        ]
    finally:
        del store


def _failed(what: str, rc: int, nodes: Nodes | None, env: dict):
    """End a failed run in one line: a worker's own error with its code (the first, where
    several failed), else what torchrun's exit says."""
    said = supervise.worker_error(env)
    if said:
        print(said[1], file=sys.stderr)
        raise SystemExit(said[0])
    if nodes is None:
        raise SystemExit(
            f"error: {what} failed: a worker exited with an error (torchrun exit {rc}); "
            "see the worker output above"
        )
    if rc == LOST_RENDEZVOUS:
        raise SystemExit(
            f"error: {what} failed on node {nodes.rank}: the rendezvous store on node 0 "
            f"({nodes.endpoint}) is gone: node 0 or the link to it went down"
        )
    if not Path(env[supervise.READY_FILE_ENV]).exists():
        raise SystemExit(
            f"error: {what} failed: torchrun exited with code {rc} before the workers of node "
            f"{nodes.rank} had joined the others (rendezvous at {nodes.endpoint}); see its "
            "output above"
        )
    raise SystemExit(  # torchrun also fails when another node's does
        f"error: {what} failed on node {nodes.rank}: torchrun exited with code {rc} (a worker "
        "here or another node failed); see the output above and on the other nodes"
    )


# --- the worker's side --------------------------------------------------------------------------


def is_worker() -> bool:
    """Whether this process is one of torchrun's workers (its environment says so)."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "LOCAL_RANK" in os.environ


def joining(join):
    """`launch.join`, nodes' counts checked first; then the word that this worker is up."""

    @functools.wraps(join)
    def joined(plan, args=None):
        counts.check_round()  # a node given another --nnodes: the counts, not a lost peer
        world = join(plan, args)
        if world.group is not None:  # a worker, in its group
            supervise.note(supervise.READY_FILE_ENV)
        return world

    return joined


def group_options() -> dict:
    """init_process_group's keywords besides the backend: a bound on every collective (on several
    machines --peer-timeout: a peer or a link lost mid-run or at the exit barrier ends the rank
    in one line; on one machine, where the launcher sees a lost peer's process go,
    COLLECTIVE_TIMEOUT_S), and on one machine (LOOPBACK_ENV) the workers' store, which rank 0
    hosts on a socket bound to 127.0.0.1 at the port torchrun chose (elsewhere torch makes its
    own)."""
    import torch.distributed as dist

    if not os.environ.get(LOOPBACK_ENV):  # several machines: --peer-timeout
        return {"timeout": datetime.timedelta(seconds=watchdog.peer_timeout())}
    rank, world, port = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT"))
    one = world == int(os.environ["LOCAL_WORLD_SIZE"])  # not nodes meeting on loopback
    timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S if one else watchdog.peer_timeout())
    if rank:
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timeout)
    else:
        sock = socket.socket()  # the store's for as long as this process lives
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        store = dist.TCPStore(
            "127.0.0.1", port, world, True, timeout=timeout, master_listen_fd=sock.detach()
        )
    return {"timeout": timeout, "store": store, "rank": rank, "world_size": world}


def end_process_group() -> None:
    """Leave the group `join` joined, if any: first every rank waits for the others where its
    run ended well or diverged (every rank's training then stops), so none leaves while another
    still uses it (rank 0 writing the record); after another error they may never come.
    exit_worker then ends the worker: gloo's threads live on."""
    dist = sys.modules.get("torch.distributed")  # unimported (stopped in torch's import): no group
    if dist is None or not dist.is_initialized():
        return
    if sys.exc_info()[0] in (None, cli.training.Diverged):
        try:
            dist.barrier()
        except RuntimeError as e:  # gloo's and NCCL's: a rank left (rank 0 on a full disk)
            raise PeerLeft(_first_line(e)) from None
    dist.destroy_process_group()


class PeerLeft(Exception):
    """Another rank left the group at its end: with an error of its own, whose line the
    launcher says first (on one machine), or with its node or the link (several)."""


def worker_main(entry) -> None:
    """Run a worker's `entry()` and end it with exit_worker: a user error is one line with its
    exit code, left for the launcher to end on (said here without one), Ctrl-C ends quietly;
    the exit code tells torchrun. Any other exception ends in its traceback, as a bug should."""
    supervise.note(supervise.PIDS_FILE_ENV, f"{os.getpid()}\n")  # should torchrun not stop it
    # torchrun gone, even SIGKILLed (before this worker could look, too): it stops, writing
    # nothing. torchrun's pid comes from guard.main; torchrun started by hand: the parent.
    if signals.watch_launcher() is None:
        signals.watch_parent()
    code = 0
    try:
        with signals.as_interrupt():
            try:
                entry()
            finally:
                end_process_group()
    except cli.USER_ERRORS as e:
        line, code = f"error: {e}", cli.exit_code(e)
        if not supervise.note(supervise.ERROR_FILE_ENV, f"{code} {line}\n"):
            print(line, file=sys.stderr)  # no launcher to say it once for all its workers
    except KeyboardInterrupt as e:
        code = signals.exit_code(e)
    except Exception as e:
        if not isinstance(e, PeerLeft) and not _lost_a_peer(e):
            raise  # a bug: its traceback
        code, at = 1, " at its end" if isinstance(e, PeerLeft) else ""
        line = f"error: lost another process of the run{at} (its node, or the link): "
        line += str(e) if isinstance(e, PeerLeft) else _first_line(e)
        if not supervise.note(supervise.ERROR_FILE_ENV, f"{code} {line}\n"):
            print(line, file=sys.stderr)
    supervise.note(supervise.DONE_FILE_ENV, f"{code}\n")  # for a launcher torchrun would keep
    exit_worker(code)


def _lost_a_peer(e: Exception) -> bool:
    """Whether `e` is the process group's, where another rank or the link to it went: c10d's
    errors (its store, its backends) and gloo's, which reach Python as a RuntimeError."""
    import torch.distributed as dist

    gloo = isinstance(e, RuntimeError) and "gloo" in str(e)
    return isinstance(e, dist.DistError) or gloo


def _first_line(e: Exception) -> str:
    """An engine error's first line, without the C++ source position it starts with."""
    line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    line = line.split("] ", 1)[-1] if line.startswith("[") else line
    return line.split(". ", 1)[0]  # gloo goes on with advice and a joke


def exit_worker(code: int) -> None:
    """End a worker whose process group is gone, skipping the interpreter's shutdown, where
    gloo's threads, which outlive destroy_process_group, can abort it (SIGABRT; docs/design.md,
    "Traps"). Its files are written and closed by now: the streams are flushed and the process
    leaves at once, as a forked multiprocessing child does."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stream: nothing to say
            stream.flush()
    os._exit(code)


# --- torchrun, quiet: `python -m torch_impl.guard` ----------------------------------------------


def main() -> int:
    """torchrun (`run.main`, its arguments sys.argv[1:]) ending in one line or none."""
    # Its launcher gone, even SIGKILLed (before this process could look, too): a SIGTERM to
    # itself, which torchrun passes to its workers before it ends, as when the launcher stops it.
    launcher = signals.watch_launcher(on_exit=_stop_quietly)
    with _cpp_warnings_off(bool(os.environ.get(LOOPBACK_ENV))):
        from torch.distributed import DistError, run
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.elastic.rendezvous import RendezvousError
    if launcher is not None:
        _quiet_without(launcher)
    if os.environ.get(counts.COUNTS_ENV):
        threading.Thread(target=counts.share, name="node-counts", daemon=True).start()
    # Its warning per worker it stops ("Sending process N closing signal SIGTERM") and its
    # error naming the first that failed: the line below, or the worker's own, says that.
    api = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    api.setLevel(logging.ERROR)
    api.addFilter(lambda record: not str(record.msg).startswith("failed (exitcode"))
    # Its warning that a lost rendezvous could not be shut down: the launcher's line says it.
    logging.getLogger("torch.distributed.elastic.rendezvous").setLevel(logging.ERROR)
    try:
        with signals.launching():  # its workers are told this process's pid (worker_main)
            run.main()
    except SignalException as e:
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        if os.path.isfile(os.environ.get(supervise.ERROR_FILE_ENV, "")):
            return 1  # a worker left its line for the launcher, which ends on it alone
        rank, failure = e.get_first_failure()
        how = f"exit code {failure.exitcode}"
        if failure.exitcode < 0:  # killed: nothing of its own said why
            how = f"signal {failure.signal_name()}"
        print(f"torchrun: worker rank {rank} ended with {how}", file=sys.stderr)
        return 1
    except (RendezvousError, DistError):
        # The rendezvous store is gone: node 0 or the link to it (several machines), or, on
        # one machine, the launcher that hosted it, gone before the watch saw it.
        if launcher is not None and _gone(launcher):
            _silence()
            return 128 + signal.SIGTERM
        return LOST_RENDEZVOUS  # the launcher says it, in its one line
    return 0


@contextlib.contextmanager
def _cpp_warnings_off(off: bool):
    """c10 at ERROR for this process only (`off`): where the store is the launcher's, its
    going is announced with a C++ stack. The workers torchrun starts get the user's level."""
    saved = os.environ.get(CPP_LOG_ENV)
    if off:
        os.environ[CPP_LOG_ENV] = "ERROR"
    try:
        yield
    finally:
        os.environ.pop(CPP_LOG_ENV, None)
        if saved is not None:
            os.environ[CPP_LOG_ENV] = saved


def _quiet_without(launcher: int) -> None:
    """No log record once `launcher` is gone (checked as each record is emitted, so none slips
    out before the watch sees it), and none of logging's own reports of a handler that a stop
    interrupted. torch's loggers each have a handler and do not propagate: the check goes on
    every handler there is once torch is imported."""
    logging.raiseExceptions = False
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for handler in {h for logger in loggers for h in getattr(logger, "handlers", ())}:
        handler.addFilter(lambda record: os.getppid() == launcher)


def _gone(launcher: int, bound: float = 1.0) -> bool:
    """Whether `launcher` is gone, or goes within `bound` s: a process killed outright closes
    its sockets before its children are given another parent."""
    end = time.monotonic() + bound
    while os.getppid() == launcher and time.monotonic() < end:
        time.sleep(0.05)
    return os.getppid() != launcher


def _silence() -> None:
    """stdout and stderr to /dev/null: the terminal's command has ended."""
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(null, fd)


def _stop_quietly() -> None:
    """Its launcher gone: silent, then the SIGTERM that stops it."""
    _silence()
    os.kill(os.getpid(), signal.SIGTERM)


def graph_skips() -> int:
    """How many graphs torch.compile left out of CUDA graphs in this process (torch logs each
    reason too): TorchInductor tallies them only in torch._dynamo's private counters."""
    from torch._dynamo.utils import counters  # loaded for --compile only

    return counters["inductor"]["cudagraph_skips"]


if __name__ == "__main__":
    sys.exit(main())
