import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session", autouse=True)
def _threads_of_one_worker():
    """Tests run two at a time (pytest-xdist's workers) on the machine's cores: each worker, and
    each run it starts (OMP_NUM_THREADS, unless set already), computes with its share of them.
    torch's default, a thread per core in every process, has each OpenMP team wait on a core
    the other worker holds, at every one of a step's many small operators: a ResNet-50 step
    then takes many times as long."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        share = max(1, len(os.sched_getaffinity(0)) // workers)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))
        torch.set_num_threads(share)


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
