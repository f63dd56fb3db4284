"""torchrun (`python -m torch.distributed.run`) as the launcher (launch.py) starts it: the same
program, quiet when it stops. torchrun turns a stop signal into a SignalException (it stops its
workers with that signal, then the exception ends it with a traceback), and a failed worker into
a ChildFailedError (a traceback and a box under the worker's own output). Here a stop ends with
exit 128 + the signal's number, and a failed worker with one line saying which and how; a
worker that failed on bad input left its line for the launcher (launch.worker_main), which ends
on it alone: torchrun then says nothing.

On one machine the launcher hosts the rendezvous store (launch._loopback). A launcher killed
outright takes the store along, and torchrun's next store call fails (its exit barrier, its
rendezvous keep-alive): c10's warning with a C++ stack, then logged tracebacks, on a terminal
whose command has ended. torchrun stops its workers without a word then: its C++ warnings are
off where the store is the launcher's, its logging says nothing once its launcher is gone,
and an error out of its agent then (the store's) ends it without a traceback.
"""

import contextlib
import logging
import os
import signal
import sys
import time

from common import signals
from torch_impl import launch

CPP_LOG_ENV = "TORCH_CPP_LOG_LEVEL"  # read by c10 as torch loads


def main() -> int:
    # Its launcher gone, even SIGKILLed (before this process could look, too): a SIGTERM to
    # itself, which torchrun passes to its workers before it ends, as when the launcher stops it.
    launcher = signals.watch_launcher(on_exit=_stop_quietly)
    with _cpp_warnings_off(bool(os.environ.get(launch.LOOPBACK_ENV))):
        from torch.distributed import run
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    if launcher is not None:
        _quiet_without(launcher)
    # Its warning per worker it stops ("Sending process N closing signal SIGTERM") and its
    # error naming the first that failed: the line below, or the worker's own, says that.
    api = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    api.setLevel(logging.ERROR)
    api.addFilter(lambda record: not str(record.msg).startswith("failed (exitcode"))
    try:
        run.main()  # its arguments: sys.argv[1:]
    except SignalException as e:
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        if _worker_said_it():
            return 1
        rank, failure = e.get_first_failure()
        how = f"exit code {failure.exitcode}"
        if failure.exitcode < 0:  # killed: nothing of its own said why
            how = f"signal {failure.signal_name()}"
        print(f"torchrun: worker rank {rank} ended with {how}", file=sys.stderr)
        return 1
    except Exception:
        # The store went with its launcher, and torchrun's next call to it (its rendezvous
        # keep-alive) can fail before the watch sees the launcher gone: the same quiet end.
        if launcher is None or not _gone(launcher):
            raise
        _silence()
        return 128 + signal.SIGTERM
    return 0


def _worker_said_it() -> bool:
    """Whether a worker left its one-line error for the launcher (launch.worker_main), which
    then ends on that line alone."""
    said = os.environ.get(launch.ERROR_FILE_ENV)
    return bool(said) and os.path.isfile(said)


@contextlib.contextmanager
def _cpp_warnings_off(off: bool):
    """c10 at ERROR for this process only (`off`); the workers it starts get the user's level."""
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
    """No log record once `launcher` is gone (its parent then is another: checked as each record
    is emitted, so none slips out before the watch sees it), and none of logging's own reports of
    a handler that a stop signal interrupted. torch's loggers each have a handler of their own
    and do not propagate: the check goes on every handler there is once torch is imported."""
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


if __name__ == "__main__":
    sys.exit(main())
