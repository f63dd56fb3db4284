"""compare.report stopped while it still imports (numpy, matplotlib), before its own stop
handling starts: Ctrl-C or SIGTERM ends it in the one line and the signal's code, as every
command does (common/signals.py)."""

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
def test_a_stop_while_the_report_imports_is_one_line_and_its_code(stop, tmp_path):
    out = tmp_path / "reports"
    cmd = [sys.executable, "-m", "compare.report", "--results", str(tmp_path / "r.jsonl")]
    # with SIGINT at its default, as at a terminal: a suite run as a background job ignores it
    proc = subprocess.Popen(
        [*cmd, "--out", str(out)],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interrupt.terminal_signals,
    )
    deadline = time.monotonic() + 30
    while (
        not interrupt.importing_numpy(proc.pid)
        and proc.poll() is None
        and time.monotonic() < deadline
    ):
        time.sleep(0.002)
    proc.send_signal(stop)
    _, err = proc.communicate(timeout=60)
    assert err.strip().splitlines() == [signals.STOPPED], err
    assert proc.returncode == 128 + stop
    assert not out.exists()
