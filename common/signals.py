"""A run stops the same way however it is told to (docs/design.md, "Traps"): Ctrl-C (SIGINT),
SIGTERM (`kill`, `timeout`, systemd, a batch scheduler) and SIGHUP (its terminal closed) each
end it as Ctrl-C does: one line, exit code 128 + the signal's number, no record written, its
launcher stopping its workers on the way out. A process that a launcher started ends when that
launcher is gone, even SIGKILLed (`watch_parent`), instead of training on and writing a record
nobody asked for any more.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

STOPS = (signal.SIGTERM, signal.SIGHUP)  # handled as SIGINT is
GRACE = 5.0  # seconds a stop waits for the main thread before the watchdog ends the process
LEAVE_BOUND = 30.0  # seconds the watchdog gives a goodbye of `on_leaving`
_LEAVE: list[Callable[[], None]] = []
_TAKEN: list[int] = []  # the stop signals this process's main thread took up
STOPPED = "interrupted; no record written"


_SAY = threading.Lock()
_SAID: list[bool] = []


def say_stopped(raw: bool = False) -> None:
    """Say STOPPED on stderr, once per run: a main thread that takes its stop up late and
    the watchdog that gave up waiting for it both come to say it. The watchdog (`raw`) writes
    to file descriptor 2 itself, past sys.stderr's lock, which a stuck main thread may hold,
    and its wait for the once-lock is bounded: it ends the process whatever the main thread
    does."""
    if not _SAY.acquire(timeout=1):
        return
    try:
        if not _SAID:
            _SAID.append(True)
            with contextlib.suppress(OSError, ValueError):  # stderr closed with a killed launcher
                if raw:
                    os.write(2, f"{STOPPED}\n".encode())
                else:
                    print(STOPPED, file=sys.stderr, flush=True)
    finally:
        _SAY.release()


class Stopped(KeyboardInterrupt):
    """A stop signal other than SIGINT, raised where Ctrl-C raises KeyboardInterrupt."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_code(stop: KeyboardInterrupt) -> int:
    """The shell's code for a process that a signal ended: 128 + its number (Ctrl-C: 130)."""
    return 128 + getattr(stop, "signum", signal.SIGINT)


@contextlib.contextmanager
def as_interrupt(grace: float = GRACE) -> Iterator[None]:
    """SIGTERM and SIGHUP raise `Stopped` (a KeyboardInterrupt) inside the block, in the main
    thread, as SIGINT raises KeyboardInterrupt; a signal ignored when the process started
    (`nohup`) stays ignored. Python runs a handler only between bytecodes, so a main thread
    blocked in a framework's C++ (a collective waiting for a peer that is gone) would never see
    it: a watchdog thread hears every stop signal too (signal.set_wakeup_fd), and when the main
    thread has not taken it up within `grace` seconds, says the line and ends the process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _SAID.clear()  # a new run (several run in one process under test): its stop says the line
    taken = threading.Event()

    def handler(signum, frame):
        taken.set()
        _TAKEN.append(signum)
        raise Stopped(signum) if signum != signal.SIGINT else KeyboardInterrupt

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, *STOPS)}
    for s, old in saved.items():
        if old is not signal.SIG_IGN and (s in STOPS or old is signal.default_int_handler):
            signal.signal(s, handler)
    read, write = os.pipe()
    os.set_blocking(write, False)
    wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    threading.Thread(target=_watchdog, args=(read, taken, grace), daemon=True).start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(wakeup)
        os.close(write)  # the watchdog reads the end and leaves
        for s, old in saved.items():
            signal.signal(s, old)


def before_imports() -> None:
    """For a command's module, first thing, before its own imports: a stop (Ctrl-C too) while
    they run ends the process in the one line, with nothing made yet to undo. `main` then
    takes the signals over."""
    for s in (signal.SIGINT, *STOPS):
        if signal.getsignal(s) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(s, _stopped_importing)


def _stopped_importing(signum, frame):
    say_stopped(raw=True)
    os._exit(128 + signum)


def main(run: Callable[[], int]) -> int:
    """A command's `run()`, its exit code: a stop that comes before the run's own handling
    (`as_interrupt`), while numpy and the framework still import, ends in the same one line."""
    for s in STOPS:
        if signal.getsignal(s) in (signal.SIG_DFL, _stopped_importing):
            signal.signal(s, _raise_stopped)
    if signal.getsignal(signal.SIGINT) is _stopped_importing:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return run()
    except KeyboardInterrupt as e:
        say_stopped()
        return exit_code(e)
    finally:  # a second stop while the process exits ends it at once, as it would have
        for s in STOPS:
            if signal.getsignal(s) is _raise_stopped:
                signal.signal(s, signal.SIG_DFL)


def _raise_stopped(signum, frame):
    raise Stopped(signum)


def on_leaving(leave: Callable[[], None], stuck: bool = True) -> None:
    """Call `leave` once as the process ends, however it ends: at its normal exit (within
    LEAVE_BOUND seconds, GRACE after a stop), or from the watchdog before it ends a process
    whose main thread could not take up a stop (within LEAVE_BOUND seconds; `stuck` False: not
    then, for a goodbye that would wait for what the main thread is stuck in). For a group whose
    members wait at exit for each other's goodbye (jax.distributed's shutdown barrier): one
    gone without it leaves the others to abort, and one saying it twice cancels its first."""
    lock, said = threading.Lock(), []

    def leave_once():
        if lock.acquire(timeout=LEAVE_BOUND):  # the other caller's goodbye, under way
            try:
                if not said:
                    said.append(True)
                    leave()
            finally:
                lock.release()

    def at_exit():
        # After a stop the others may be inside a collective, never at the barrier: the
        # goodbye is bounded, and the process leaves without it (they end on their own).
        goodbye = threading.Thread(target=leave_once, daemon=True)
        goodbye.start()
        goodbye.join(GRACE if _TAKEN else LEAVE_BOUND)
        if goodbye.is_alive():
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os._exit(128 + _TAKEN[0] if _TAKEN else 1)

    atexit.register(at_exit)
    if stuck:
        _LEAVE.append(leave_once)


def _watchdog(read: int, taken: threading.Event, grace: float) -> None:
    with open(read, "rb", buffering=0) as pipe:
        while byte := pipe.read(1):
            signum = byte[0]
            if signum in (signal.SIGINT, *STOPS) and not taken.wait(grace):
                for leave in _LEAVE:
                    goodbye = threading.Thread(target=leave, daemon=True)
                    goodbye.start()
                    goodbye.join(LEAVE_BOUND)
                say_stopped(raw=True)
                os._exit(128 + signum)


PARENT_ENV = "MULTIDEVICE_PARENT"  # the pid of the supervisor that started this process


@contextlib.contextmanager
def launching() -> Iterator[None]:
    """The processes started inside the block (PARENT_ENV, in the environment they inherit)
    end when this process is gone, even SIGKILLed (`watch_launcher`, in each)."""
    saved = os.environ.get(PARENT_ENV)
    os.environ[PARENT_ENV] = str(os.getpid())
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(PARENT_ENV, None)
        else:
            os.environ[PARENT_ENV] = saved


def watch_launcher(on_exit: Callable[[], None] | None = None) -> int | None:
    """A process that a supervisor started (PARENT_ENV names it) ends when that supervisor is
    gone, even if it went before this process could look: the pid it was given, not the one it
    finds, is its parent (returned; None: no supervisor). The variable is not passed on: this
    process's own children have another parent. `on_exit`: as watch_parent's."""
    expected = os.environ.pop(PARENT_ENV, "")
    if not expected.isdigit():
        return None
    watch_parent(on_exit, parent=int(expected))
    return int(expected)


def watch_parent(
    on_exit: Callable[[], None] | None = None, grace: float = 10.0, parent: int | None = None
) -> None:
    """Watch, in a daemon thread, for this process's parent (`parent`: the one it should have)
    to go (the process is then reparented). Then call `on_exit` (default: SIGTERM to this
    process, which ends it as a stop does) and, should the process still run `grace` seconds
    later (blocked in a collective that waits for the dead), end it at once. Polls twice a
    second. A process that blocks in the interpreter's finalization, where no Python thread
    runs any more (a framework's destructor waiting for the dead), is ended a second later by
    the kernel's alarm, whose default action ends a process."""
    parent = os.getppid() if parent is None else parent

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        signal.alarm(math.ceil(grace) + 1)
        (on_exit or (lambda: os.kill(os.getpid(), signal.SIGTERM)))()
        time.sleep(grace)
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()
