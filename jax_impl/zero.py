"""Lesson 4: sharded data parallelism (ZeRO, FSDP) in JAX, on lesson 2's ResNet-18 with AdamW.

Strategies (`--strategy`), each a function of (net, optimizer, world) as lesson 2's:
  sharding       lesson 2's `sharding` with AdamW: every device holds the whole state (ZeRO 0).
  fsdp           the parameters and AdamW's moments split on P('data') of the same Mesh, jit
                 inserting the collectives (ZeRO-3, FSDP).
  fsdp_explicit  the same layout under `jax.shard_map`: `lax.all_gather` of the parameters,
                 `lax.psum_scatter` / N of the gradients, AdamW on each device's own shard; each
                 collective on one flat buffer (a bucket, as DDP's), or (--unbucketed) per array.

Each array is split on its last axis (a conv's output channels) where N divides it, else on its
first, else kept whole (the classifier's 10 biases at N = 4 and 8). BatchNorm as lesson 2: each
device its own running statistics (a row per device), evaluation with device 0's.
"""

from __future__ import annotations

import math
import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from common import config, data, harness, training, utilization
from jax_impl import devices as jdev
from jax_impl import launch
from jax_impl import resnet18 as r18

FRAMEWORK = "jax"
STRATEGIES = ("sharding", "fsdp", "fsdp_explicit")
AXIS = r18.AXIS
STAGE = {"sharding": 0, "fsdp": 3, "fsdp_explicit": 3}  # ZeRO's stage of each strategy
HLO_OPS = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute")


def make_optimizer(cfg):
    """AdamW with torch's defaults (cfg): optax's decay is decoupled, lr * wd * p, as torch's."""
    return optax.adamw(cfg.lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)


def state_bytes(state, world) -> list[dict]:
    """Each device's bytes of parameters, gradients and AdamW's state, read from the shards this
    process holds (`addressable_shards`). The step's gradients take the parameters' layout (jit's
    sharding constraint, shard_map's psum_scatter to the local shard; replicated under
    `sharding`): their bytes per device are the parameter shards'."""
    where, own = {d: i for i, d in enumerate(world.devices)}, {}
    for kind, tree in (("params", state["params"]), ("opt_state", state["opt_state"])):
        for leaf in jax.tree.leaves(tree):
            for s in leaf.addressable_shards:
                row = own.setdefault(where[s.device], dict.fromkeys(training.STATE_KINDS, 0))
                row[kind] += s.data.nbytes
    for row in own.values():
        row["grads"] = row["params"]
    return training.state_table(world, own)


def step_collectives(compiled) -> list[dict]:
    """The collectives of the compiled step's optimized HLO, per kind: each op's count (an
    operand of a tuple op counted as one: XLA:CPU reduces each by itself) and full-size bytes
    (all-gather: its output; reduce-scatter: its input, N times its output; all-reduce and
    collective-permute: the buffer)."""
    text = compiled.as_text()
    n = int((re.findall(r"num_partitions=(\d+)", text) or [1])[0])
    found = {}
    for result, op in re.findall(rf"= (\S+|\([^)]*\)) ({'|'.join(HLO_OPS)})(?:-start)?\(", text):
        row = found.setdefault(op, {"op": op.replace("-", "_"), "count": 0, "bytes": 0})
        for bits, dims in re.findall(r"[a-z]+(\d+)\[([0-9,]*)\]", result):
            row["count"] += 1
            size = int(bits) // 8 * math.prod(int(d) for d in dims.split(",") if d)
            row["bytes"] += size * (n if op == "reduce-scatter" else 1)
    return list(found.values())


def _layout(net, optimizer, mesh):
    """The state's PartitionSpecs: each array of the parameters and of AdamW's moments split on
    its last axis where N divides it, else its first, else whole (the step count); BatchNorm's
    running statistics a row per device (lesson 2's STATE)."""
    x = jnp.zeros((1, 8, 8, 1))
    shapes = jax.eval_shape(partial(net.init, train=False), jax.random.key(0), x)
    n, params = mesh.size, shapes["params"]

    def spec(a):
        axes = [k for k in (a.ndim - 1, 0) if a.ndim and a.shape[k] % n == 0]
        return P(*[None] * axes[0], AXIS) if axes else P()

    split = partial(jax.tree.map, spec)
    stats = jax.tree.map(lambda _: P(AXIS), shapes["batch_stats"])
    opt_state = jax.eval_shape(optimizer.init, params)
    return dict(params=split(params), batch_stats=stats, opt_state=split(opt_state))


def _around(net, mesh, specs):
    """What fsdp's and fsdp_explicit's steps are used with (lesson 2's): place the data set
    whole on every device and the state as `specs`, each device its row of running statistics;
    shard each batch on 'data'; count the correct predictions (jit gathers the weights)."""
    batch, layout = NamedSharding(mesh, P(AXIS)), jax.tree.map(partial(NamedSharding, mesh), specs)

    def place(arrays):
        if not isinstance(arrays, dict):
            return jax.device_put(arrays, NamedSharding(mesh, P()))
        stats = arrays["batch_stats"]
        rows = jax.tree.map(lambda a: np.broadcast_to(a, (mesh.size, *a.shape)), stats)
        return jax.device_put(dict(arrays, batch_stats=rows), layout)

    def shard(batches):  # each batch whole: `batch` gives device k its k-th block of rows
        return (jax.device_put(np.asarray(idx, np.int32), batch) for idx in batches)

    count = jax.jit(lambda state, x, y, idx, mask: r18.evaluate(net, state, x[idx], y[idx], mask))

    def correct(state, x, y, idx):  # the test batch padded to one size: one compilation
        padded = jdev.padded(idx, harness.TEST_BATCH * mesh.size)
        return count(state, x, y, *jax.device_put(padded, batch))

    def total(losses, hits):  # the programs sum over every device, every process's
        return sum(map(float, losses)), sum(map(float, hits))

    return place, shard, correct, total


def _merge(block, k):  # (N, *shard) -> the whole array: the shards side by side on axis k
    if k is None:
        return block[0]
    shard = block.shape[1:]
    return jnp.moveaxis(block, 0, k).reshape(*shard[:k], -1, *shard[k + 1 :])


def _split(whole, k, n):  # the whole array -> (N, *shard), device i's shard in row i
    if k is None:  # kept whole: summed by itself (`_scatter`), nothing in the buffer
        return jnp.zeros((n, 0), whole.dtype)
    parts = whole.reshape(*whole.shape[:k], n, -1, *whole.shape[k + 1 :])
    return jnp.moveaxis(parts, k, 0)


def _gather(shards, axes, bucketed):
    """Every device's shards -> the whole parameters, on every device (varying: its own copy)."""
    if not bucketed:  # an all_gather per array
        return jax.tree.map(_whole, shards, axes)
    flat, unravel = ravel_pytree(shards)  # one buffer: this device's shards end to end
    blocks = jax.vmap(unravel)(lax.all_gather(flat, AXIS))  # (N, *shard) per array
    return jax.tree.map(_merge, blocks, axes)


def _scatter(grads, axes, n, bucketed):
    """Each device's whole gradients -> its shard of their sum (an array kept whole: the sum)."""
    if not bucketed:  # a psum_scatter per array
        return jax.tree.map(_part, grads, axes)
    rows = jax.tree.map(partial(_split, n=n), grads, axes)  # (N, *shard): row i device i's
    flat = jax.vmap(lambda t: ravel_pytree(t)[0])(rows)  # (N, shards end to end)
    mine = lax.psum_scatter(flat, AXIS, scatter_dimension=0)  # row i summed, to device i
    shards = ravel_pytree(jax.tree.map(lambda r: r[0], rows))[1](mine)
    return jax.tree.map(lambda s, g, k: _part(g, k) if k is None else s, shards, grads, axes)


def _whole(shard, k):  # one array gathered; one kept whole, this device's own copy of it
    if k is None:
        return lax.pcast(shard, AXIS, to="varying")
    return lax.all_gather(shard, AXIS, axis=k, tiled=True)


def _part(grad, k):  # one array's gradient summed, this device's shard of it
    if k is None:
        return lax.psum(grad, AXIS)
    return lax.psum_scatter(grad, AXIS, scatter_dimension=k, tiled=True)


# --- the parallelism: one function per strategy ------------------------------------------------


def sharding(net, optimizer, world):
    """Lesson 2's `sharding` with AdamW: the whole state on every device (ZeRO stage 0)."""
    return r18.sharding(net, optimizer, world)


def fsdp(net, optimizer, world):
    """One jax.jit program over a Mesh: the parameters and AdamW's moments split on 'data'
    (`_layout`), each batch too; XLA gathers the weights for the forward and backward and
    leaves each device the shard of the gradients its shard of the parameters needs."""
    n, mesh = len(world.devices), Mesh(np.array(world.devices), (AXIS,))
    specs = _layout(net, optimizer, mesh)
    layout = jax.tree.map(partial(NamedSharding, mesh), specs)
    replicated, batch = NamedSharding(mesh, P()), NamedSharding(mesh, P(AXIS))
    place, shard, correct, total = _around(net, mesh, specs)

    @partial(jax.jit, out_shardings=(layout, replicated), donate_argnums=0)
    def step(state, x, y, idx):
        x = lax.with_sharding_constraint(x[idx], batch)
        loss, grads, stats = r18.gradients(net, state, x, y[idx], shares=n)
        grads = lax.with_sharding_constraint(grads, layout["params"])  # split as the parameters
        return r18.apply_gradients(optimizer, state, grads, stats), loss * len(idx)

    return place, shard, step, correct, total


def fsdp_explicit(net, optimizer, world, *, bucketed=True):
    """jax.shard_map over the same Mesh and layout: each device all-gathers the parameters,
    differentiates its share of the batch, psum_scatters the gradients and divides by N (its
    shard of their average), and steps AdamW on its own shards of the state. `bucketed`: each
    collective on one flat buffer of every array (`_gather`, `_scatter`)."""
    n, mesh = len(world.devices), Mesh(np.array(world.devices), (AXIS,))
    specs = _layout(net, optimizer, mesh)
    axes = jax.tree.map(
        lambda s: s.index(AXIS) if AXIS in s else None,
        specs["params"],
        is_leaf=lambda s: isinstance(s, P),
    )
    place, shard, correct, total = _around(net, mesh, specs)

    @partial(jax.jit, donate_argnums=0)
    @partial(jax.shard_map, mesh=mesh, in_specs=(specs, P(), P(), P(AXIS)), out_specs=(specs, P()))
    def step(state, x, y, rows):
        params = _gather(state["params"], axes, bucketed)  # all_gather: the whole weights
        own = dict(state, batch_stats=jax.tree.map(lambda a: a[0], state["batch_stats"]))
        loss, grads, stats = r18.gradients(net, own, x[rows], y[rows], params)
        grads = jax.tree.map(lambda g: g / n, _scatter(grads, axes, n, bucketed))  # psum_scatter
        stats = jax.tree.map(lambda a: a[None], stats)  # its row of the running statistics
        state = r18.apply_gradients(optimizer, state, grads, stats)  # AdamW on its own shards
        return state, lax.psum(loss, AXIS) * len(rows)

    return place, shard, step, correct, total


def train(net, cfg, ds, strategy, run):
    """Lesson 2's train loop with AdamW: `strategy` spreads each step over the devices; `run`
    (common.harness.Run) times, logs and records it. Returns the last state and the step's
    compiled program (what the record measures)."""
    optimizer = make_optimizer(cfg)
    place, shard, step, correct, total = strategy(net, optimizer, run.world)
    x_train, y_train, x_test, y_test = place(data.as_float(ds, np.int32, channels_last=True))
    variables = r18.init_weights(net, cfg.init_std, cfg.seed)
    initial = dict(variables, opt_state=optimizer.init(variables["params"]))
    initial = jax.tree.map(np.asarray, initial)  # on the host: a donated copy cannot alias it
    state, compiled = place(initial), None  # the full batch's step: what the record measures

    def newest():  # JAX has no device-wide barrier: the clock waits for the newest state
        return jdev.sync(state)

    for part in run.warm_up(shard, sync=newest):  # compiles each batch shape
        if compiled is None:
            compiled = step.lower(state, x_train, y_train, part).compile()
        state, _ = step(state, x_train, y_train, part)
    state = place(initial)  # the epochs start from a fresh copy
    for parts in run.epochs(shard):  # iterating `parts` is the timed epoch
        losses = []
        for part in parts:
            state, loss = step(state, x_train, y_train, part)
            losses.append(loss)
        hits = [correct(state, x_test, y_test, idx) for idx in run.test_batches()]
        run.log(*total(losses, hits))
    return state, compiled


def main(args, plan, cfg, hooks):
    """Check everything, join the world (jax_impl/launch.py), train, and record each device's
    state bytes, the step's peak and its collectives (process 0 records)."""
    strategy = training.choose_strategy("zero", FRAMEWORK, args.strategy, STRATEGIES)
    world = launch.join(plan, args)
    cfg = config.for_devices(cfg, world.plan.count)  # N times the batch and the lr, as lesson 2
    config.check_epoch_split(data.train_size(cfg.train_subset), cfg.batch_size, world.plan.count)
    ds = data.load_subsets(cfg.train_subset, cfg.test_subset, cfg.seed)
    net = r18.resnet18()
    chosen = dict(sharding=sharding, fsdp=fsdp, fsdp_explicit=fsdp_explicit)[strategy]
    if getattr(args, "unbucketed", False):
        chosen = partial(fsdp_explicit, bucketed=False)
    run = harness.Run(args, cfg, ds, world, hooks=hooks)
    with run.sampling(utilization.sampler_for(plan.platform, world.plan.count)):
        state, compiled = train(net, cfg, ds, chosen, run)
    usage = jdev.with_allocator_peaks(run.usage(), world)
    run.save(strategy, {**usage, **_record(net, state, compiled, world, strategy)})


def _record(net, state, compiled, world, strategy) -> dict:
    """Lesson 4's fields (common/training.py's contract): state bytes, peak, collectives."""
    m = compiled.memory_analysis()
    peak = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
    peak -= m.alias_size_in_bytes
    return {
        "optimizer": "adamw",
        "zero_stage": STAGE[strategy],
        "state_on": "devices",
        "parameters": sum(int(np.prod(a.shape)) for a in jax.tree.leaves(state["params"])),
        "state_bytes": state_bytes(state, world),
        "peak_bytes": {
            "bytes": [int(peak)] * world.plan.count,
            "source": "XLA memory_analysis",
            "includes": "one device's program of the training step: its arguments (the "
            "Fashion-MNIST arrays whole, the state's shards, the batch's indices) plus outputs "
            "plus temporaries (activations, gathered weights, gradients) less the donated "
            "state's aliased bytes; not JAX's runtime",
        },
        "step_collectives": step_collectives(compiled),
        "collectives_source": "the compiled step's optimized HLO (compiled.as_text()): its "
        "all-gather, all-reduce, reduce-scatter and collective-permute ops, each operand one",
    }
