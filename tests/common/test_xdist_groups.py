"""The test targets run two tests at a time (pytest-xdist, Makefile), and some must not: the
cluster tests (network namespaces and cores of their own) and TorchInductor's compile tests
(one graph built once, then found in its cache) are each an `xdist_group`, which `--dist
loadgroup` sends to one worker. pytest-xdist's grouping has broken silently with a pytest
release before (pyproject.toml): the tests then pass, only not one at a time."""

import subprocess
import sys

GROUPED = """
import os
import pytest

@pytest.mark.xdist_group("one")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    with open(os.environ["SEEN"], "a") as f:
        f.write(f"grouped {os.environ['PYTEST_XDIST_WORKER']}\\n")

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    pass
"""


def test_a_group_runs_on_one_worker(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    seen = tmp_path / "seen"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2"]
    cmd += ["--dist", "loadgroup", "test_grouped.py"]
    env = {"SEEN": str(seen), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    workers = set(seen.read_text().split("\n")[:-1])
    assert len(workers) == 1, f"the group ran on {sorted(workers)}"
