"""The CUDA paths of torch compute what the CPU paths compute (skipped without a CUDA GPU).

TF32 is switched off for these comparisons: cuDNN convolutions use it by default, and its
10-bit mantissa would hide a real error behind a ~1e-3 tolerance. With it off, the GPU's float32
is held to the rules of tests/fixtures/numerics.py exactly as the CPU's (limits there are derived
from unit roundoffs and a measured conditioning, so they hold for cuDNN's kernels too).
"""

from pathlib import Path

import numpy as np
import pytest
import torch

from common import weights
from tests.fixtures import gpu_checks, numerics
from tests.fixtures import lenet_reference as ref
from tests.fixtures import make_resnet50_fixture as gen
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


def _lenet_on_cuda(batches, dtype):
    params = {k: p.to(dtype) for k, p in lenet.init_params(ref.STD, ref.SEED).items()}
    device_params = [lenet.get_params(params, CUDA)]
    losses = []
    for X, y in batches:
        X, y = torch.from_numpy(X).to(CUDA), torch.from_numpy(y).to(CUDA)
        losses.append(float(lenet.train_batch(X, y, device_params, [CUDA], ref.LR)))
    assert all(p.device == CUDA for p in device_params[0].values())
    return losses, {k: p.detach().cpu().numpy() for k, p in device_params[0].items()}


@pytest.mark.numerics
def test_lenet_on_the_gpu_matches_the_float64_reference():
    """Rule 1 in float64 on the GPU, and rule 2 for float32's first loss."""
    fixture = ref.load()
    losses, after = _lenet_on_cuda(ref.batches(fixture, np.float64), torch.float64)
    initial = {k: p.numpy() for k, p in lenet.init_params(ref.STD, ref.SEED).items()}
    ref.check(fixture, losses, initial, after, "torch lenet cuda float64")
    losses, _ = _lenet_on_cuda(ref.batches(fixture)[:1], torch.float32)
    ref.check_first_loss(fixture, losses[0], "torch lenet cuda float32")


@pytest.mark.numerics
def test_resnet50_forward_on_the_gpu_matches_the_float64_fixture():
    """Rule 2: the GPU's float32 eval-mode forward against the float64 fixture."""
    fix = np.load(FIXTURES / "resnet50_forward.npz")
    model = r50.resnet50().eval()
    shapes = {k: v.shape for k, v in r50.get_weights(model).items()}
    r50.set_weights(model, weights.init_normal(shapes, float(fix["std"]), int(fix["seed"])))
    with torch.no_grad():
        out = model.to(CUDA)(torch.from_numpy(fix["input"]).to(CUDA)).cpu().numpy()
    sensitivity = float(fix["output.sensitivity"])
    numerics.check_float32(
        "torch resnet50 cuda float32 forward",
        out,
        fix["output"],
        sensitivity,
        gen.STAGES,
        gen.REDUCTION,
    )


@pytest.fixture(scope="module")
def smoke(request, tmp_path_factory):
    """Every smoke run this module's selected tests check, started at once on the GPU."""
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    runs = gpu_checks.SmokeRuns("torch", tmp_path_factory.mktemp("smoke"))
    for p in gpu_checks.selected_params(request):
        runs.start(p["workload"], p["strategy"], p["amp"], p.get("flags", ()))
    yield runs
    runs.close()


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
def test_smoke_runs_on_one_gpu_record_the_gpu(smoke, workload, strategy, amp):
    rec, output = smoke.finish(workload, strategy, amp)
    gpu_checks.check_gpu_record(rec, output, workload, amp)
    assert rec["versions"]["cuda"] != "none"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workload", "strategy", "amp", "flags"),
    [
        ("lenet", None, "off", ("--compile", "--ceiling")),
        ("resnet18", "ddp", "off", ("--compile", "--ceiling")),
        ("resnet18", "ddp", "bf16", ("--compile", "--ceiling")),
        ("resnet18", "dataparallel", "off", ("--compile",)),
        ("resnet50", "single", "off", ("--compile",)),
    ],
)
def test_compiled_runs_on_one_gpu_use_cuda_graphs(smoke, workload, strategy, amp, flags):
    """--compile on one GPU captures CUDA graphs (torch_impl.devices.compile_mode); a graph
    replay that read memory a later step overwrote fails the run. --ceiling's own compiled
    model takes turns with the training's, each with graphs of its own."""
    rec, output = smoke.finish(workload, strategy, amp, flags)
    gpu_checks.check_gpu_record(rec, output, workload, amp)
    assert rec["extra"]["compiled"] is True
    assert rec["extra"]["compile_mode"] == "reduce-overhead"
    assert rec["extra"]["cudagraph_skips"] == 0  # every graph compiled was captured
    if "--ceiling" in flags:
        assert rec["extra"]["ceiling"]["x_ceiling"] > 0
