"""Where a command's CPU time goes, process by process: `python -m tools.cpu_accounting -- make
test-all` runs the command with Linux process accounting on (`accton`, Debian's acct; root),
which records each process's CPU seconds as it ends, however it ends (an os._exit too), and
with a sitecustomize on PYTHONPATH that logs each Python process's pid, the test that was
running when it started (PYTEST_CURRENT_TEST, inherited) and its command line. Then it prints
the CPU seconds per pytest suite (its own processes, the in-process tests, apart from the
processes its tests started), per process name, and the tests whose processes took the most.
A run that sets its own PYTHONPATH is not logged: its CPU counts under its process name.

The suites' wall time beside their CPU time says whether they wait or compute."""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TICKS_PER_S = 100  # acct v3 records CPU time in units of AHZ, 100 per second
SITE = """import os, sys
try:
    with open(os.environ["TEST_CPU_LOG"], "a") as f:
        test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" (")[0]
        f.write(f"{os.getpid()}\\t{test}\\t{' '.join(sys.argv)[:300]}\\n")
except (KeyError, OSError):
    pass
"""


def read_acct(text: str) -> dict[int, tuple[str, int, float]]:
    """dump-acct's lines -> {pid: (name, parent pid, CPU seconds)}."""
    procs = {}
    for line in text.splitlines():
        f = [x.strip() for x in line.split("|")]
        cpu = (float(f[2]) + float(f[3])) / TICKS_PER_S
        procs[int(f[9])] = (f[0], int(f[10]), cpu)
    return procs


def read_starts(text: str) -> dict[int, tuple[str, str]]:
    """The sitecustomize's log -> {pid: (test, command line)}."""
    rows = (line.split("\t", 2) for line in text.splitlines() if line.count("\t") >= 2)
    return {int(pid): (test, argv) for pid, test, argv in rows}


def _lineage(pid: int, procs: dict):
    """`pid`, then its parent, grandparent, ... as far as the records go."""
    for _ in range(64):  # a bound: a pid reused during the run could make a loop
        yield pid
        if pid not in procs:
            return
        pid = procs[pid][1]


def _is_suite(argv: str) -> bool:
    """A pytest command of the test targets (at interpreter start, sys.argv is `-m ...`)."""
    return argv.startswith("-m ") and " tests/" in argv


def attribute(procs: dict, starts: dict) -> dict:
    """CPU seconds per suite and part ("own": its pytest processes; "started": the processes
    its tests started), per process name and per test."""
    suites = {p for p, (_, argv) in starts.items() if _is_suite(argv)}
    per_suite = collections.defaultdict(collections.Counter)
    per_name, per_test = collections.Counter(), collections.Counter()
    for pid, (name, _, cpu) in procs.items():
        per_name[name] += cpu
        # the nearest logged Python process: the test that started it, and its suite
        owner = next((p for p in _lineage(pid, procs) if p in starts), None)
        test = starts[owner][0] if owner is not None else ""
        if test:
            per_test[test] += cpu
        suite = next((p for p in _lineage(pid, procs) if p in suites), None)
        if suite is not None:
            per_suite[starts[suite][1]]["started" if test else "own"] += cpu
    return {"suites": per_suite, "names": per_name, "tests": per_test}


def report(found: dict, top: int = 30) -> str:
    lines = [f"CPU s in all: {sum(found['names'].values()):.0f}", "per suite (CPU s):"]
    for argv, parts in found["suites"].items():
        lines.append(f"  own {parts['own']:6.0f}  started {parts['started']:6.0f}  {argv[:90]}")
    lines.append("per process name (CPU s):")
    lines += [f"  {cpu:8.1f}  {name}" for name, cpu in found["names"].most_common(8)]
    lines.append(f"the {top} tests whose processes took the most (CPU s):")
    lines += [f"  {cpu:8.1f}  {test}" for test, cpu in found["tests"].most_common(top)]
    return "\n".join(lines)


def run(command: list[str], top: int) -> int:
    with tempfile.TemporaryDirectory(prefix="test-cpu-") as tmp:
        site, pacct, log = Path(tmp, "site"), Path(tmp, "pacct"), Path(tmp, "starts")
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITE)
        pacct.touch()
        path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path, "TEST_CPU_LOG": str(log)}
        subprocess.run(["accton", str(pacct)], check=True, capture_output=True)
        try:
            code = subprocess.run(command, env=env).returncode
        finally:
            subprocess.run(["accton", "off"], capture_output=True)
        text = subprocess.run(["dump-acct", str(pacct)], capture_output=True, text=True).stdout
        starts = read_starts(log.read_text() if log.exists() else "")
        print(report(attribute(read_acct(text), starts), top))
    return code


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.cpu_accounting", description=__doc__[:70])
    p.add_argument("--top", type=int, default=30, help="how many tests to list")
    p.add_argument("command", nargs="+", help="the command to run, after --")
    args = p.parse_args(argv)
    if os.geteuid() != 0 or not all(map(shutil.which, ("accton", "dump-acct"))):
        print("error: needs root and Debian's acct (apt-get install acct)", file=sys.stderr)
        return 2
    return run(args.command, args.top)


if __name__ == "__main__":
    sys.exit(main())
