"""The GPU paths of JAX compute what the CPU paths compute (skipped without a CUDA GPU).

Float32 convolutions and dots on NVIDIA GPUs default to TF32 in XLA; these comparisons run at
`jax.default_matmul_precision("highest")`, so the rules of tests/fixtures/numerics.py apply
unchanged (TF32 would be thousands of times rule 2's limit).
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


def _lenet_steps(batches, d):
    params = lenet.init_params(ref.STD, ref.SEED)
    params = {k: jax.numpy.asarray(p, batches[0][0].dtype) for k, p in params.items()}
    device_params, losses = [lenet.get_params(params, d)], []
    for X, y in batches:
        X, y = jax.device_put(X, d), jax.device_put(y.astype(np.int32), d)
        device_params, loss = lenet.train_batch(X, y, device_params, [d], ref.LR)
        losses.append(float(loss))
    assert all(p.devices() == {d} for p in device_params[0].values())
    return losses, {k: np.asarray(p) for k, p in params.items()}, device_params[0]


def test_lenet_on_the_gpu_matches_the_float64_reference():
    """Rule 1 in float64 on the GPU (its float64 units: the same mathematics), rule 2 for the
    float32 first loss (tests/fixtures/numerics.py)."""
    fixture = ref.load()
    with jax.enable_x64(True):
        losses, init, after = _lenet_steps(ref.batches(fixture, np.float64), gpu())
        ref.check(fixture, losses, init, {k: np.asarray(p) for k, p in after.items()}, "jax gpu")
    losses, _, _ = _lenet_steps(ref.batches(fixture)[:1], gpu())
    ref.check_first_loss(fixture, losses[0], "jax gpu lenet float32")


@pytest.fixture(scope="module")
def smoke(request, tmp_path_factory):
    """Every smoke run this module's selected tests check, started at once on the GPU."""
    try:
        jax.devices("gpu")
    except RuntimeError:
        pytest.skip("JAX sees no GPU (CPU-only jaxlib)")
    runs = gpu_checks.SmokeRuns("jax", tmp_path_factory.mktemp("smoke"))
    for p in gpu_checks.selected_params(request):
        runs.start(p["workload"], p["strategy"], p["amp"])
    yield runs
    runs.close()


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
def test_smoke_runs_on_one_gpu_record_the_gpu(smoke, workload, strategy, amp):
    rec, output = smoke.finish(workload, strategy, amp)
    gpu_checks.check_gpu_record(rec, output, workload, amp)
    assert rec["device_names"][0].startswith("gpu:")
