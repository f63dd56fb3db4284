"""--compile (torch.compile): the compiled steps compute what the eager one does (on the CPU, and
on a GPU with CUDA graphs: marked gpu), the compile mode follows the device, a smoke run records
itself as compiled with its compile time in the warm-up, and both resnet18 strategies run
compiled.

torch.compile on 2 CPU cores takes tens of seconds per graph (TorchInductor writes C++ and g++
builds it), so every test here compiles the same graph: a width-8 ResNet-18 with one residual
block per stage (half the graph to trace and build), a training step on the smoke preset's batch
of 16 at 28x28, float32. Inductor's graph cache (on by default) builds it once; the later tests
trace it again but find its kernels. The slow ones run on one pytest-xdist worker, in this
order, so that the first builds the graph before the others look for it.
"""

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from common import checks, cli, config, devices, harness
from tests.fixtures import numerics, runs
from torch_impl import devices as tdev
from torch_impl import guard
from torch_impl import resnet18 as r18

# Width 8, not 4: at 4 the first shortcut's backward (4 input channels) corrupts the heap on an
# AVX2 machine on one thread (oneDNN's trap, docs/design.md); the smoke preset's batch.
WIDTH, BATCH = 8, 16
ROOT = Path(__file__).resolve().parents[2]
# Rule 2's rounding factor for that network, counted as tests/fixtures/make_resnet18_parity.py
# counts the whole one's 39: 13 conv/dense layers (the stem, 2 per block, 3 shortcuts, fc),
# 9 BatchNorms and the pool in sequence.
STAGES = 23
INDUCTOR = pytest.mark.xdist_group("inductor")  # one worker: the graph built once, then found


def _net():
    return r18.init_weights(r18.resnet18(width=WIDTH, residuals=1), 0.1, 0)


def _loss64(weights, x, y):
    """The eager float64 loss (train-mode BatchNorm) of exchange-format `weights` on `x`."""
    net = r18.set_weights(r18.resnet18(width=WIDTH, residuals=1).double(), weights)
    return float(r18.loss_fn(net(torch.from_numpy(x)), y).detach())


@contextlib.contextmanager
def _float32_exact():
    """TF32 off (tests/torch_impl/test_gpu.py says why); nothing changes on a CPU."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.slow
@INDUCTOR
@pytest.mark.numerics
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_compiled_steps_losses_match_eager_float64(device):
    """Rule 2 at every step: each compiled float32 step's loss against the eager float64 loss of
    the weights before it on its own batch. A compiled step differs from eager by rounding only:
    fused kernels round in other places and orders, which rule 2's factor covers (forward:
    STAGES stages, the longest reduction a BatchNorm statistic over BATCH x 28 x 28).
    Four steps on four batches: on a GPU, tdev.compile_model's CUDA graphs run the first step
    eagerly, record the second and replay the others, and a replay that read the recorded
    batch or weights instead of the new ones would give another step's loss."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    dev, rng = torch.device(device), np.random.default_rng(0)
    net = _net().to(dev)
    assert tdev.compile_model(net, dev) == (3 if device == "cuda" else 1)
    opt = r18.make_optimizer(net, 0.1)
    for step in range(4):
        x = rng.standard_normal((BATCH, 1, 28, 28))
        y = torch.from_numpy(rng.permutation(BATCH) % 10)
        weights = r18.get_weights(net)
        with _float32_exact():
            got = float(r18.train_step(net, opt, torch.from_numpy(x).float().to(dev), y.to(dev)))
        want = _loss64(weights, x, y)
        moved = numerics.perturb({**weights, "input": x})
        off = _loss64(moved, moved.pop("input"), y)
        name = f"torch resnet18 compiled ({device}) float32 loss, step {step + 1}"
        sensitivity = numerics.rel_error(off, want)
        numerics.check_float32(name, got, want, sensitivity, STAGES, BATCH * 28 * 28)
    assert all(torch.isfinite(p).all() for p in net.parameters())  # the steps' updates ran


def test_compile_mode_captures_cuda_graphs_on_one_gpu_only(monkeypatch):
    """One GPU: "reduce-overhead" (CUDA graphs), which needs three warm-up calls per batch
    shape; DDP over several processes and the CPU: "default", one call. net.compile is lazy,
    so a CUDA device can be named on a machine without one. Each asks for a graph specialised
    to its batch shape (dynamic=False): by default torch.compile's second shape (an epoch's
    last, partial batch) would compile for a symbolic batch instead."""
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert tdev.compile_mode(cuda) == "reduce-overhead"
    assert tdev.compile_mode(cuda, n_devices=2) == tdev.compile_mode(cpu) == "default"
    asked = []
    net = _net()
    monkeypatch.setattr(net, "compile", lambda **kw: asked.append(kw))
    assert tdev.compile_model(net, cuda) == 3 and tdev.compile_model(net, cuda, 2) == 1
    assert tdev.compile_model(net, cpu) == 1
    assert [kw["mode"] for kw in asked] == ["reduce-overhead", "default", "default"]
    assert [kw["dynamic"] for kw in asked] == [False] * 3
    assert tdev.compile_fields(False, cuda) == {"compile_mode": None}  # an eager run


@pytest.mark.slow
@INDUCTOR
def test_compiled_model_is_one_graph():
    """compile_model traces the whole network, forward and backward, as one graph: torch 2.11
    compiled a plain nn.Sequential block by block, the stem and head eager, and this fails on
    that model there. The training step of the tests above: Inductor's cache has its kernels."""
    torch._dynamo.reset()
    counters.clear()
    net = _net()
    tdev.compile_model(net, torch.device("cpu"))
    x, y = torch.zeros(BATCH, 1, 28, 28), torch.zeros(BATCH, dtype=torch.long)
    r18.train_step(net, r18.make_optimizer(net, 0.1), x, y)
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.slow
@INDUCTOR
def test_compiled_ddp_smoke_run_is_recorded_compiled_with_compile_time_in_warm_up(
    tmp_path, monkeypatch
):
    """One DDP rank (gloo, world size 1) in this process, as torchrun's worker runs it, with the
    net narrowed to _net's (one rank trains the plain module: the graph of the tests above)."""
    full, step = r18.resnet18, r18.train_step

    def narrow(amp=False):
        return full(width=WIDTH, residuals=1, amp=amp)

    monkeypatch.setattr(r18, "resnet18", narrow)
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
    checks.check_compile("torch", args, plan.count)  # accepted
    for name, value in runs.torchrun_env(0, 1, runs.free_port()).items():
        monkeypatch.setenv(name, value)  # a rank of torchrun's: main joins a group of one
    try:
        r18.main(args, plan, cli.config_of(args), harness.Hooks("torch", tdev))
    finally:
        guard.end_process_group()
    (rec,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert rec["strategy"] == "ddp" and rec["extra"]["compiled"] is True
    assert rec["extra"]["compile_mode"] == "default"  # a CPU: no CUDA graphs
    assert rec["extra"]["cudagraph_skips"] == 0  # none asked for, none left out
    assert rec["extra"]["amp"] == "off" and np.isfinite(rec["train_loss"]).all()
    assert rec["extra"]["ddp_wrapper"] is False  # one rank: the plain module, nothing to reduce
    # Compilation is warm-up: the one warm-up step (one batch shape) compiled the graph; the
    # epoch's two timed steps compiled nothing.
    assert len(graphs) == 1 + 2 and graphs[0] > 0 and graphs[-1] == graphs[0], graphs
    flops = rec["flops"]  # counted for the full-width model the real run trains
    assert flops["train_per_image"] == 3 * flops["forward_per_image"]
    assert flops["achieved_tflops"] > 0 and flops["fraction_of_peak"] is None  # a CPU


@pytest.mark.slow
@INDUCTOR
def test_compiled_dataparallel_on_one_device_trains():
    """nn.DataParallel without CUDA runs its module as it is (the one-device path a single GPU
    takes too): the compiled module trains under it, warm-up first."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (96, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, 96)
    cfg = config.get_config("resnet18", "smoke", batch_size=BATCH, epochs=2)
    ds = (images, labels, images[:32], labels[:32])
    cpu, net = torch.device("cpu"), _net()
    run = runs.run_for("resnet18", cfg, ds, [cpu], calls=tdev.compile_model(net, cpu))
    r18.train(net, cfg, ds, r18.data_parallel, run)
    log, timer = run.epoch_log, run.timer
    assert len(log.train_loss) == 2 and np.isfinite(log.train_loss).all()
    assert log.timed_steps == [cfg.steps_per_epoch] * 2
    assert timer.warmup_seconds > 0 and len(timer.times) == 2


def test_a_cpu_compile_says_nothing_of_cuda(monkeypatch, capfd):
    """TorchInductor's C++ build on a CPU looks for CUDA, and torch warns "No CUDA runtime is
    found, using CUDA_HOME=..." where it finds one (an nvcc on the PATH, CUDA_HOME): not in a
    compiled CPU run's output."""
    monkeypatch.setenv("CUDA_HOME", "/usr/local")
    tdev.compile_model(_net(), torch.device("cpu"))
    from torch.utils import cpp_extension  # its import looks too, where it is the first

    found = cpp_extension._find_cuda_home()  # what Inductor's build calls
    assert found == "/usr/local" and "CUDA" not in capfd.readouterr().err


def _trap(width):
    """tests/fixtures/onednn_1x1_trap.py, as an AVX2 machine runs it on one thread."""
    cap = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "tests.fixtures.onednn_1x1_trap", "--width", str(width)]
    env = {**os.environ, **cap}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_the_networks_a_run_compiles_are_clear_of_onednns_avx2_trap():
    """Every 1x1 strided convolution's backward of the networks a run trains (resnet18 at full
    width, resnet50), channels-last as TorchInductor lays them out, on one thread (a device of
    `--cores-per-device 1`, a test worker) with the instruction set capped at AVX2: none has
    the fewer than 8 input channels that corrupt the heap (docs/design.md, Traps)."""
    out = _trap(64)
    assert out.returncode == 0 and out.stdout.endswith("ok\n"), out.stdout + out.stderr


@pytest.mark.slow
def test_onednns_avx2_trap_is_still_there_at_width_4():
    """The trap itself, which the tests above step around with WIDTH = 8: a width-4 network's
    first shortcut (4 -> 8 channels) corrupts the heap. Should this fail, the torch in use has
    a fixed oneDNN: the note in docs/design.md and the width's reason can go."""
    out = _trap(4)
    assert out.returncode != 0 and "ok" not in out.stdout, out.stdout + out.stderr


def test_every_isa_cap_gives_torchinductor_a_cache_of_its_own():
    """TorchInductor's cache mixes up kernels built at a capped ISA with the machine's own
    (docs/design.md, Traps): each capped run of the project names a cache of its own."""
    from tests import numerics_mutants

    makefile = re.sub(r"\noverride ", "\n", (ROOT / "Makefile").read_text())  # set either way
    cap = makefile.split("\nISA_CAP = ", 1)[1].split("\nnumerics:", 1)[0]
    assert "ATEN_CPU_CAPABILITY=avx2" in cap and "TORCHINDUCTOR_CACHE_DIR=" in cap, cap
    assert "inductor-avx2" in numerics_mutants.ISA_CAP["TORCHINDUCTOR_CACHE_DIR"]
