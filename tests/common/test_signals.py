"""A command stopped while it still imports (numpy, then its framework), before its run's own
stop handling starts: compare.run's SIGINT to a run it has just started, a user's SIGTERM."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common import signals
from tests.fixtures import interrupt

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("framework", ["torch", "jax", "mxnet"])
def test_a_stop_while_the_command_imports_is_one_line_and_its_code(framework, stop, tmp_path):
    cmd = [sys.executable, "-m", f"{framework}_impl", "--workload", "lenet", "--preset", "smoke"]
    cmd += ["--platform", "cpu", "--results", str(tmp_path / "r.jsonl")]
    code, err = interrupt.stopped_while_importing(cmd, stop, ROOT)
    assert err.strip().splitlines() == [signals.STOPPED], err
    assert code == 128 + stop
    assert not (tmp_path / "r.jsonl").exists()


def test_a_process_whose_launcher_went_before_it_looked_ends():
    """watch_launcher compares the parent with the launcher's pid passed down, not with the
    parent it finds: a process whose launcher died before it looked (it was reparented
    already) still ends. Here the pid passed down is a process that has ended."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    code = "import time; from common import signals; signals.watch_launcher(); time.sleep(60)"
    env = {**os.environ, signals.PARENT_ENV: str(gone.pid)}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env)
    try:
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        proc.kill()


def test_a_process_that_hangs_in_its_finalization_after_its_launcher_went_ends():
    """A process whose launcher went, stopped, that then blocks where no Python thread runs any
    more, in the interpreter's finalization (as MXNet's kvstore destructor waits for a dead
    scheduler), is still ended: by the kernel's alarm that watch_parent set."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    code = (
        "import sys, time\n"
        "from common import signals\n"
        "class Hang:\n"
        "    def __del__(self):  # in the final collection\n"
        "        time.sleep(60)\n"
        "hang = Hang()\n"
        "def run():  # the stop ends it as a Ctrl-C does, down to the finalization\n"
        f"    signals.watch_parent(grace=1, parent={gone.pid})\n"
        "    time.sleep(60)\n"
        "sys.exit(signals.main(run))\n"
    )
    begun = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        assert proc.wait(timeout=30) == -signal.SIGALRM
    finally:
        proc.kill()
    assert time.monotonic() - begun < 10


STEP = """
import os, sys, time
from common import signals
signals.watch_launcher()
open(os.environ["STEP_PID_FILE"], "w").write(str(os.getpid()))
time.sleep(60)
"""


def test_a_step_of_compare_run_ends_when_compare_run_is_killed(tmp_path):
    """compare.run SIGKILLed mid-step: the step's run (here one that only watches, as every
    command's start does) ends within seconds instead of training on alone."""
    python, pid_file = tmp_path / "python", tmp_path / "step.pid"
    python.write_text(f"#!/bin/sh\nexec \"{sys.executable}\" -c '{STEP}'\n")
    python.chmod(0o755)
    argv = ["--frameworks", "torch", "--workloads", "lenet", "--platform", "cpu"]
    argv += ["--preset", "smoke", "--python", str(python), "--steps", "1"]
    argv += ["--results", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "out")]
    env = {**os.environ, "STEP_PID_FILE": str(pid_file)}
    run = subprocess.Popen(
        [sys.executable, "-m", "compare.run", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    end = time.monotonic() + 60
    while not pid_file.exists() and run.poll() is None and time.monotonic() < end:
        time.sleep(0.05)
    if not pid_file.exists():
        run.kill()
        pytest.fail(f"no step started: {run.communicate()[0]}")
    step = int(pid_file.read_text())
    run.kill()
    run.wait()
    killed = time.monotonic()
    while running(step) and time.monotonic() < killed + 5:
        time.sleep(0.05)
    alive = running(step)
    if alive:
        os.kill(step, signal.SIGKILL)
    assert not alive, "the step outlived compare.run by 5 s"
    print(f"the step ended {time.monotonic() - killed:.2f} s after compare.run was killed")


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie has ended; whoever adopted it may not reap it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
