"""zero (lesson 4) in JAX: each sharded strategy steps AdamW as one device does, holds 1/N of the
state on each device, and makes the collectives its program says. Two virtual CPU devices come
from tests/jax_impl/conftest.py."""

import contextlib
import functools
import io
import json
import tempfile
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import cli, config, devices
from jax_impl import resnet18 as r18
from jax_impl import zero
from jax_impl.__main__ import load
from tests.fixtures import numerics, runs

HOOKS = load("zero")[1]
STEPS = 3  # AdamW's moments and bias correction after more than one step
VARIANTS = {  # what --strategy (and --unbucketed) choose
    "sharding": zero.sharding,
    "fsdp": zero.fsdp,
    "fsdp_explicit": zero.fsdp_explicit,
    "fsdp_explicit_unbucketed": functools.partial(zero.fsdp_explicit, bucketed=False),
}


def _problem(dtype=jnp.float64, width=8):
    """A small ResNet-18 (`width` channels wide, a block per stage; at 8, fsdp splits every array
    over 2 devices) in `dtype`, AdamW with torch's defaults, and STEPS batches of 8 images."""
    cfg = config.get_config("zero", "smoke")
    net = r18.resnet18(width=width, residuals=1, dtype=dtype)
    rng = np.random.default_rng(1)
    x, y = rng.random((8 * STEPS, 8, 8, 1)), rng.integers(0, 10, 8 * STEPS).astype(np.int32)
    return net, zero.make_optimizer(cfg), x, y, [np.arange(8 * i, 8 * i + 8) for i in range(STEPS)]


def _start(net, optimizer, rows):
    v = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), r18.init_weights(net, 0.1, 0))
    start = dict(v, opt_state=optimizer.init(v["params"]))
    if rows:  # lesson 2's STATE: a row of running statistics per device
        start["batch_stats"] = jax.tree.map(lambda a: jnp.stack([a] * rows), v["batch_stats"])
    return jax.tree.map(np.asarray, start)


def _host(state):
    """The whole state as float64 numpy (a sharded array's shards put together), by path."""
    flat = jax.tree_util.tree_flatten_with_path(jax.tree.map(np.asarray, state))[0]
    return {jax.tree_util.keystr(k): np.asarray(v, np.float64) for k, v in flat}


@functools.cache
def _one_device(shares, width=8):
    """The steps on one device, plain jit: each batch through the net as `shares` parts, each
    normalised alone with a row of running statistics of its own (lesson 2's `gradients`),
    their gradients averaged: (start, state after, losses)."""
    with jax.enable_x64(True):
        net, optimizer, x, y, batches = _problem(width=width)
        state, x, y = _start(net, optimizer, shares), jnp.asarray(x), jnp.asarray(y)

        @jax.jit
        def step(state, idx):
            loss, grads, stats = r18.gradients(net, state, x[idx], y[idx], shares=shares)
            return r18.apply_gradients(optimizer, state, grads, stats), loss

        losses = []
        for idx in batches:
            state, loss = step(state, idx)
            losses.append(float(loss))
        return _host(_start(net, optimizer, shares)), _host(state), losses


@functools.cache
def _devices_steps(variant, n, width=8):
    """The steps under a strategy on n devices, float64: (state after, losses, its compiled
    step, the state's bytes per device)."""
    with jax.enable_x64(True):
        net, optimizer, x, y, batches = _problem(width=width)
        world = runs.world_of(jax.devices("cpu")[:n])
        place, shard, step, _, total = VARIANTS[variant](net, optimizer, world)
        state, (x_all, y_all) = place(_start(net, optimizer, 0)), place([x, y])
        parts = list(shard(batches))
        compiled = step.lower(state, x_all, y_all, parts[0]).compile()
        losses = []
        for part in parts:
            state, loss = step(state, x_all, y_all, part)
            losses.append(total([loss], [])[0] / 8)
        return _host(state), losses, compiled, zero.state_bytes(state, world)


def _check(name, variant, n, width=8):
    start, want, want_losses = _one_device(n, width)
    got, losses, _, _ = _devices_steps(variant, n, width)
    # The steps moved every part of the state far more than the limit: a wrong step shows.
    assert numerics.rel_error(want, start) > 1e3 * numerics.SAME_MATH_LIMIT
    assert got.keys() == want.keys()
    for kind in ("'params'", "'opt_state'", "'batch_stats'"):
        part = {k: v for k, v in got.items() if k.startswith(f"[{kind}]")}
        numerics.check_same_math(f"{name}: {kind}", part, {k: want[k] for k in part})
    numerics.check_same_math(f"{name}: losses", losses, want_losses)


@pytest.mark.numerics
@pytest.mark.multi_device
@pytest.mark.parametrize("variant", ["fsdp", "fsdp_explicit"])
def test_sharded_strategies_step_adamw_as_one_device(variant):
    """Rule 1: on two devices the parameters, AdamW's moments and step count, each device's
    running statistics and the losses after STEPS steps are one device's, which normalises each
    device's share of the batch alone and averages the gradients, to 2**-24 in float64. A shard
    not gathered, a gradient summed and not averaged (AdamW's update barely sees the scale; its
    moments do), a shard stepped twice: each is off by O(1) somewhere in the state."""
    _check(f"jax zero {variant} 2 devices vs 1", variant, 2)


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.multi_device
def test_an_array_no_axis_of_which_n_divides_steps_whole_as_one_device():
    """An array kept whole on every device (`_layout`: N divides none of its axes) has its
    gradient summed whole, outside the bucket, so that every device takes the same step with it:
    3 channels wide, the stem's and the first stage's arrays are such arrays on two
    devices, as ResNet-18's 10 classifier biases are on four and eight. Put in the bucket as N
    copies, its gradient comes back as one device's row, which shard_map refuses to call the
    same on every device."""
    _check("jax zero fsdp_explicit, arrays kept whole, 2 devices vs 1", "fsdp_explicit", 2, 3)


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.multi_device
@pytest.mark.parametrize("variant", ["sharding", "fsdp_explicit_unbucketed"])
def test_the_baseline_and_the_unbucketed_step_adamw_as_one_device(variant):
    """Rule 1 as above for lesson 2's `sharding` with AdamW (ZeRO stage 0, the baseline the
    sharded ones equal) and fsdp_explicit's collective per array."""
    _check(f"jax zero {variant} 2 devices vs 1", variant, 2)


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_one_device_is_plain_jit(variant):
    """Rule 1: on one device every strategy is the plain step (its collectives of one)."""
    _check(f"jax zero {variant} 1 device", variant, 1)


@pytest.mark.multi_device
def test_fsdp_holds_half_the_state_on_each_of_two_devices():
    """Read from the shards (state_bytes): the parameters and AdamW's moments split in two,
    the step count (one int32) whole on each device; sharding's whole on each. Ψ: flax's
    parameters of the small net, float32 here (4 bytes each)."""
    net, optimizer, *_ = _problem(jnp.float32)
    world = runs.world_of(jax.devices("cpu")[:2])
    variables = r18.init_weights(net, 0.1, 0)
    start = dict(variables, opt_state=optimizer.init(variables["params"]))
    psi = sum(a.size for a in jax.tree.leaves(start["params"]))
    for strategy, share in (("fsdp", 2), ("sharding", 1)):
        state = VARIANTS[strategy](net, optimizer, world)[0](start)
        row = {"params": 4 * psi // share, "grads": 4 * psi // share}
        assert zero.state_bytes(state, world) == [{**row, "opt_state": 8 * psi // share + 4}] * 2


def _ops(variant):
    return {c["op"]: c for c in zero.step_collectives(_devices_steps(variant, 2)[2])}


@pytest.mark.multi_device
def test_bucketed_explicit_step_gathers_and_scatters_one_buffer():
    """The optimized program of fsdp_explicit's step: one all-gather of every parameter shard
    (Ψ elements, float64 here: 8Ψ bytes), one reduce-scatter of every gradient, one all-reduce
    (the loss): the buckets reach XLA as single collectives."""
    psi = sum(v.size for k, v in _one_device(2)[1].items() if k.startswith("['params']"))
    ops = _ops("fsdp_explicit")
    assert ops["all_gather"] == {"op": "all_gather", "count": 1, "bytes": 8 * psi}
    assert ops["reduce_scatter"] == {"op": "reduce_scatter", "count": 1, "bytes": 8 * psi}
    assert ops["all_reduce"]["count"] == 1


@pytest.mark.slow
@pytest.mark.multi_device
def test_unbucketed_explicit_step_makes_a_collective_per_array():
    ops = _ops("fsdp_explicit_unbucketed")
    arrays = sum(1 for k in _one_device(2)[1] if k.startswith("['params']"))
    assert ops["all_gather"]["count"] == arrays and ops["reduce_scatter"]["count"] > arrays // 2


def _args(**kw):
    return runs.command_args("zero", **{"results": "/nonexistent/never-written.jsonl", **kw})


@pytest.mark.slow
@pytest.mark.multi_device
@pytest.mark.parametrize("strategy", zero.STRATEGIES)
def test_smoke_end_to_end_records_lesson_4s_fields(strategy):
    """main end to end on 2 virtual devices (a block per stage): the record's state bytes
    (per device; halved by fsdp), peak and collectives."""
    net = functools.partial(r18.resnet18, residuals=1)
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(r18, "resnet18", net):
        path = Path(tmp) / "r.jsonl"
        args = _args(strategy=strategy, results=str(path))
        with contextlib.redirect_stdout(io.StringIO()):
            zero.main(args, devices.DevicePlan(2, "cpu", True), cli.config_of(args), HOOKS)
        rec = json.loads(path.read_text().splitlines()[-1])
    extra, psi = rec["extra"], rec["extra"]["parameters"]
    assert extra["optimizer"] == "adamw" and extra["zero_stage"] == zero.STAGE[strategy]
    share = 1 if strategy == "sharding" else 2
    assert [r["params"] for r in extra["state_bytes"]] == [4 * psi // share] * 2
    assert len(extra["peak_bytes"]["bytes"]) == 2 and extra["peak_bytes"]["bytes"][0] > 0
    ops = {c["op"] for c in extra["step_collectives"]}
    assert ops >= ({"all_reduce"} if strategy == "sharding" else {"all_gather"})
    assert np.isfinite(rec["train_loss"]).all()
