"""One test suite of `make test`: pytest in one environment, two tests at a time, bounded.

    python -m tools.suite ENV MARKER PATH... [--limit S] [--workers N] [--durations N] [-k EXPR]
                          [pytest's --option=value ...]

A suite ends by itself, whatever its tests do:
- a test that kills its pytest-xdist worker (a segfault, an abort) ends the suite, failing:
  tests/conftest.py sets `--max-worker-restart 0`, since xdist's scheduler, with a dead worker's
  tests in an `xdist_group`, can wait forever for work that no worker will get;
- a test past pytest-timeout's limit (pyproject.toml) ends its process the same way;
- the suite as a whole runs at most `--limit` seconds (SUITE_LIMIT), then it and every process it
  started are killed, and one line names it.
The base environment runs it, and pytest runs in `.venv/ENV`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import processes

ROOT = Path(__file__).resolve().parents[1]
OVERRUN = 124  # as timeout(1): the suite ran past its bound
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
REAP_S = 5.0  # how long the orphans taken in have to end once killed
STOP_GRACE_S = 30.0  # a stopped suite's pytest has this long to end before SIGKILL


def pytest_command(python, env, marker, paths, workers, durations, keyword=None) -> list[str]:
    """The suite's pytest command. Two workers share the machine's cores: JAX's suite keeps a
    file's tests on one worker (`loadfile`: they share compiled programs within a process),
    the others keep an `xdist_group` on one (`loadgroup`)."""
    cmd = [python, "-m", "pytest", "-q", f"--durations={durations}", "-m", marker, *paths]
    if keyword:
        cmd += ["-k", keyword]
    if workers:
        cmd += ["-n", str(workers), "--dist", "loadfile" if env == "jax" else "loadgroup"]
    return cmd


def become_subreaper() -> None:
    """Take in the suite's orphans (Linux's PR_SET_CHILD_SUBREAPER): a process that a test
    started in a session of its own, whose parent died (a crashed worker), then stays below
    this one, where kill_all finds it, instead of going to init and holding the log's pipe."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap_orphans(proc: subprocess.Popen) -> None:
    """Reap the orphans taken in that have ended (a test waits for its processes to be gone,
    and a zombie still counts), leaving `proc` to Popen."""
    while True:
        try:
            ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if ended is None or ended.si_pid == proc.pid:
            return
        os.waitpid(ended.si_pid, 0)


def kill_all(proc: subprocess.Popen) -> None:
    """SIGKILL the suite's pytest, its process group and every process below this one (a
    test's launcher starts its runs in sessions of their own, out of the suite's group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in processes.descendants(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    end = time.monotonic() + REAP_S
    with contextlib.suppress(ChildProcessError):  # none left
        while time.monotonic() < end:  # the orphans taken in, once the kill reached them
            if not os.waitpid(-1, os.WNOHANG)[0]:
                time.sleep(0.05)


def run(cmd: list[str], name: str, limit: float) -> int:
    """Run `cmd` in a session of its own for at most `limit` seconds. A stop signal to this
    process (Ctrl-C reaches only it) is passed on, and the suite gets STOP_GRACE_S to end."""
    become_subreaper()
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)
    stopped: list[int] = []

    def stop(signum, frame):
        stopped.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    deadline = time.monotonic() + limit
    while proc.poll() is None:
        now = time.monotonic()
        if stopped and now > deadline:
            kill_all(proc)
            break
        if now > deadline:
            print(f"== pytest in {name}: still running after {limit:g} s (SUITE_LIMIT); stopped")
            kill_all(proc)
            return OVERRUN
        if stopped:
            deadline = min(deadline, now + STOP_GRACE_S)
        reap_orphans(proc)
        time.sleep(0.2)
    kill_all(proc)  # what its tests left behind
    return 128 + stopped[0] if stopped else proc.returncode


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("env", help="the environment under --venv: base, torch, jax or mxnet")
    p.add_argument("marker", help='pytest -m expression ("not slow", "slow", "")')
    p.add_argument("paths", nargs="+")
    p.add_argument("--venv", default=".venv")
    p.add_argument("--limit", type=float, default=float(os.environ.get("SUITE_LIMIT", 1200)))
    p.add_argument("--workers", type=int, default=int(os.environ.get("PYTEST_WORKERS", 2)))
    p.add_argument("--durations", type=int, default=int(os.environ.get("DURATIONS", 5)))
    p.add_argument("-k", dest="keyword", help="pytest -k: the tests whose names match")
    args, more = p.parse_known_args(argv)  # the rest goes to pytest as it is (--ignore=PATH)
    if not args.limit > 0:
        p.error(f"--limit {args.limit:g}: give the suite's bound in seconds, above 0")
    missing = [path for path in args.paths if not (ROOT / path).exists()]
    if missing:  # under xdist, pytest counts a missing path as "no tests ran" (exit 5)
        p.error(f"no such test path: {', '.join(missing)}")
    name = f"{args.venv}/{args.env}"
    python = str(ROOT / args.venv / args.env / "bin" / "python")
    cmd = pytest_command(
        python,
        args.env,
        args.marker,
        [*args.paths, *more],
        args.workers,
        args.durations,
        args.keyword,
    )
    print(f"== pytest in {name}: {' '.join(args.paths)}", flush=True)
    start = time.monotonic()
    rc = run(cmd, name, args.limit)
    if rc == 5:  # no test selected: a tier can be empty
        rc = 0
    if rc:
        print(f"== FAILED in {args.env} (exit {rc})")
    print(f"== pytest in {name}: {time.monotonic() - start:.0f} s", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
