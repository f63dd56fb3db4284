"""Several processes that must meet: their settings from the environment, the coordinator's
address and port, and a bounded wait (docs/design.md, "Devices"); a file descriptor sent
elsewhere for a while, for what C libraries write; a quiet end when stdout's reader stops; and
a process stopped with everything it started.

A framework's own wait for its peers can end in a C++ abort or a silent hang; the run instead
checks what it can before the wait and gives the wait a deadline of its own that ends the
process with one line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from common import config


def env_int(name: str, default: str | None, low: int) -> int:
    """A whole number >= `low` from the environment variable `name` (else `default`)."""
    text = os.environ.get(name, default)
    try:
        value = int(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = None
    if value is None or value < low:
        raise config.ConfigError(f"{name} must be a whole number >= {low}, got {text!r}")
    return value


def port_of(address: str, name: str) -> int:
    """The port of `host:port` (the environment variable `name` holds it)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise config.ConfigError(f"{name} must be host:port, got {address!r}")
    return int(port)


def check_port_free(port: int, name: str, taken: str | None = None) -> None:
    """Refuse a port that a server cannot bind on every address (as gRPC binds `[::]:port`,
    with SO_REUSEADDR): another program holds it. `taken`: the line to refuse it with."""
    try:
        probe = socket.socket(socket.AF_INET6)
    except OSError:  # no IPv6 here: probe IPv4's every address instead
        probe = socket.socket(socket.AF_INET)
    with probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("::" if probe.family == socket.AF_INET6 else "", port))
        except OSError as e:
            raise config.ConfigError(
                taken
                or f"port {port} of {name} cannot be used ({e.strerror}): another program "
                "holds it; choose a free port for every process"
            ) from None


@contextmanager
def deadline(seconds: float, line: str, code: int) -> Iterator[None]:
    """Run the body; if it has not finished after `seconds`, print `line` on stderr and end the
    process with `code`. The body may be blocked inside C++ (a framework's wait), where no
    exception can reach it: a timer thread ends the process instead."""

    def expire() -> None:
        sys.stdout.flush()
        print(line, file=sys.stderr, flush=True)
        os._exit(code)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@contextmanager
def fd_redirected(fd: int, target: int) -> Iterator[None]:
    """File descriptor `fd` (1: stdout, 2: stderr) writes to descriptor `target` meanwhile: C
    libraries (oneDNN's log, MXNet's messages) write to the descriptor, past sys.stdout."""
    saved = os.dup(fd)
    try:
        os.dup2(target, fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


def quiet_when_reader_stops(main: Callable[[], int]) -> int:
    """main()'s exit code; but where stdout's reader stops early (`| head`), exit 1 without
    Python's BrokenPipeError traceback, as its docs advise (signal module, "Note on SIGPIPE")."""
    try:
        code = main()
        sys.stdout.flush()  # here, where the error can be caught, not at exit
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush
        return 1


STOP_WAIT_S = 60  # a run stops its workers within 45 s of a Ctrl-C (torch_impl/launch.py)


def stop(proc: subprocess.Popen, wait: float | None = None) -> None:
    """End `proc` as a Ctrl-C would: a run then stops the workers it started, which torchrun
    and MXNet's launcher put in sessions of their own, out of reach of a kill of `proc`. Where
    it has not ended within `wait` s (SIGINT ignored, or stuck), SIGKILL it and every process
    it started, found by their parents before any of them is killed. `wait`: STOP_WAIT_S."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(STOP_WAIT_S if wait is None else wait)
        return
    except subprocess.TimeoutExpired:
        pass
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs, from /proc (Linux), whatever their sessions."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:  # `pid (comm) state ppid ...`; comm may hold spaces and parentheses
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found
