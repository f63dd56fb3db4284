"""resnet18 in JAX: model, weights, parity fixture, each strategy == one device, smoke runs.
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
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from common import cli, config, data, devices, flops, harness, weights
from jax_impl import resnet18 as r18
from jax_impl.__main__ import load
from tests.fixtures import gpu_checks, numerics, runs
from tests.fixtures import make_resnet18_parity as parity

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
PARAMS = flops.PARAMETERS["resnet18"]  # d2l's ResNet-18 (conv biases, no shortcut BN)
STATS = ("running_mean", "running_var")
HOOKS = load("resnet18")[1]  # what python -m jax_impl hands to main: harness.Hooks


def test_parameter_count_and_names():
    shapes = r18.weight_shapes(r18.resnet18())
    stats = ("running_mean", "running_var")
    assert sum(int(np.prod(s)) for k, s in shapes.items() if not k.endswith(stats)) == PARAMS
    trained = {k: s for k, s in shapes.items() if not k.endswith(stats)}
    assert trained == flops.parameter_shapes("resnet18")  # the step model's (compare.scaling)
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


def _cast(tree, dtype):
    """Every array of `tree` in `dtype` (exact upwards: the shared weights are float32 numbers)."""
    return jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype), tree)


def _parity_outputs(dtype):
    """The fixture's protocol (tests/fixtures/make_resnet18_parity.py) in JAX, in `dtype`."""
    ref = np.load(FIXTURES / "resnet18_parity.npz")
    x = jnp.asarray(ref["x"].transpose(0, 2, 3, 1), dtype)  # NCHW -> NHWC
    y = jnp.asarray(ref["y"])
    net = r18.resnet18(dtype=dtype)
    variables = _cast(r18.init_weights(net, parity.STD, parity.SEED), dtype)
    # jitted: eager dispatch compiles a program per operation and shape
    logits_eval = jax.jit(lambda v: net.apply(v, x, train=False))
    logits_train = jax.jit(lambda v: net.apply(v, x, train=True, mutable=["batch_stats"])[0])
    out = {"logits_eval": logits_eval(variables), "logits_train": logits_train(variables)}
    opt = r18.make_optimizer(parity.LR)
    state = dict(variables, opt_state=opt.init(variables["params"]))
    state, out["loss"] = jax.jit(lambda s: r18.train_step(net, opt, s, x, y))(state)
    out["logits_after_step"] = logits_train(
        {"params": state["params"], "batch_stats": state["batch_stats"]}
    )
    return ref, {k: np.asarray(v, np.float64) for k, v in out.items()}


@pytest.mark.numerics
def test_float64_run_reproduces_the_fixture():
    """Rule 1 (tests/fixtures/numerics.py): JAX's float64 run computes the fixture's
    mathematics, so every output agrees to 2**-24 on any machine."""
    with jax.enable_x64(True):
        ref, got = _parity_outputs(jnp.float64)
    for key in parity.OUTPUTS:
        numerics.check_same_math(f"jax resnet18 float64 {key}", got[key], ref[key])


@pytest.mark.numerics
def test_float32_forward_matches_the_float64_fixture():
    """Rule 2: float32 forward outputs (continuous in the input; the logits after the step are
    not: the step's gradient jumps at ReLU kinks) within the rounding factor times their
    sensitivity. The input is zero-mean, which keeps BatchNorm well conditioned."""
    ref, got = _parity_outputs(jnp.float32)
    for key in parity.FORWARD:
        numerics.check_float32(
            f"jax resnet18 float32 {key}",
            got[key],
            ref[key],
            float(ref[f"{key}.sensitivity"]),
            parity.STAGES,
            parity.REDUCTION,
        )


def _batches():
    """12 samples, two steps: 8 (4 + 4 over two devices), then a short one of 4 (2 + 2)."""
    rng = np.random.default_rng(1)
    x = rng.random((12, 8, 8, 1))
    y = rng.integers(0, 10, 12).astype(np.int32)
    return x, y, [np.arange(8), np.arange(8, 12)]


def _start(net, opt):
    variables = _cast(r18.init_weights(net, 0.1, 0), jnp.float64)
    return dict(variables, opt_state=opt.init(variables["params"]))


@functools.cache
def _one_device_steps(shares):
    """The two steps on one device, plain jit, float64: (start, each part's weights after,
    losses) as numpy. Each batch goes through the net as `shares` parts, one at a time, each
    with BatchNorm statistics of its own (a "ghost batch": what per-device BatchNorm computes)
    and running statistics of its own, which part i of every batch updates (device i's); their
    gradients and losses averaged. With 1: the whole batch at once (what --sync-bn computes)."""
    with jax.enable_x64(True):
        x, y, steps = _batches()
        net, opt = r18.resnet18(width=8, residuals=1, dtype=jnp.float64), r18.make_optimizer(0.1)
        state = _start(net, opt)
        start = r18.get_weights(state)
        grads_of = jax.jit(lambda s, x, y: r18.gradients(net, s, x, y))
        apply = jax.jit(lambda s, g, stats: r18.apply_gradients(opt, s, g, stats))
        sets, losses = [state["batch_stats"]] * shares, []
        for idx in steps:
            parts = [
                grads_of(dict(state, batch_stats=sets[i]), x[rows], y[rows])
                for i, rows in enumerate(data.shard_batch(idx, shares))
            ]
            loss, grads = jax.tree.map(lambda *a: sum(a) / shares, *[p[:2] for p in parts])
            sets = [stats for _, _, stats in parts]
            state = apply(state, grads, sets[0])
            losses.append(float(loss))
        return start, [r18.get_weights(dict(state, batch_stats=s)) for s in sets], losses


def _two_device_steps(strategy, sync, **kw):
    """The two steps on two devices under `strategy` (`kw`: its keywords), float64, BatchNorm per
    device or (`sync`) over the whole batch: (each device's weights, the steps' mean losses)."""
    with jax.enable_x64(True):
        x, y, steps = _batches()
        devs = jax.devices("cpu")[:2]
        axis = r18.AXIS if sync else None  # as main builds the net for --sync-bn
        net = r18.resnet18(width=8, residuals=1, axis_name=axis, dtype=jnp.float64)
        opt = r18.make_optimizer(0.1)
        place, shard, step, _, total = getattr(r18, strategy)(net, opt, runs.world_of(devs), **kw)
        state, (x_all, y_all) = place(_start(net, opt)), place([x, y])
        losses = []
        for idx, part in zip(steps, shard(steps), strict=True):
            state, loss = step(state, x_all, y_all, part)
            losses.append(total([loss], [])[0] / len(idx))  # the batch's summed loss
        return [r18.get_weights(r) for r in _replicas(state, strategy, devs)], losses


def _check_steps(name, got, got_losses, want):
    """Device i's weights and running statistics against part i's (every device's against the
    one set, with one part), the losses, and the same weights on every device, bitwise."""
    start, singles, losses = want
    limit = 1e3 * numerics.SAME_MATH_LIMIT
    # The steps moved the weights far more than the limit: the check can see a wrong step;
    # and the parts' running statistics differ as much: it can tell a device's own from others.
    assert numerics.rel_error(singles[0], start) > limit
    stats = [{k: v for k, v in s.items() if k.endswith(STATS)} for s in singles]
    assert all(numerics.rel_error(s, stats[0]) > limit for s in stats[1:])
    for i, copy in enumerate(got):
        numerics.check_same_math(f"{name}: device {i}", copy, singles[i % len(singles)])
    numerics.check_same_math(f"{name}: losses", got_losses, losses)
    for k, v in got[-1].items():  # the same update on each device, bitwise
        if not k.endswith(STATS):
            np.testing.assert_array_equal(v, got[0][k], err_msg=k)


# The fast tier holds every path but pmap's (its bucket is shard_map's); the slow tier all.
SLOW_PMAP = [pytest.param(s, marks=pytest.mark.slow) if s == "pmap" else s for s in r18.STRATEGIES]
# --sync-bn: sharding's in the fast tier, the explicit strategies' in the slow.
SLOW_EXPLICIT = [
    s if s == "sharding" else pytest.param(s, marks=pytest.mark.slow) for s in r18.STRATEGIES
]


@pytest.mark.numerics
@pytest.mark.multi_device
@pytest.mark.parametrize("strategy", SLOW_PMAP)
def test_two_devices_equal_one_device_normalising_each_share(strategy):
    """Rule 1, per-device BatchNorm (the default, as DDP and Gluon): every strategy computes what
    one device computes normalising each device's share of the batch alone, its gradients and
    losses averaged, each device's running statistics its share's alone, so in float64 they
    agree to 2**-24 (a gradient averaged twice or not at all is off by O(1); so are the whole
    batch's statistics, and statistics averaged over the devices: the shares differ by far
    more)."""
    got, losses = _two_device_steps(strategy, sync=False)
    _check_steps(
        f"jax resnet18 {strategy} 2 devices vs 1 (per-device BN)", got, losses, _one_device_steps(2)
    )


@pytest.mark.numerics
@pytest.mark.multi_device
@pytest.mark.parametrize("strategy", SLOW_EXPLICIT)
def test_two_devices_with_sync_bn_equal_one_device_on_the_whole_batch(strategy):
    """Rule 1, --sync-bn: every strategy computes what one device computes on the whole batch
    (BatchNorm's statistics pmean'd over 'data'), to 2**-24 in float64."""
    got, losses = _two_device_steps(strategy, sync=True)
    _check_steps(
        f"jax resnet18 {strategy} 2 devices vs 1 (sync BN)", got, losses, _one_device_steps(1)
    )


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.multi_device
@pytest.mark.parametrize("strategy", ["shard_map", "pmap"])
def test_unbucketed_pmean_equals_one_device_as_the_bucketed_does(strategy):
    """Rule 1 for --unbucketed (a pmean operand per array): the same mathematics as the bucketed
    default (one flat buffer), both held to one device to 2**-24 in float64."""
    got, losses = _two_device_steps(strategy, sync=False, bucketed=False)
    _check_steps(
        f"jax resnet18 {strategy} --unbucketed 2 devices vs 1", got, losses, _one_device_steps(2)
    )


def _replicas(state, strategy, devs):
    """Each device's copy of the state, its own running statistics in it: pmap's rows of its
    leading axis, or each device's buffer of every array (shard_map's P() outputs are each
    device's own result, unchecked), its row of the statistics (r18.STATE) taken out of its
    block of one."""
    if strategy == "pmap":
        return [jax.tree.map(lambda a, i=i: a[i], state) for i in range(len(devs))]
    copies = [
        jax.tree.map(lambda a, d=d: {s.device: s.data for s in a.addressable_shards}[d], state)
        for d in devs
    ]
    return [dict(c, batch_stats=jax.tree.map(lambda a: a[0], c["batch_stats"])) for c in copies]


@pytest.mark.numerics
def test_batchnorm_running_statistics_use_torchs_momentum():
    """Rule 1: after a train-mode step, running mean = 0.9 * old + 0.1 * the batch mean (torch's
    momentum 0.1 is flax's 0.9: the weight of the old value), computed by hand in float64.
    (flax's running variance takes the biased batch variance where torch takes the unbiased
    one, n / (n - 1) larger: 3e-4 relative at the smallest BatchNorm of a 256-image batch.)"""
    x = np.random.default_rng(3).standard_normal((4, 6, 6, 5)) + 2.0
    with jax.enable_x64(True):
        bn = r18.batch_norm(True, True, None, jnp.float64, "bn")
        variables = _cast(bn.init(jax.random.key(0), x), jnp.float64)
        _, new = bn.apply(variables, x, mutable=["batch_stats"])
    want = 0.9 * 0.0 + 0.1 * x.mean(axis=(0, 1, 2))
    got = new["batch_stats"]["mean"]
    numerics.check_same_math("jax resnet18 BatchNorm running mean", np.asarray(got), want)


def _plan():
    return devices.DevicePlan(2, "cpu", True)


def _args(**kw):
    return runs.command_args("resnet18", **{"results": "/nonexistent/never-written.jsonl", **kw})


def test_unknown_strategy_is_a_config_error():
    with pytest.raises(config.ConfigError, match="unknown resnet18 strategy"):
        r18.main(_args(strategy="ddp"), _plan(), cli.config_of(_args()), HOOKS)


@functools.cache
def _smoke(strategy, residuals=2):
    """One in-process smoke run on the 2 virtual devices: (record, stdout); shared by tests.
    `residuals`: the net's blocks per stage (1: about half the programs to compile)."""
    net = functools.partial(r18.resnet18, residuals=residuals)
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(r18, "resnet18", net):
        path, out = Path(tmp) / "r.jsonl", io.StringIO()
        args = _args(strategy=strategy, results=str(path))
        with contextlib.redirect_stdout(out):
            r18.main(args, _plan(), cli.config_of(args), HOOKS)
        return json.loads(path.read_text().splitlines()[-1]), out.getvalue()


@pytest.mark.slow
@pytest.mark.multi_device
@pytest.mark.parametrize("strategy", r18.STRATEGIES)
def test_smoke_end_to_end(strategy):
    """main end to end; sharding's run trains the whole network, as the two-process run it is
    compared with below does, the others one block per stage."""
    rec, stdout = _smoke(strategy, residuals=2 if strategy == "sharding" else 1)
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
    # One program over two devices either way, in two processes or in one; the reductions
    # between the devices may be ordered otherwise across processes (rule 3, per step's loss).
    limit = numerics.reordered_sum_limit(rec["steps_timed"] or 1)
    error = numerics.rel_error(rec["train_loss"], one["train_loss"])
    numerics.report("jax resnet18 2 processes vs 1", error, limit)
    assert rec["test_acc"] == one["test_acc"]


@pytest.mark.slow
def test_bf16_compute_keeps_float32_params():
    net = r18.resnet18(width=8, dtype=jnp.bfloat16)
    variables = r18.init_weights(net, 0.1, 0)
    x = np.random.default_rng(0).random((4, 8, 8, 1), dtype=np.float32)
    y = np.arange(4, dtype=np.int32)
    opt = r18.make_optimizer(0.1)
    state = dict(variables, opt_state=opt.init(variables["params"]))
    step = jax.jit(lambda s: r18.train_step(net, opt, s, x, y))
    losses = []
    for _ in range(5):
        state, loss = step(state)
        losses.append(float(loss))
    assert state["params"]["fc"]["kernel"].dtype == jnp.float32 and loss.dtype == jnp.float32
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


def test_warm_up_steps_leave_the_initial_state():
    """`train` warms up (compiles) on the batch shapes it will use on a throwaway copy: its
    first epoch's loss is that of the same steps taken from the initial state."""
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (20, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, 20)
    ds = (images, labels, images, labels)
    cfg = config.get_config("resnet18", "smoke", batch_size=8, lr=0.5, epochs=1)
    cfg = dataclasses.replace(cfg, steps_per_epoch=None, init_std=0.1)  # 8 + 8 + 4
    net, devs = r18.resnet18(width=4, residuals=1), jax.devices("cpu")[:1]
    run = runs.run_for("resnet18", cfg, ds, devs, hooks=HOOKS)
    used = []  # the strategy's functions `train` used: the same compiled steps replay below
    r18.train(net, cfg, ds, lambda *a: used.append(r18.sharding(*a)) or used[0], run)
    log = run.epoch_log
    opt = r18.make_optimizer(cfg.lr)
    place, shard, step, _, _ = used[0]
    variables = r18.init_weights(net, cfg.init_std, cfg.seed)
    state = place(dict(variables, opt_state=opt.init(variables["params"])))
    x, y, _, _ = place(data.as_float(ds, np.int32, channels_last=True))
    total = 0.0
    for part in shard(data.batches(20, 8, cfg.seed, 0)):
        state, loss = step(state, x, y, part)
        total += float(loss)
    assert log.timed_steps == [3] and len(log.sec_per_epoch) == 1
    # The same float32 steps from the same state; the epoch loss sums 3 step losses (rule 3).
    error = abs(log.train_loss[0] - total / 20) / (total / 20)
    numerics.report("jax resnet18 warm-up epoch loss", error, numerics.reordered_sum_limit(3))


@pytest.mark.multi_device
@pytest.mark.parametrize("strategy", r18.STRATEGIES)
def test_correct_counts_a_padded_test_batch_exactly(strategy):
    """`correct` pads each test batch to one size (one compilation) and masks the padding: on
    a short last batch it counts what the model predicts right, and nothing more."""
    rng = np.random.default_rng(4)
    x = rng.random((40, 8, 8, 1), dtype=np.float32)
    devs = jax.devices("cpu")[:2]
    net = r18.resnet18(width=4, residuals=1)
    variables = r18.init_weights(net, 0.1, 0)
    logits = np.asarray(net.apply(variables, x, train=False))
    top2 = np.sort(logits, axis=-1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0] > 1e-4 * np.abs(logits).max()).all()  # no near-ties
    y = logits.argmax(-1).astype(np.int32)
    y[1::3] = (y[1::3] + 1) % 10  # every third prediction is wrong; the padding's (index 0) right
    opt = r18.make_optimizer(0.1)
    place, _, _, correct, total = getattr(r18, strategy)(net, opt, runs.world_of(devs))
    state, (x_all, y_all) = (
        place(dict(variables, opt_state=opt.init(variables["params"]))),
        place([x, y]),
    )
    batches = [np.arange(0, 30), np.arange(30, 37)]  # shorter than TEST_BATCH x 2
    hits = [correct(state, x_all, y_all, idx) for idx in batches]
    want = [int(np.sum(idx % 3 != 1)) for idx in batches]
    assert [total([], [h])[1] for h in hits] == want


@pytest.mark.multi_device
@pytest.mark.parametrize("strategy", r18.STRATEGIES)
def test_every_device_evaluates_with_device_0s_running_statistics(strategy, monkeypatch):
    """`correct` splits a test batch over the devices, and each predicts its part with device
    0's running statistics (as DDP's ranks with rank 0's buffers, Gluon's first context with its
    own). Device 1's statistics are set far from device 0's, and the labels are the predictions
    with device 0's: evaluated that way every row counts; with device 1's own for its part, or
    the devices' average, some do not. A test batch of 8, padded to 2 x 4: 4 rows a device."""
    monkeypatch.setattr(harness, "TEST_BATCH", 4)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 8, 8, 1)).astype(np.float32)
    net, opt = r18.resnet18(width=4, residuals=1), r18.make_optimizer(0.1)
    variables = r18.init_weights(net, 0.1, 0)
    mine = variables["batch_stats"]
    far = jax.tree.map(lambda a: np.abs(a + 2 * rng.standard_normal(a.shape)).astype(a.dtype), mine)
    labels = np.asarray(net.apply(variables, x, train=False)).argmax(-1).astype(np.int32)
    theirs = dict(variables, batch_stats=far)
    assert (np.asarray(net.apply(theirs, x[4:], train=False)).argmax(-1) != labels[4:]).any()
    place, _, _, correct, total = getattr(r18, strategy)(
        net, opt, runs.world_of(jax.devices("cpu")[:2])
    )
    state = place(dict(variables, opt_state=opt.init(variables["params"])))
    stats = jax.tree.map(  # device 1's row far from device 0's
        lambda a, b, c: jax.device_put(np.stack([b, c]), a.sharding),
        state["batch_stats"],
        mine,
        far,
    )
    x_all, y_all = place([x, labels])
    hits = correct(dict(state, batch_stats=stats), x_all, y_all, np.arange(8))
    assert total([], [hits])[1] == 8


@contextlib.contextmanager
def relu_decisions(record=None, impose=None):
    """Record which ReLU inputs are > 0 (in call order), or impose recorded decisions instead of
    computing them: the float64 reference then takes float32's side of every kink (numerics.py,
    rule 1), so the comparison sees rounding only. The model calls flax's nn.relu at run time,
    also while jit traces it: under jit the recorded comparisons are traced values, which the
    traced function returns (see _loss_gradients)."""
    original, imposed = nn.relu, iter(impose or ())

    def relu(z):
        if impose is not None:
            return z * jnp.asarray(next(imposed), z.dtype)
        if record is not None:
            record.append(z > 0)
        return original(z)

    nn.relu = relu
    try:
        yield
    finally:
        nn.relu = original


@functools.partial(jax.jit, static_argnums=0)
def _loss_gradients(net, variables, x, y, decisions):
    """Loss gradients of `net` (train-mode BatchNorm) under `decisions`; with None, float32's
    own decisions, recorded from a forward pass of the same operations: (gradients, decisions).
    One jitted program per dtype: eager dispatch compiles a program per operation and shape."""

    def loss_of(params):
        both = {"params": params, "batch_stats": variables["batch_stats"]}
        logits, _ = net.apply(both, x, train=True, mutable=["batch_stats"])
        return r18.loss_fn(logits, y)

    if decisions is None:
        decisions = []
        with relu_decisions(record=decisions):
            loss_of(variables["params"])
    with relu_decisions(impose=decisions):
        return jax.grad(loss_of)(variables["params"]), decisions


def _gradients(device, dtype, w, x, decisions=None):
    """Loss gradients of the full ResNet-18 (train-mode BatchNorm) from exchange-format weights
    `w` on NCHW inputs `x`, in `dtype` on `device` (see _loss_gradients): (gradients as numpy,
    the ReLU decisions as numpy)."""
    net = r18.resnet18(dtype=dtype)
    # set_weights keeps the leaves' dtype: cast first, so float64 weights are not rounded
    variables = r18.set_weights(_cast(r18.init_weights(net, 0.1, 0), dtype), w)
    variables = jax.device_put(variables, device)
    x = jax.device_put(jnp.asarray(np.asarray(x).transpose(0, 2, 3, 1), dtype), device)
    y = jax.device_put(jnp.asarray(np.arange(len(x)) % 10, jnp.int32), device)
    grads, decisions = _loss_gradients(net, variables, x, y, decisions)
    grads = r18.get_weights({"params": grads})
    return {k: np.asarray(v, np.float64) for k, v in grads.items()}, [
        np.asarray(d) for d in decisions
    ]


@pytest.mark.numerics
@pytest.mark.parametrize("platform", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_float32_gradients_match_float64(platform):
    """Rule 2 per tensor: the float32 gradients, on the CPU and (where there is one) on a GPU
    at 'highest' matmul precision (XLA's GPU default is TF32), against float64 on the CPU with
    float32's ReLU decisions. The input is zero-mean: with [0, 1) pixels BatchNorm cancels most
    of the stem's and layer1's gradients. Conv biases feeding a BatchNorm have an exact gradient
    of 0 and are left out."""
    if platform == "gpu" and not _has_gpu():
        pytest.skip("JAX sees no GPU (CPU-only jaxlib)")
    w = weights.init_normal(r18.weight_shapes(r18.resnet18()), parity.STD, parity.SEED)
    x = np.random.default_rng(0).standard_normal((8, 1, 28, 28))
    with jax.default_matmul_precision("highest"):
        got, decisions = _gradients(jax.devices(platform)[0], jnp.float32, w, x)
    cpu = jax.devices("cpu")[0]
    with jax.enable_x64(True):
        want, _ = _gradients(cpu, jnp.float64, w, x, decisions)
        moved = numerics.perturb({**w, "input": x})
        off, _ = _gradients(cpu, jnp.float64, moved, moved.pop("input"), decisions)
    gpu_checks.check_float32_gradients(f"jax resnet18 {platform} float32 gradient", got, want, off)


def _has_gpu():
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False
