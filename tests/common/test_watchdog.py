"""common/watchdog.py: a process of several ends itself when the run stops moving, never because
a step, a compile or an evaluation is slow. Each case runs in a process of its own (the watchdog
ends its process) with a --peer-timeout of 0.25 s (the least silence allowed: 0.5 s)."""

import subprocess
import sys
from pathlib import Path

from common import watchdog

ROOT = Path(__file__).resolve().parents[2]
ARMED = """
import time
from common import watchdog
progress = watchdog.Progress(0.25)
def phase(kind, seconds):
    progress.beat(kind)
    time.sleep(seconds)
"""


def run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", ARMED + script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_slow_steps_compiles_and_evaluations_are_not_a_lost_peer():
    """A warm-up step (a compile) of 1 s, then steps and an evaluation each four times the bound
    and more: each takes less than FACTOR x the longest of its kind, or of any kind for the
    first, and the process ends well."""
    done = run(
        "phase(watchdog.WARM, 1.0)\n"
        "for _ in range(3):\n"
        "    phase(watchdog.STEP, 2.0)\n"
        "phase(watchdog.EVAL, 2.5)\n"
        "phase(watchdog.END, 1.0)\n"
    )
    assert (done.returncode, done.stderr) == (0, "")


def test_a_process_that_computes_all_the_while_is_moving():
    """A step that computes for 3 s, past FACTOR x the longest so far (0.2 s) and the bound:
    its CPU time grows (a compile, a step on a crowded machine), so the run moves."""
    done = run(
        "phase(watchdog.STEP, 0.2)\n"
        "progress.beat(watchdog.STEP)\n"
        "end = time.monotonic() + 3\n"
        "while time.monotonic() < end:\n"
        "    sum(range(10000))\n"
        "phase(watchdog.END, 0.1)\n"
    )
    assert (done.returncode, done.stderr) == (0, "")


def test_a_run_that_stops_moving_ends_in_one_line():
    """Steps of 0.3 s, then silence: the process ends by itself past FACTOR x 0.3 s (or the
    bound), in one line, exit 1."""
    done = run("for _ in range(3):\n    phase(watchdog.STEP, 0.3)\ntime.sleep(50)\n")
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: lost another process of the run, or the link to it")
    assert done.stderr.count("\n") == 1 and "(--peer-timeout 0.25 s, or 4 x its longest step)" in (
        done.stderr
    )


def test_what_each_phase_may_take(monkeypatch):
    """The rules, on a clock of the test's own: the warm-up (compiles) WARM_UP_S; the first of
    a kind FACTOR x the longest of any kind (the first step: the warm-up's, its compile in it);
    after that, FACTOR x the longest of its own kind, and never less than the bound."""
    clock = [0.0]
    monkeypatch.setattr(watchdog.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(
        watchdog.threading, "Thread", lambda **kw: type("Idle", (), {"start": lambda self: None})()
    )
    progress = watchdog.Progress(10)  # the least allowed: 10 s and a margin of 10

    def after(kind: str, seconds: float) -> float:
        progress.beat(kind)
        allowed = progress.allowed(kind)
        clock[0] += seconds
        return allowed

    assert after(watchdog.WARM, 100.0) == watchdog.WARM_UP_S  # a compile of 100 s
    assert after(watchdog.STEP, 30.0) == 4 * 100.0  # the first step: as the warm-up's
    assert after(watchdog.STEP, 2.0) == 4 * 30.0  # then as the longest step
    assert after(watchdog.EVAL, 1.0) == 4 * 100.0  # the first evaluation: it may compile
    assert after(watchdog.EVAL, 1.0) == 20.0  # then as the longest, never under the bound
    assert after(watchdog.STEP, 1.0) == 4 * 30.0


def test_a_step_of_the_all_reduce_benchmark_beats():
    """`beating`: each call of the wrapped collective is a beat; alone (None) it is the call."""
    done = run(
        "reduce = watchdog.beating(lambda x: time.sleep(x) or x, progress)  # under the bound\n"
        "assert [reduce(0.3) for _ in range(3)] == [0.3] * 3\n"
        "assert watchdog.beating(len, None) is len\n"
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
