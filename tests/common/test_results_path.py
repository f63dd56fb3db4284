"""A results path that cannot be followed is refused before the run, in one line: a loop of
symbolic links once passed the early check (read as a file yet to be made), and the run
trained, then lost its record to ELOOP."""

import subprocess
import sys
from pathlib import Path

import pytest

from common import results

ROOT = Path(__file__).resolve().parents[2]
LOOP = "cannot be reached (a loop of symbolic links is on its way)"


def loop(tmp_path: Path) -> Path:
    """Two links that point at each other; the first returned."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    return tmp_path / "a"


@pytest.mark.parametrize("below", ["", "r.jsonl", "new/r.jsonl"], ids=["link", "in", "deeper"])
def test_a_loop_of_links_on_the_path_is_refused(tmp_path, below):
    path = loop(tmp_path) / below if below else loop(tmp_path)
    with pytest.raises(results.ResultsError, match=r"cannot be reached \(a loop of symbolic"):
        results.check_writable(path)


def test_paths_that_can_be_made_still_pass(tmp_path):
    (tmp_path / "to").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "to" / "r.jsonl")  # not made yet
    for path in ("r.jsonl", "new/deeper/r.jsonl", "link"):
        results.check_writable(tmp_path / path)


def test_a_run_given_a_loop_ends_before_training_in_one_line(tmp_path):
    """The run's own early check (common/cli.py), made before any framework is imported."""
    path = loop(tmp_path)
    cmd = [sys.executable, "-m", "torch_impl", "--workload", "lenet", "--preset", "smoke"]
    cmd += ["--platform", "cpu", "--no-progress", "--results", str(path)]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"error: results file {path} {LOOP}; choose another --results (RESULTS=)"
    ]
