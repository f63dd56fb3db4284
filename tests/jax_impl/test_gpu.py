"""The GPU paths of JAX compute what the CPU paths compute (skipped without a CUDA GPU).

Float32 convolutions and dots on NVIDIA GPUs default to TF32 in XLA; these comparisons run at
`jax.default_matmul_precision("highest")`, so only float32 summation order differs from the
CPU and the CPU tests' tolerances apply unchanged.
"""

from pathlib import Path

import jax
import numpy as np
import pytest

from jax_impl import lenet
from tests.fixtures import gpu_checks
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
    rec = gpu_checks.gpu_smoke_run("jax", tmp_path / "r.jsonl", workload, strategy, amp)
    assert rec["device_names"][0].startswith("gpu:")
