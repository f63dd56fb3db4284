"""--compile (torch.compile) on the CPU: the compiled step computes what the eager one does, a
smoke run records itself as compiled with its compile time in the warm-up, and both resnet18
strategies run compiled.

torch.compile on 2 CPU cores takes tens of seconds per graph (TorchInductor writes C++ and g++
builds it), so every test here compiles the same graph: a width-4 ResNet-18 training step on the
smoke preset's batch of 16 at 28x28, float32. Inductor's graph cache (on by default) builds it
once; the later tests trace it again but find its kernels.
"""

import json

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

from common import cli, config, devices
from tests.fixtures import make_resnet18_parity as parity
from tests.fixtures import numerics
from torch_impl import resnet18 as r18

WIDTH, BATCH = 4, 16  # the smoke preset's one-device batch


def _net():
    return r18.init_weights(r18.resnet18(width=WIDTH), 0.1, 0)


def _loss64(weights, x, y):
    """The eager float64 loss (train-mode BatchNorm) of exchange-format `weights` on `x`."""
    net = r18.set_weights(r18.resnet18(width=WIDTH).double(), weights)
    return float(r18.loss_fn(net(torch.from_numpy(x)), y))


@pytest.mark.slow
@pytest.mark.numerics
def test_compiled_step_loss_matches_eager_float64():
    """Rule 2: the compiled float32 step's loss against the eager float64 loss of the same
    weights and batch. A compiled step differs from eager by rounding only: fused kernels round
    in other places and orders, which rule 2's factor covers (forward: parity.STAGES stages, the
    longest reduction a BatchNorm statistic over BATCH x 28 x 28)."""
    x = np.random.default_rng(0).standard_normal((BATCH, 1, 28, 28))
    y = torch.from_numpy(np.arange(BATCH) % 10)
    net = _net()
    weights = r18.get_weights(net)
    net.compile()
    opt = r18.make_optimizer(net, 0.1)
    got = float(r18.train_step(net, opt, torch.from_numpy(x).float(), y))
    want = _loss64(weights, x, y)
    moved = numerics.perturb({**weights, "input": x})
    off = _loss64(moved, moved.pop("input"), y)
    sensitivity = numerics.rel_error(off, want)
    reduction = BATCH * 28 * 28
    numerics.check_float32(
        "torch resnet18 compiled float32 loss", got, want, sensitivity, parity.STAGES, reduction
    )
    assert all(torch.isfinite(p).all() for p in net.parameters())  # the step's update ran


@pytest.mark.slow
def test_compiled_ddp_smoke_run_is_recorded_compiled_with_compile_time_in_warm_up(
    tmp_path, monkeypatch
):
    """One DDP rank (gloo, world size 1) in this process, as torchrun's worker runs it, with the
    net narrowed to width 4."""
    full, step = r18.resnet18, r18.train_step
    monkeypatch.setattr(r18, "resnet18", lambda: full(width=WIDTH))
    graphs = []  # graphs compiled so far, after each step: warm-up first, then the epoch's

    def counted_step(*a, **kw):
        loss = step(*a, **kw)
        graphs.append(counters["stats"]["unique_graphs"])
        return loss

    monkeypatch.setattr(r18, "train_step", counted_step)
    path = tmp_path / "r.jsonl"
    argv = ["--workload", "resnet18", "--platform", "cpu", "--preset", "smoke", "--compile"]
    args = cli.parser("torch").parse_args([*argv, "--no-progress", "--results", str(path)])
    plan = devices.plan(1, "cpu")
    cli.check_compile("torch", args, plan.count)  # accepted
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    try:
        r18._run(args, plan, cli.config_of(args), "ddp", [torch.device("cpu")])
    finally:
        dist.destroy_process_group()
    (rec,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert rec["strategy"] == "ddp" and rec["extra"]["compiled"] is True
    assert rec["extra"]["amp"] == "off" and np.isfinite(rec["train_loss"]).all()
    assert rec["extra"]["ddp_wrapper"] is False  # one rank: the plain module, nothing to reduce
    # Compilation is warm-up: the one warm-up step (one batch shape) compiled the graph; the
    # epoch's two timed steps compiled nothing.
    assert len(graphs) == 1 + 2 and graphs[0] > 0 and graphs[-1] == graphs[0], graphs
    flops = rec["flops"]  # counted for the full-width model the real run trains
    assert flops["train_per_image"] == 3 * flops["forward_per_image"]
    assert flops["achieved_tflops"] > 0 and flops["fraction_of_peak"] is None  # a CPU


@pytest.mark.slow
def test_compiled_dataparallel_on_one_device_trains():
    """nn.DataParallel without CUDA runs its module as it is (the one-device path a single GPU
    takes too): the compiled module trains under it, warm-up first."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (96, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, 96)
    cfg = config.get_config("resnet18", "smoke", batch_size=BATCH, epochs=2)
    ds = (images, labels, images[:32], labels[:32])
    cpu = torch.device("cpu")
    log, timer = r18.train(_net(), cfg, ds, [cpu], "dataparallel", compiled=True)
    assert len(log.train_loss) == 2 and np.isfinite(log.train_loss).all()
    assert log.timed_steps == [cfg.steps_per_epoch] * 2
    assert timer.warmup_seconds > 0 and len(timer.times) == 2
