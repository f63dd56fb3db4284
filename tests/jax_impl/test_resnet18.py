"""resnet18 in JAX: model, weights, parity fixture, sharding/pmap == one device, smoke runs.
Two virtual CPU devices come from tests/jax_impl/conftest.py."""

import contextlib
import dataclasses
import functools
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
from argparse import Namespace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import config, devices
from jax_impl import resnet18 as r18
from tests.fixtures import gpu_checks

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
PARAMS = 11_175_818  # d2l's ResNet-18 (conv biases, no shortcut BN), 1 channel in, 10 classes
PARITY_SEED, PARITY_STD, PARITY_LR = 0, 0.05, 0.1  # tests/fixtures/make_resnet18_parity.py


def test_parameter_count_and_names():
    shapes = r18.weight_shapes(r18.resnet18())
    stats = ("running_mean", "running_var")
    assert sum(int(np.prod(s)) for k, s in shapes.items() if not k.endswith(stats)) == PARAMS
    assert shapes["stem.conv.weight"] == (64, 1, 3, 3)  # OIHW in the exchange format
    assert shapes["layer2.0.shortcut.weight"] == (128, 64, 1, 1)
    assert shapes["layer1.0.bn1.running_mean"] == (64,)
    assert shapes["fc.weight"] == (10, 512)
    assert "layer1.0.shortcut.weight" not in shapes


def test_weights_convert_layouts_and_round_trip():
    net = r18.resnet18(width=8)
    variables = r18.init_weights(net, 0.01, seed=3)
    assert variables["params"]["stem_conv"]["kernel"].shape == (3, 3, 1, 8)  # HWIO inside flax
    assert variables["params"]["fc"]["kernel"].shape == (64, 10)  # (in, out)
    w = r18.get_weights(variables)
    assert abs(float(w["layer4.1.conv2.weight"].std()) - 0.01) < 1e-3
    back = r18.get_weights(r18.set_weights(variables, w))
    for k, v in back.items():
        np.testing.assert_array_equal(v, w[k])


def test_forward_and_step_match_the_committed_torch_fixture():
    ref = np.load(FIXTURES / "resnet18_parity.npz")
    x = jnp.asarray(ref["x"].transpose(0, 2, 3, 1))  # NCHW -> NHWC
    y = jnp.asarray(ref["y"])
    net = r18.resnet18()
    variables = r18.init_weights(net, PARITY_STD, PARITY_SEED)
    logits_eval = net.apply(variables, x, train=False)
    logits_train, _ = net.apply(variables, x, train=True, mutable=["batch_stats"])
    opt = r18.make_optimizer(net, PARITY_LR)
    state = dict(variables, opt_state=opt.init(variables["params"]))
    state, loss = jax.jit(lambda s: r18.train_step(net, opt, s, x, y))(state)
    after, _ = net.apply(
        {"params": state["params"], "batch_stats": state["batch_stats"]},
        x,
        train=True,
        mutable=["batch_stats"],
    )
    # Two libraries, 20 float32 layers, a well-conditioned input (see the fixture's generator):
    # within 1e-5 of the logits' scale (measured 2e-6).
    for got, key in (
        (logits_eval, "logits_eval"),
        (logits_train, "logits_train"),
        (after, "logits_after_step"),
    ):
        scale = np.abs(ref[key]).max()
        np.testing.assert_allclose(got, ref[key], rtol=1e-5, atol=1e-5 * scale, err_msg=key)
    np.testing.assert_allclose(float(loss), ref["loss"], rtol=1e-5)


@functools.cache
def _one_device_step(use_bn):
    rng = np.random.default_rng(1)
    x = rng.random((8, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, 10, 8).astype(np.int32)
    net = r18.resnet18(width=8, use_bn=use_bn)
    opt = r18.make_optimizer(net, 0.1)
    variables = r18.init_weights(net, 0.1, 0)
    state = dict(variables, opt_state=opt.init(variables["params"]))
    state, loss = jax.jit(lambda s: r18.train_step(net, opt, s, x, y))(state)
    return x, y, r18.get_weights(variables), r18.get_weights(state), float(loss)


@pytest.mark.multi_device
@pytest.mark.parametrize("strategy", ["sharding", "pmap"])
def test_two_devices_equal_one_device_with_batchnorm(strategy):
    """BatchNorm included: global-batch statistics (sharding) / pmean'd statistics (pmap)."""
    x, y, start, single, loss = _one_device_step(use_bn=True)
    devs = jax.devices("cpu")[:2]
    net = r18.resnet18(width=8, axis_name=r18.AXIS if strategy == "pmap" else None)
    opt = r18.make_optimizer(net, 0.1)
    parallel = r18.sharding_parallel if strategy == "sharding" else r18.pmap_parallel
    place, step, _ = parallel(net, opt, devs)
    variables = r18.init_weights(net, 0.1, 0)
    state = place(dict(variables, opt_state=opt.init(variables["params"])))
    state, dp_loss = step(state, place(x), place(y), place(r18.shard_batch(np.arange(8), 2), True))
    if strategy == "pmap":  # one replica per device; they must agree
        np.testing.assert_array_equal(*np.asarray(state["params"]["fc"]["kernel"]))
        state = jax.tree_util.tree_map(lambda a: a[0], state)
    got = r18.get_weights(state)
    assert any(not np.allclose(single[k], start[k]) for k in start)
    np.testing.assert_allclose(np.asarray(dp_loss).reshape(-1)[0], loss, rtol=1e-5)
    # float32, another reduction order: within 1e-4 of the step's largest update (conv biases
    # before BatchNorm get a zero gradient and hold only rounding noise of that size).
    step_size = max(np.abs(single[k] - start[k]).max() for k in single)
    for k in single:
        np.testing.assert_allclose(got[k], single[k], rtol=1e-5, atol=1e-4 * step_size, err_msg=k)


def test_indivisible_batch_is_a_config_error():
    with pytest.raises(config.ConfigError, match="does not divide evenly over 2 devices"):
        r18.shard_batch(np.arange(5), 2)


def _plan():
    return devices.DevicePlan(2, "cpu", True)


def _args(**kw):
    base = dict(
        workload="resnet18",
        gpus=2,
        platform="cpu",
        preset="smoke",
        strategy=None,
        epochs=None,
        batch_size=None,
        lr=None,
        split_size=None,
        sweep=False,
        amp="off",
        results=None,
        no_progress=True,
    )
    return Namespace(**{**base, **kw})


def test_unknown_strategy_is_a_config_error():
    with pytest.raises(config.ConfigError, match="unknown resnet18 strategy"):
        r18.main(_args(strategy="ddp"), _plan())


@functools.cache
def _smoke(strategy):
    """One in-process smoke run on the 2 virtual devices: (record, stdout); shared by tests."""
    with tempfile.TemporaryDirectory() as tmp:
        path, out = Path(tmp) / "r.jsonl", io.StringIO()
        with contextlib.redirect_stdout(out):
            r18.main(_args(strategy=strategy, results=str(path)), _plan())
        return json.loads(path.read_text().splitlines()[-1]), out.getvalue()


@pytest.mark.slow
@pytest.mark.multi_device
@pytest.mark.parametrize("strategy", ["sharding", "pmap"])
def test_smoke_end_to_end(strategy):
    rec, stdout = _smoke(strategy)
    assert rec["framework"] == "jax" and rec["strategy"] == strategy
    assert rec["devices"] == 2 and rec["batch_size"] == 32 and rec["lr"] == pytest.approx(0.1)
    assert rec["extrapolated"] is True and rec["steps_timed"] == 2 and rec["images_per_sec"] > 0
    assert np.isfinite(rec["train_loss"]).all() and 0 <= rec["test_acc"] <= 1
    assert rec["extra"]["utilization_source"] == "cpu_time"
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("test acc:") and "(extrapolated) on [2 x cpu (virtual)]" in last


@pytest.mark.slow
@pytest.mark.multi_device
def test_two_processes_with_jax_distributed_match_one_process(tmp_path):
    """jax.distributed.initialize: two processes on 127.0.0.1, one CPU device each."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "jax_impl", "--workload", "resnet18", "--gpus", "1"]
    cmd += ["--platform", "cpu", "--preset", "smoke", "--results", str(path), "--no-progress"]
    env = {**os.environ, "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "2"}
    procs = [
        subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**env, "JAX_PROCESS_ID": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    logs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), logs
    lines = path.read_text().splitlines()
    assert len(lines) == 1  # process 0 writes the record
    rec, (one, _) = json.loads(lines[0]), _smoke("sharding")
    assert rec["devices"] == 2 and rec["extra"]["processes"] == 2
    assert rec["batch_size"] == one["batch_size"]
    np.testing.assert_allclose(rec["train_loss"], one["train_loss"], rtol=1e-5)
    assert rec["test_acc"] == one["test_acc"]


@pytest.mark.slow
def test_bf16_compute_keeps_float32_params():
    net = r18.resnet18(width=8, dtype=jnp.bfloat16)
    variables = r18.init_weights(net, 0.1, 0)
    x = np.random.default_rng(0).random((4, 8, 8, 1), dtype=np.float32)
    y = np.arange(4, dtype=np.int32)
    opt = r18.make_optimizer(net, 0.1)
    state = dict(variables, opt_state=opt.init(variables["params"]))
    step = jax.jit(lambda s: r18.train_step(net, opt, s, x, y))
    losses = []
    for _ in range(5):
        state, loss = step(state)
        losses.append(float(loss))
    assert state["params"]["fc"]["kernel"].dtype == jnp.float32
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


def test_warm_up_steps_leave_the_initial_state():
    """`train` warms up (compiles) on the batch shapes it will use on a throwaway copy: its
    first epoch's loss is that of the same steps taken from the initial state."""
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (20, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, 20)
    cfg = config.get_config("resnet18", "smoke", batch_size=8, lr=0.5, epochs=1)
    cfg = dataclasses.replace(cfg, steps_per_epoch=None, init_std=0.1)  # 8 + 8 + 4
    net, devs = r18.resnet18(width=4), jax.devices("cpu")[:1]
    out = r18.train(net, cfg, (images, labels, images, labels), devs, "sharding")
    opt = r18.make_optimizer(net, cfg.lr)
    place, step, _ = r18.sharding_parallel(net, opt, devs)
    variables = r18.init_weights(net, cfg.init_std, cfg.seed)
    state = place(dict(variables, opt_state=opt.init(variables["params"])))
    x = place(r18.data.to_float(images).transpose(0, 2, 3, 1))
    y = place(labels.astype(np.int32))
    total = 0.0
    for idx in r18.data.batches(20, 8, cfg.seed, 0):
        state, loss = step(state, x, y, place(r18.shard_batch(idx, 1), True))
        total += float(loss) * len(idx)
    assert out["timed_steps"] == [3] and len(out["sec_per_epoch"]) == 1
    assert out["train_loss"][0] == pytest.approx(total / 20, rel=1e-6)


def _gradients(device, dtype):
    """Loss gradients of the full ResNet-18 (train-mode BatchNorm) on a batch of zero-mean
    inputs (see the torch test of the same name for why zero-mean), on `device` in `dtype`."""
    rng = np.random.default_rng(0)
    x = jax.device_put(jnp.asarray(rng.standard_normal((8, 28, 28, 1)), dtype), device)
    y = jax.device_put(jnp.asarray(np.arange(8) % 10, jnp.int32), device)
    net = r18.resnet18(dtype=dtype)
    variables = r18.init_weights(net, PARITY_STD, PARITY_SEED)
    variables = jax.device_put(jax.tree_util.tree_map(lambda a: a.astype(dtype), variables), device)

    def loss_of(params):
        logits, _ = net.apply(
            {"params": params, "batch_stats": variables["batch_stats"]},
            x,
            train=True,
            mutable=["batch_stats"],
        )
        return r18.loss_fn(logits, y)

    grads = jax.jit(jax.grad(loss_of))(variables["params"])
    return {k: v.astype(np.float64) for k, v in r18.get_weights({"params": grads}).items()}


@pytest.mark.parametrize("platform", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_float32_gradients_match_float64(platform):
    """The float32 training step, on the CPU and (where there is one) on a GPU at 'highest'
    matmul precision (XLA's GPU default is TF32), against float64 on the CPU. float32 lands
    within 5e-6 per tensor (measured on the CPU); 1e-5 has margin, while TF32 would be off by
    ~1e-3."""
    with jax.enable_x64(True):
        want = _gradients(jax.devices("cpu")[0], jnp.float64)
    with jax.default_matmul_precision("highest"):
        got = _gradients(jax.devices(platform)[0], jnp.float32)
    worst, error = gpu_checks.worst_gradient_error(got, want)
    print(f"{platform}: worst {worst} {error:.1e}")
    assert error < 1e-5, f"{worst}: {error:.1e}"
