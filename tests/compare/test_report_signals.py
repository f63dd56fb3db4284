"""compare.report stopped while it still imports (numpy, matplotlib), before its own stop
handling starts: Ctrl-C or SIGTERM ends it in the one line and the signal's code, as every
command does (common/signals.py)."""

import signal
import sys
from pathlib import Path

import pytest

from common import signals
from tests.fixtures import interrupt

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_while_the_report_imports_is_one_line_and_its_code(stop, tmp_path):
    out = tmp_path / "reports"
    cmd = [sys.executable, "-m", "compare.report", "--results", str(tmp_path / "r.jsonl")]
    code, err = interrupt.stopped_while_importing([*cmd, "--out", str(out)], stop, ROOT)
    assert err.strip().splitlines() == [signals.STOPPED], err
    assert code == 128 + stop
    assert not out.exists()
