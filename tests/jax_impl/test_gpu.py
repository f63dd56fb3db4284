"""The GPU paths of JAX compute what the CPU paths compute (skipped without a CUDA GPU).

Float32 convolutions and dots on NVIDIA GPUs default to TF32 in XLA; these comparisons run at
`jax.default_matmul_precision("highest")`, so only float32 summation order differs from the
CPU and the CPU tests' tolerances apply unchanged.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from jax_impl import lenet
from tests.fixtures import lenet_reference as ref

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture(autouse=True)
def float32_exact():
    try:
        jax.devices("gpu")
    except RuntimeError:
        pytest.skip("JAX sees no GPU (CPU-only jaxlib)")
    with jax.default_matmul_precision("highest"):
        yield


def gpu():
    return jax.devices("gpu")[0]


def test_lenet_on_the_gpu_matches_the_float64_reference():
    fixture = ref.load()
    d = gpu()
    params = lenet.init_params(ref.STD, ref.SEED)
    device_params = [lenet.get_params(params, d)]
    losses = []
    for X, y in ref.batches(fixture):
        X, y = jax.device_put(X, d), jax.device_put(y.astype(np.int32), d)
        device_params, loss = lenet.train_batch(X, y, device_params, [d], ref.LR)
        losses.append(float(loss))
    assert all(p.devices() == {d} for p in device_params[0].values())
    after = {k: np.asarray(p) for k, p in device_params[0].items()}
    ref.check(fixture, losses, {k: np.asarray(p) for k, p in params.items()}, after)


def _cli(args, path, timeout=300):
    out = subprocess.run(
        [sys.executable, "-m", "jax_impl", "--no-progress", "--platform", "gpu", "--gpus", "1"]
        + ["--preset", "smoke", "--results", str(path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out, [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workload", "strategy", "amp"),
    [
        ("lenet", None, "off"),
        ("resnet18", "sharding", "off"),
        ("resnet18", "sharding", "bf16"),
        ("resnet18", "pmap", "off"),
        ("resnet50", "single", "off"),
    ],
)
def test_smoke_runs_on_one_gpu_record_the_gpu(tmp_path, workload, strategy, amp):
    args = ["--workload", workload, "--amp", amp]
    out, recs = _cli(args + (["--strategy", strategy] if strategy else []), tmp_path / "r.jsonl")
    (rec,) = recs
    assert (rec["platform"], rec["virtual"], rec["devices"]) == ("gpu", False, 1)
    assert rec["hardware"]["gpus"] and rec["device_names"][0].startswith(("gpu:", "cuda:"))
    assert all(np.isfinite(rec["train_loss"]))
    if workload == "resnet18":
        assert rec["extra"]["utilization_source"] == "nvml" and rec["extra"]["amp"] == amp
    if workload != "resnet50":
        assert "on [1 x gpu]" in out.stdout.splitlines()[-1]
