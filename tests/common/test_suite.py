"""A suite ends by itself (tools/suite.py): a worker's crash, a hung test and a suite past its
bound each end it non-zero, in bounded time, with nothing left running, under the project's own
pytest configuration (pyproject.toml, tests/conftest.py). The plants are in
tests/fixtures/suite_plants/, which pytest does not collect (plant_*.py)."""

import os
import subprocess
import sys
import time
from pathlib import Path

from tools import suite

ROOT = Path(__file__).resolve().parents[2]
PLANTS = "tests/fixtures/suite_plants"
BOUND_S = 60  # each case ends in seconds; past this bound the test fails (TimeoutExpired)


def _suite(tmp_path, plant, *args):
    """(exit code, output, seconds, the pids the plant left) of tools.suite on one plant, in the
    base environment, two workers."""
    pids = tmp_path / "pids"
    env = {**os.environ, "PLANT_PIDS": str(pids), "PYTEST_WORKERS": "2"}
    cmd = [sys.executable, "-m", "tools.suite", Path(sys.executable).parents[1].name, ""]
    cmd += [f"{PLANTS}/{plant}", "--venv", str(Path(sys.executable).parents[2]), *args]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out, _ = proc.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        proc.terminate()  # as a stopped `make test`: the suite stops what it started
        proc.communicate(timeout=suite.STOP_GRACE_S + 15)
        raise
    left = [int(p) for p in pids.read_text().split()] if pids.exists() else []
    return proc.returncode, out, time.monotonic() - start, left


def _running(pids):
    return [p for p in pids if Path(f"/proc/{p}").exists()]


def test_a_crashed_worker_ends_the_suite_failing_and_names_what_never_ran(tmp_path):
    """A test aborts its worker in an `xdist_group` with a test after it, other groups pending:
    xdist's scheduler waited forever here (no --max-worker-restart). The suite fails, and the
    group's later test, which never ran, is named, not silently missing."""
    rc, out, _, _ = _suite(tmp_path, "plant_crash.py")
    assert rc == 1, out
    assert "crashed while running" in out and "plant_crash.py::test_crashes" in out
    assert "1 test(s) never ran (a worker crashed):" in out
    assert "plant_crash.py::test_after_the_crash" in out.split("never ran")[1]


def test_a_hung_test_ends_the_suite_failing_and_leaves_nothing(tmp_path):
    """A test waits forever (where no signal handler would run) with a process of its own in
    a session of its own: pytest-timeout's thread method (pyproject.toml) ends its worker, the
    suite fails, and the process it started, orphaned, is killed."""
    rc, out, _, left = _suite(tmp_path, "plant_hang.py", "-k", "not untimed")
    assert rc == 1, out
    assert (
        "+++ Timeout: tests/fixtures/suite_plants/plant_hang.py::test_hangs ran past its 2 s" in out
    )
    assert "crashed while running" in out
    assert len(left) == 2 and not _running(left), left


def test_a_suite_past_its_bound_is_stopped_with_one_line(tmp_path):
    """A test with no limit of its own waits forever: the suite's bound stops it, with one line
    naming the suite, exit 124, and nothing of its left running."""
    rc, out, took, left = _suite(tmp_path, "plant_hang.py", "-k", "untimed", "--limit", "8")
    assert rc == suite.OVERRUN, out
    assert "still running after 8 s (SUITE_LIMIT); stopped" in out
    assert len(left) == 2 and not _running(left), left
    assert took >= 8


def test_the_xdist_flags_follow_the_environment():
    """JAX's suite keeps a file on one worker (shared compiled programs), the others a group;
    no workers: no xdist flags at all."""
    cmd = suite.pytest_command("py", "jax", "slow", ["tests/jax_impl"], 2, 5)
    assert cmd[cmd.index("--dist") + 1] == "loadfile"
    cmd = suite.pytest_command("py", "torch", "slow", ["tests/torch_impl"], 2, 5, "compile")
    assert cmd[cmd.index("--dist") + 1] == "loadgroup" and cmd[cmd.index("-k") + 1] == "compile"
    assert "-n" not in suite.pytest_command("py", "base", "", ["tests"], 0, 5)
