"""The CUDA paths of torch compute what the CPU paths compute (skipped without a CUDA GPU).

TF32 is switched off for these comparisons: cuDNN convolutions use it by default, and its
10-bit mantissa would hide a real error behind a ~1e-3 tolerance. With it off, the GPU differs
from the CPU only in float32 summation order, and the CPU tests' tolerances apply unchanged.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

from common import weights
from tests.fixtures import gpu_checks
from tests.fixtures import lenet_reference as ref
from torch_impl import lenet
from torch_impl import resnet50 as r50

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture(autouse=True)
def float32_exact():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


CUDA = torch.device("cuda:0")


def test_lenet_on_the_gpu_matches_the_float64_reference():
    fixture = ref.load()
    params = lenet.init_params(ref.STD, ref.SEED)
    device_params = [lenet.get_params(params, CUDA)]
    losses = []
    for X, y in ref.batches(fixture):
        X, y = torch.from_numpy(X).to(CUDA), torch.from_numpy(y).to(CUDA)
        losses.append(float(lenet.train_batch(X, y, device_params, [CUDA], ref.LR)))
    assert all(p.device == CUDA for p in device_params[0].values())
    after = {k: p.detach().cpu().numpy() for k, p in device_params[0].items()}
    initial = {k: p.numpy() for k, p in params.items()}
    ref.check(fixture, losses, initial, after)


def test_resnet50_forward_on_the_gpu_matches_the_cpu_fixture():
    fix = np.load(FIXTURES / "resnet50_forward.npz")
    model = r50.resnet50().eval()
    shapes = {k: v.shape for k, v in r50.get_weights(model).items()}
    r50.set_weights(model, weights.init_normal(shapes, float(fix["std"]), int(fix["seed"])))
    with torch.no_grad():
        out = model.to(CUDA)(torch.from_numpy(fix["input"]).to(CUDA)).cpu().numpy()
    scale = np.abs(fix["output"]).max()
    np.testing.assert_allclose(out, fix["output"], rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workload", "strategy", "amp"),
    [
        ("lenet", None, "off"),
        ("resnet18", "ddp", "off"),
        ("resnet18", "ddp", "bf16"),
        ("resnet18", "dataparallel", "off"),
        ("resnet50", "single", "off"),
    ],
)
def test_smoke_runs_on_one_gpu_record_the_gpu(tmp_path, workload, strategy, amp):
    rec = gpu_checks.gpu_smoke_run("torch", tmp_path / "r.jsonl", workload, strategy, amp)
    assert rec["versions"]["cuda"] != "none"
