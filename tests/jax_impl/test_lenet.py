"""lenet (d2l 13.5, data parallel from scratch) in JAX: allreduce, equivalence, parity, CLI.

Two virtual CPU devices come from tests/jax_impl/conftest.py.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import cli, config, devices, results
from jax_impl import devices as jdev
from jax_impl import lenet
from jax_impl.__main__ import load
from tests.fixtures import lenet_reference as ref
from tests.fixtures import numerics


def cpus(n):
    return jdev.get_devices(devices.DevicePlan(n, "cpu", virtual=True))


def run_steps(n_devices, batches, dtype=np.float64):
    """`len(batches)` train_batch steps on n virtual devices: per-step losses, params per device.
    float64 by default: comparisons of programs are rule 1 of tests/fixtures/numerics.py."""
    with jax.enable_x64(dtype == np.float64):
        devs = cpus(n_devices)
        params = {k: jnp.asarray(p, dtype) for k, p in lenet.init_params(ref.STD, ref.SEED).items()}
        device_params = [lenet.get_params(params, d) for d in devs]
        losses = []
        for X, y in batches:
            X, y = jax.device_put(X, devs[0]), jax.device_put(y.astype(np.int32), devs[0])
            device_params, loss = lenet.train_batch(X, y, device_params, devs, ref.LR)
            losses.append(float(loss))
        for params, d in zip(device_params, devs, strict=True):
            assert all(p.devices() == {d} and p.dtype == dtype for p in params.values())
        return losses, [{k: np.asarray(p) for k, p in ps.items()} for ps in device_params]


def initial():
    return {k: np.asarray(p) for k, p in lenet.init_params(ref.STD, ref.SEED).items()}


# --- allreduce -----------------------------------------------------------------------------------


def broadcast_forgotten(data):
    """Sums into device 0 but hands device 0's array to every device."""
    total = data[0]
    for i in range(1, len(data)):
        total = total + jax.device_put(data[i], data[0].device)
    return [total] * len(data)


def in_place_port(data):
    """A literal port of torch's in-place form: `.at[].add/set` return new arrays, dropped here."""
    for i in range(1, len(data)):
        data[0].at[:].add(jax.device_put(data[i], data[0].device))
    for i in range(1, len(data)):
        data[i].at[:].set(jax.device_put(data[0], data[i].device))
    return data


def check_allreduce(allreduce, devs):
    # Small whole numbers: float32 sums are exact, so equality is the right test.
    base = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    grads = [jax.device_put(base * (i + 1), d) for i, d in enumerate(devs)]
    out = allreduce(grads)
    assert len(out) == len(devs)
    want = base * sum(range(1, len(devs) + 1))
    for i, (g, d) in enumerate(zip(out, devs, strict=True)):
        assert g.devices() == {d}, f"device {i}: its array lives on {g.devices()}"
        assert np.array_equal(np.asarray(g), want), f"device {i} does not hold the sum"


@pytest.mark.multi_device
def test_allreduce_returns_the_sum_on_every_device():
    check_allreduce(lenet.allreduce, cpus(2))


@pytest.mark.multi_device
def test_broken_allreduces_fail_the_check():
    with pytest.raises(AssertionError, match="device 1: its array lives on"):
        check_allreduce(broadcast_forgotten, cpus(2))
    with pytest.raises(AssertionError, match="device 0 does not hold the sum"):
        check_allreduce(in_place_port, cpus(2))


@pytest.mark.multi_device
def test_get_params_places_a_copy_on_each_device():
    params = lenet.init_params(ref.STD, ref.SEED)
    for d in cpus(2):
        copy = lenet.get_params(params, d)
        assert all(p.devices() == {d} for p in copy.values())
        assert all(np.array_equal(copy[k], params[k]) for k in params)


@pytest.mark.multi_device
def test_evaluate_counts_the_correct_predictions_of_a_batch_split_over_the_devices():
    """Every shard counted once, a short batch (fewer images than devices) included."""
    params = lenet.init_params(ref.STD, ref.SEED)
    X = np.random.default_rng(0).random((7, 1, 28, 28), dtype=np.float32)
    y = np.array(jnp.argmax(lenet.lenet(X, params), axis=1), np.int32)
    y[::2] = (y[::2] + 1) % 10  # images 0, 2, 4, 6 predicted wrong
    for n, (start, stop), want in ((1, (0, 7), 3), (2, (0, 7), 3), (2, (6, 7), 0), (2, (5, 6), 1)):
        devs = cpus(n)
        device_params = [lenet.get_params(params, d) for d in devs]
        got = lenet.evaluate(device_params, X[start:stop], y[start:stop], devs)
        assert got == want, (n, start, stop)


# --- data parallel equals one device ---------------------------------------------------------


@pytest.mark.numerics
@pytest.mark.multi_device
def test_two_devices_train_like_one():
    batches = ref.batches(ref.load(), np.float64)
    losses1, (one,) = run_steps(1, batches)
    losses2, (a, b) = run_steps(2, batches)
    numerics.check_same_math("jax lenet 2 devices vs 1: device 0's weights", a, one)
    numerics.check_same_math("jax lenet 2 devices vs 1: device 1's weights", b, one)
    numerics.check_same_math("jax lenet 2 devices vs 1: losses", losses2, losses1)
    for name in one:
        # Same summed gradient and update on every device: replicas are bitwise identical.
        np.testing.assert_array_equal(a[name], b[name])


# --- cross-framework parity ------------------------------------------------------------------


@pytest.mark.numerics
@pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.multi_device)])
def test_matches_the_float64_reference_fixture(n):
    fixture = ref.load()
    losses, after = run_steps(n, ref.batches(fixture, np.float64))
    ref.check(fixture, losses, initial(), after[-1], f"jax lenet {n} devices")


@pytest.mark.numerics
def test_float32_first_loss_matches_the_fixture():
    fixture = ref.load()
    losses, _ = run_steps(1, ref.batches(fixture)[:1], np.float32)
    ref.check_first_loss(fixture, losses[0], "jax lenet float32")


# --- end to end and bad input ----------------------------------------------------------------


def argv(tmp_path, *extra):
    smoke = ["--workload", "lenet", "--platform", "cpu", "--preset", "smoke", "--no-progress"]
    return [*smoke, "--results", str(tmp_path / "r.jsonl"), *extra]


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.multi_device)])
def test_smoke_run_writes_one_valid_record(tmp_path, capsys, n):
    assert cli.run("jax", argv(tmp_path, "--gpus", str(n)), load=load) == 0
    (rec,) = results.load(tmp_path / "r.jsonl")
    cfg = config.get_config("lenet", "smoke")
    assert (rec.framework, rec.strategy, rec.devices, rec.virtual) == ("jax", "scratch", n, True)
    assert rec.epochs == cfg.epochs == len(rec.train_loss) == len(rec.test_acc_per_epoch)
    assert rec.sec_per_epoch["n"] == cfg.epochs and rec.warmup_seconds > 0
    assert rec.images_per_sec == pytest.approx(cfg.train_subset / rec.sec_per_epoch["median"])
    # Accuracy is an exact count over the test subset; the loss is per sample, near ln(10) at
    # the start of training with init std 0.01.
    assert (rec.test_acc * cfg.test_subset).is_integer()
    assert rec.test_acc == rec.test_acc_per_epoch[-1]
    assert abs(rec.train_loss[0] - np.log(10)) < 0.01
    out = capsys.readouterr().out.strip().splitlines()
    line = rf"test acc: \d\.\d\d, \d+\.\d sec/epoch on \[{n} x cpu \(virtual\)\]"
    assert re.fullmatch(line, out[-1])
    assert out[0].startswith("epoch 1/1: train loss ")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--gpus", "2", "--batch-size", "255"], "batch size 255 does not divide evenly over 2"),
        # 1024 images in batches of 6 leave a last batch of 4, which 3 devices cannot share.
        (["--gpus", "3", "--batch-size", "6"], "last batch of each epoch has 4 images"),
        (["--gpus", "0"], "GPUS must be a whole number of at least 1"),
        (["--strategy", "pmap"], "lenet has one strategy, 'scratch'"),
        (["--amp", "bf16"], "float32 only"),
    ],
)
def test_bad_input_is_one_clear_line_and_no_record(tmp_path, capsys, extra, message):
    assert cli.run("jax", argv(tmp_path, *extra), load=load) == cli.EXIT_BAD_INPUT
    last = capsys.readouterr().err.splitlines()[-1]  # after the virtual-device note, if any
    assert last.startswith("error: ") and message in last
    assert not (tmp_path / "r.jsonl").exists()


def test_unknown_preset_is_refused_without_a_record(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:  # the command line refuses it ...
        cli.run("jax", [*argv(tmp_path), "--preset", "huge"], load=load)
    assert e.value.code == 2 and "invalid choice: 'huge'" in capsys.readouterr().err
    args = cli.parser("jax").parse_args(argv(tmp_path))
    args.preset = "huge"  # ... and so does main, called directly
    with pytest.raises(config.ConfigError, match="unknown preset 'huge'"):
        plan, (_, hooks) = devices.DevicePlan(1, "cpu", virtual=True), load("lenet")
        lenet.main(args, plan, cli.config_of(args), hooks)
    assert not (tmp_path / "r.jsonl").exists()
