import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def smoke_ddp(tmp_path_factory):
    """(output, record) of resnet18 DDP on 2 CPU processes at the smoke preset: shared by the
    one-machine tests (test_resnet18.py) and the two-node one (test_multinode.py)."""
    path = tmp_path_factory.mktemp("r18") / "results.jsonl"
    cmd = [sys.executable, "-m", "torch_impl", "--workload", "resnet18", "--no-progress"]
    cmd += ["--gpus", "2", "--preset", "smoke", "--platform", "cpu", "--results", str(path)]
    # OMP_NUM_THREADS=1, as the two-node test: the same threads, the same float32 sums.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out, json.loads(path.read_text().splitlines()[-1])
