"""lenet (d2l 13.5, data parallel from scratch) in torch: allreduce, equivalence, parity, CLI."""

import re

import numpy as np
import pytest
import torch

from common import cli, config, data, devices, flops, results
from tests.fixtures import lenet_reference as ref
from tests.fixtures import make_lenet_parity, numerics
from torch_impl import __main__ as tmain
from torch_impl import devices as tdev
from torch_impl import lenet


def cpus(n):
    return tdev.get_devices(devices.DevicePlan(n, "cpu", virtual=True))


def run_steps(n_devices, batches, dtype=torch.float64, model=lenet.lenet, devs=None):
    """`len(batches)` train_batch steps on n virtual devices (or `devs`): per-step losses and
    params per device. float64 by default: comparisons of programs are rule 1 of
    tests/fixtures/numerics.py. `model`: the per-device forward train_batch takes (--compile)."""
    devs = devs or cpus(n_devices)
    params = {k: p.to(dtype) for k, p in lenet.init_params(ref.STD, ref.SEED).items()}
    device_params = [lenet.get_params(params, d) for d in devs]
    on = [(torch.from_numpy(X).to(devs[0]), torch.from_numpy(y).to(devs[0])) for X, y in batches]
    losses = [float(lenet.train_batch(X, y, device_params, devs, ref.LR, model)) for X, y in on]
    as_numpy = [{k: p.detach().cpu().numpy().copy() for k, p in ps.items()} for ps in device_params]
    return losses, as_numpy


def initial():
    return {k: p.numpy() for k, p in lenet.init_params(ref.STD, ref.SEED).items()}


# --- allreduce -----------------------------------------------------------------------------------


def not_in_place(data):
    """d2l's historic allreduce: rebinds the list entries, so the devices' tensors never change."""
    for i in range(1, len(data)):
        data[0][:] += data[i].to(data[0].device)
    for i in range(1, len(data)):
        data[i] = data[0].to(data[i].device)


def check_allreduce(allreduce, n):
    # Small whole numbers: float32 sums are exact, so equality is the right test.
    grads = [torch.arange(12.0).reshape(3, 4) * (i + 1) for i in range(n)]
    held = list(grads)  # what each device's parameter .grad still points to afterwards
    allreduce(grads)
    want = torch.arange(12.0).reshape(3, 4) * sum(range(1, n + 1))
    for i, g in enumerate(held):
        assert torch.equal(g, want), f"device {i} does not hold the sum"


def test_parameter_count_is_the_one_the_communication_model_uses():
    params = lenet.init_params(0.01, 0)
    assert sum(p.numel() for p in params.values()) == flops.PARAMETERS["lenet"]


@pytest.mark.multi_device
@pytest.mark.parametrize("n", [2, 3])
def test_allreduce_leaves_the_sum_on_every_device_in_place(n):
    check_allreduce(lenet.allreduce, n)


def test_the_historic_not_in_place_allreduce_fails_the_check():
    with pytest.raises(AssertionError, match="device 1 does not hold the sum"):
        check_allreduce(not_in_place, 2)


def test_get_params_makes_independent_copies_even_on_one_torch_device():
    params = lenet.init_params(ref.STD, ref.SEED)
    a, b = (lenet.get_params(params, d) for d in cpus(2))
    a["fc2.bias"].data += 1
    assert not b["fc2.bias"].detach().any() and not params["fc2.bias"].any()
    assert all(p.requires_grad and p.is_leaf for p in a.values())


# --- data parallel equals one device ---------------------------------------------------------


@pytest.mark.numerics
@pytest.mark.multi_device
def test_two_devices_train_like_one():
    batches = ref.batches(ref.load(), np.float64)
    losses1, (one,) = run_steps(1, batches)
    losses2, (a, b) = run_steps(2, batches)
    numerics.check_same_math("torch lenet 2 devices vs 1: device 0's weights", a, one)
    numerics.check_same_math("torch lenet 2 devices vs 1: device 1's weights", b, one)
    numerics.check_same_math("torch lenet 2 devices vs 1: losses", losses2, losses1)
    for name in one:
        # Same summed gradient and update on every device: replicas are bitwise identical.
        np.testing.assert_array_equal(a[name], b[name])


# --- cross-framework parity ------------------------------------------------------------------


@pytest.mark.numerics
@pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.multi_device)])
def test_matches_the_float64_reference_fixture(n):
    fixture = ref.load()
    losses, after = run_steps(n, ref.batches(fixture, np.float64))
    ref.check(fixture, losses, initial(), after[-1], f"torch lenet {n} devices")


@pytest.mark.numerics
def test_float32_first_loss_matches_the_fixture():
    fixture = ref.load()
    losses, _ = run_steps(1, ref.batches(fixture)[:1], torch.float32)
    ref.check_first_loss(fixture, losses[0], "torch lenet float32")


@pytest.mark.numerics
def test_the_generator_still_reproduces_the_fixture():
    fixture = ref.load()
    again = make_lenet_parity.reference(fixture)
    assert sorted(again) == sorted(k for k in fixture if k not in ("images", "labels"))
    for key, value in again.items():
        if not key.endswith(".sensitivity"):  # a difference of near-equal numbers: its own scale
            numerics.check_same_math(f"torch lenet generator {key}", value, fixture[key])


# --- compiled (--compile): the per-device forward torch.compiled -----------------------------


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize(
    ("device", "n"),
    [
        ("cpu", 1),
        pytest.param("cpu", 2, marks=pytest.mark.multi_device),
        pytest.param("cuda", 1, marks=pytest.mark.gpu),
    ],
)
def test_compiled_float64_run_matches_the_fixture(device, n):
    """Rule 1: the compiled forward (and the backward torch.compile derives from it) is the same
    math as the eager one, so a float64 run holds to the fixture's losses and updates as eager
    does. On a GPU its CUDA graphs run the first step eagerly, record the second and replay the
    third: a replay that read the recorded batch or weights would change the third step."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    devs = cpus(n) if device == "cpu" else [torch.device("cuda", 0)]
    torch._dynamo.reset()
    model, calls = tdev.compile_function(lenet.lenet, devs[0], n)
    assert calls == (3 if device == "cuda" else 1)
    fixture = ref.load()
    losses, after = run_steps(n, ref.batches(fixture, np.float64), model=model, devs=devs)
    ref.check(fixture, losses, initial(), after[-1], f"torch lenet compiled, {n} {device}")
    assert tdev.compile_fields(True, devs[0], n)["cudagraph_skips"] == 0


@pytest.mark.slow
def test_compiled_smoke_run_compiles_in_the_warm_up_only(tmp_path, monkeypatch):
    """--compile: the record says compiled, its mode and no graph left out of CUDA graphs; the
    warm-up compiled every graph (forward and backward, each batch shape), the epochs none."""
    from torch._dynamo.utils import counters

    step, graphs = lenet.train_batch, []  # graphs compiled so far, after each step

    def counted(*a, **kw):
        loss = step(*a, **kw)
        graphs.append(counters["stats"]["unique_graphs"])
        return loss

    monkeypatch.setattr(lenet, "train_batch", counted)
    torch._dynamo.reset()
    counters.clear()
    assert tmain.run(argv(tmp_path, "--compile")) == 0
    (rec,) = results.load(tmp_path / "r.jsonl")
    assert rec.extra["compiled"] is True and rec.extra["compile_mode"] == "default"
    assert rec.extra["cudagraph_skips"] == 0 and np.isfinite(rec.train_loss).all()
    cfg = config.get_config("lenet", "smoke")
    per_epoch = len(data.batches(cfg.train_subset, cfg.batch_size, cfg.seed, 0))
    warmup = len(graphs) - cfg.epochs * per_epoch
    assert warmup >= 1 and graphs[warmup - 1] > 0 and graphs[-1] == graphs[warmup - 1], graphs


# --- end to end and bad input ----------------------------------------------------------------


def argv(tmp_path, *extra):
    common = ["--workload", "lenet", "--platform", "cpu", "--preset", "smoke", "--no-progress"]
    return [*common, "--results", str(tmp_path / "r.jsonl"), *extra]


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.multi_device)])
def test_smoke_run_writes_one_valid_record(tmp_path, capsys, n):
    assert tmain.run(argv(tmp_path, "--gpus", str(n))) == 0
    (rec,) = results.load(tmp_path / "r.jsonl")
    cfg = config.get_config("lenet", "smoke")
    assert (rec.framework, rec.strategy, rec.devices, rec.virtual) == ("torch", "scratch", n, True)
    assert rec.epochs == cfg.epochs == len(rec.train_loss) == len(rec.test_acc_per_epoch)
    assert rec.sec_per_epoch["n"] == cfg.epochs and rec.warmup_seconds > 0
    assert rec.images_per_sec == pytest.approx(cfg.train_subset / rec.sec_per_epoch["median"])
    # Accuracy is an exact count over the test subset; the loss is per sample, near ln(10) at
    # the start of training with init std 0.01.
    assert (rec.test_acc * cfg.test_subset).is_integer()
    assert rec.test_acc == rec.test_acc_per_epoch[-1]
    assert abs(rec.train_loss[0] - np.log(10)) < 0.01
    out = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(
        rf"test acc: \d\.\d\d, \d+\.\d sec/epoch on \[{n} x cpu \(virtual\)\]", out[-1]
    )
    assert out[0].startswith("epoch 1/1: train loss ")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--gpus", "2", "--batch-size", "255"], "batch size 255 does not divide evenly over 2"),
        # 1024 images in batches of 6 leave a last batch of 4, which 3 devices cannot share.
        (["--gpus", "3", "--batch-size", "6"], "last batch of each epoch has 4 images"),
        (["--gpus", "0"], "GPUS must be a whole number of at least 1"),
        (["--strategy", "ddp"], "lenet has one strategy, 'scratch'"),
        (["--amp", "bf16"], "float32 only"),
    ],
)
def test_bad_input_is_one_clear_line_and_no_record(tmp_path, capsys, extra, message):
    assert tmain.run(argv(tmp_path, *extra)) == cli.EXIT_BAD_INPUT
    last = capsys.readouterr().err.splitlines()[-1]  # after the virtual-device note, if any
    assert last.startswith("error: ") and message in last
    assert not (tmp_path / "r.jsonl").exists()


def test_unknown_preset_is_refused_without_a_record(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:  # the command line refuses it ...
        tmain.run([*argv(tmp_path), "--preset", "huge"])
    assert e.value.code == 2 and "invalid choice: 'huge'" in capsys.readouterr().err
    args = cli.parser("torch").parse_args(argv(tmp_path))
    args.preset = "huge"  # ... and so does main, called directly
    with pytest.raises(config.ConfigError, match="unknown preset 'huge'"):
        lenet.main(args, devices.DevicePlan(1, "cpu", virtual=True), cli.config_of(args), None)
    assert not (tmp_path / "r.jsonl").exists()
