"""lenet (d2l 13.5, data parallel from scratch) in MXNet: allreduce, equivalence, parity, CLI."""

import re

import numpy as np
import pytest
from mxnet import nd

from common import cli, config, devices, results
from mxnet_impl import devices as mdev
from mxnet_impl import lenet
from mxnet_impl.__main__ import load
from tests.fixtures import lenet_reference as ref
from tests.fixtures import numerics


def cpus(n):
    return mdev.get_devices(devices.DevicePlan(n, "cpu", virtual=True))


def run_steps(n_devices, batches, dtype="float64"):
    """`len(batches)` train_batch steps on n virtual devices: per-step losses, params per device.
    float64 by default: comparisons of programs are rule 1 of tests/fixtures/numerics.py (the
    initial weights are float32 numbers, so the cast is exact)."""
    devs = cpus(n_devices)
    params = {k: p.astype(dtype) for k, p in lenet.init_params(ref.STD, ref.SEED).items()}
    device_params = [lenet.get_params(params, d) for d in devs]
    losses = []
    for X, y in batches:
        # Labels as floats of the net's dtype: MXNet's pick takes float indices.
        X, y = (nd.array(a, ctx=devs[0], dtype=dtype) for a in (X, y))
        losses.append(float(lenet.train_batch(X, y, device_params, devs, ref.LR).asscalar()))
    as_numpy = [{k: p.asnumpy() for k, p in ps.items()} for ps in device_params]
    return losses, as_numpy


def initial():
    return {k: p.asnumpy() for k, p in lenet.init_params(ref.STD, ref.SEED).items()}


# --- allreduce -----------------------------------------------------------------------------------


def not_in_place(data):
    """The historic non-in-place allreduce: rebinds the list entries, so the devices' gradient
    arrays never change."""
    for i in range(1, len(data)):
        data[0][:] += data[i].copyto(data[0].context)
    for i in range(1, len(data)):
        data[i] = data[0].copyto(data[i].context)


def check_allreduce(allreduce, n):
    # Small whole numbers: float32 sums are exact, so equality is the right test.
    base = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    grads = [nd.array(base * (i + 1), ctx=d) for i, d in enumerate(cpus(n))]
    held = list(grads)  # what each device's parameter .grad still points to afterwards
    allreduce(grads)
    want = base * sum(range(1, n + 1))
    for i, (g, d) in enumerate(zip(held, cpus(n), strict=True)):
        assert g.context == d and np.array_equal(g.asnumpy(), want), (
            f"device {i} does not hold the sum"
        )


@pytest.mark.multi_device
@pytest.mark.parametrize("n", [2, 3])
def test_allreduce_leaves_the_sum_on_every_device_in_place(n):
    check_allreduce(lenet.allreduce, n)


def test_the_historic_not_in_place_allreduce_fails_the_check():
    with pytest.raises(AssertionError, match="device 1 does not hold the sum"):
        check_allreduce(not_in_place, 2)


@pytest.mark.multi_device
def test_get_params_places_an_independent_copy_on_each_context():
    params = lenet.init_params(ref.STD, ref.SEED)
    devs = cpus(2)
    a, b = (lenet.get_params(params, d) for d in devs)
    a["fc2.bias"][:] += 1
    assert b["fc2.bias"].abs().sum().asscalar() == 0 == params["fc2.bias"].abs().sum().asscalar()
    for copy, d in zip((a, b), devs, strict=True):
        assert all(p.context == d and p.grad is not None for p in copy.values())


@pytest.mark.multi_device
def test_evaluate_counts_the_correct_predictions_of_a_batch_split_over_the_devices():
    """One batch of 7 images, split over 1, 2 and 3 devices (unevenly for 2 and 3), labelled so
    that the one-device logits get 4 of them right: every split counts 4."""
    X = nd.array(np.random.default_rng(3).random((7, 1, 28, 28)))
    params = lenet.init_params(0.3, 0)
    predicted = lenet.lenet(X, params).asnumpy().argmax(axis=1)
    y = nd.array(np.where(np.arange(7) < 4, predicted, (predicted + 1) % 10))
    for n in (1, 2, 3):
        device_params = [lenet.get_params(params, d) for d in cpus(n)]
        assert lenet.evaluate(device_params, X, y, cpus(n)) == 4, n


# --- data parallel equals one device ---------------------------------------------------------


@pytest.mark.numerics
@pytest.mark.multi_device
def test_two_devices_train_like_one():
    """Rule 1: two devices and one compute the same mathematics, so in float64 they agree to
    2**-24 (measured <= 1e-16). A wrong allreduce (no sum, a mean, the book's rebinding one) is
    O(1) off."""
    batches = ref.batches(ref.load(), np.float64)
    losses1, (one,) = run_steps(1, batches)
    losses2, (a, b) = run_steps(2, batches)
    numerics.check_same_math("mxnet lenet 2 devices vs 1: losses", losses2, losses1)
    numerics.check_same_math("mxnet lenet 2 devices vs 1: weights", a, one)
    for name in one:
        # Same summed gradient and update on every device: replicas are bitwise identical.
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


# --- cross-framework parity ------------------------------------------------------------------


@pytest.mark.numerics
@pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.multi_device)])
def test_matches_the_float64_reference_fixture(n):
    """Rule 1: the float64 run against torch's float64 reference (tests/fixtures/
    lenet_reference.py: per-step losses and projections of every parameter's update)."""
    fixture = ref.load()
    losses, after = run_steps(n, ref.batches(fixture, np.float64))
    ref.check(fixture, losses, initial(), after[-1], f"mxnet lenet {n} devices")


def log_softmax_error(logits, labels):
    """How far MXNet's float32 log_softmax alone moves the summed loss, relative. On x86 it runs
    oneDNN's kernel, whose log/exp approximations are biased by ~6 U32 per element (AVX2 and
    AVX-512; ~15 U32 capped at SSE4.1), where rule 2 counts one rounding per stage, and a bias
    adds up over the batch's sum instead of averaging out. Measured on the run's own float32
    logits against MXNet's float64 log_softmax (not oneDNN): lenet.loss_fn is not part of it, so
    a bug there still shows."""
    picked = [
        nd.pick(nd.log_softmax(logits.astype(t)), labels.astype(t)).sum().asscalar()
        for t in ("float32", "float64")
    ]
    return abs(float(picked[0]) - float(picked[1])) / abs(float(picked[1]))


@pytest.mark.numerics
def test_float32_first_loss_matches_the_fixture():
    """Rule 2: the float32 first-step loss (continuous in the input; later steps follow gradients
    that jump at ReLU kinks) within the rounding factor times its sensitivity (the floor U32:
    logits ~1e-5 make the loss ~32 ln 10 whatever the weights), plus the loss op's own measured
    bias (log_softmax_error). Measured: 0.43 of this limit on AVX-512 and AVX2, 0.66 capped at
    SSE4.1; against rule 2's limit alone 0.76 and 1.96."""
    fixture = ref.load()
    X, y = ref.batches(fixture)[0]
    losses, _ = run_steps(1, [(X, y)], "float32")
    logits = lenet.lenet(nd.array(X), lenet.init_params(ref.STD, ref.SEED))
    sensitivity = max(float(fixture["first_loss.sensitivity"]), numerics.U32)
    limit = numerics.rounding_factor(ref.STAGES, ref.REDUCTION) * sensitivity
    numerics.report(
        "mxnet lenet float32 first loss",
        numerics.rel_error(losses[0], fixture["losses"][0]),
        limit + log_softmax_error(logits, nd.array(y)),
    )


# --- end to end and bad input ----------------------------------------------------------------


def argv(tmp_path, *extra):
    common = ["--workload", "lenet", "--platform", "cpu", "--preset", "smoke", "--no-progress"]
    return [*common, "--results", str(tmp_path / "r.jsonl"), *extra]


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.multi_device)])
def test_smoke_run_writes_one_valid_record(tmp_path, capsys, n):
    assert cli.run("mxnet", argv(tmp_path, "--gpus", str(n)), load=load) == 0
    (rec,) = results.load(tmp_path / "r.jsonl")
    cfg = config.get_config("lenet", "smoke")
    assert (rec.framework, rec.strategy, rec.devices, rec.virtual) == ("mxnet", "scratch", n, True)
    assert rec.epochs == cfg.epochs == len(rec.train_loss) == len(rec.test_acc_per_epoch)
    assert rec.sec_per_epoch["n"] == cfg.epochs and rec.warmup_seconds > 0
    assert rec.images_per_sec == pytest.approx(cfg.train_subset / rec.sec_per_epoch["median"])
    # Accuracy is an exact count over the test subset; the loss is per sample, near ln(10) at
    # the start of training with init std 0.01.
    assert (rec.test_acc * cfg.test_subset).is_integer() and rec.test_acc == rec.test_acc_per_epoch[
        -1
    ]
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
        (["--strategy", "gluon"], "lenet has one strategy, 'scratch'"),
        (["--amp", "bf16"], "float32 only"),
    ],
)
def test_bad_input_is_one_clear_line_and_no_record(tmp_path, capsys, extra, message):
    assert cli.run("mxnet", argv(tmp_path, *extra), load=load) == cli.EXIT_BAD_INPUT
    last = capsys.readouterr().err.splitlines()[-1]  # after the virtual-device note, if any
    assert last.startswith("error: ") and message in last
    assert not (tmp_path / "r.jsonl").exists()


def test_unknown_preset_is_refused_without_a_record(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:  # the command line refuses it ...
        cli.run("mxnet", [*argv(tmp_path), "--preset", "huge"], load=load)
    assert e.value.code == 2 and "invalid choice: 'huge'" in capsys.readouterr().err
    args = cli.parser("mxnet").parse_args(argv(tmp_path))
    args.preset = "huge"  # ... and so does main, called directly
    with pytest.raises(config.ConfigError, match="unknown preset 'huge'"):
        lenet.main(args, devices.DevicePlan(1, "cpu", True), cli.config_of(args), load("lenet")[1])
    assert not (tmp_path / "r.jsonl").exists()
