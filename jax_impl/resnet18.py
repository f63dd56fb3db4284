"""ResNet-18 on Fashion-MNIST, concise data parallel in JAX (d2l 13.6), flax linen + optax.

Strategies (`--strategy`), each one function of (net, optimizer, world) that returns (place,
shard, step, correct, total) (common/training.py, "A strategy"):
  sharding (default)  one `jax.jit` program over a Mesh, the batch sharded on 'data'; XLA inserts
                      the gradient all-reduce. Also over several processes (hosts): launch.py.
  shard_map           `jax.shard_map` over the same Mesh: per-device code with explicit
                      collectives (d2l's hand-written allreduce), `lax.pmean` of the gradients
                      in one flat buffer (`_bucket`; --unbucketed: an operand per array).
  pmap                `jax.pmap`, the state copied to every device (a leading device axis),
                      `lax.pmean` of the gradients as shard_map's: the classic API.

BatchNorm: each device normalises its share of the batch (under `sharding` a row of a vmap named
'data') and keeps running statistics of its own (STATE: a row per device, never averaged), all
evaluating with device 0's, as DDP and Gluon (d2l 13.6). --sync-bn: the net's axis_name 'data'.

Layout: flax's NHWC, the images transposed once (common.data), the weights at the exchange
format's boundary (jax_impl/weights.py).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from common import config, data, harness, training, utilization, weights
from jax_impl import devices as jdev
from jax_impl import launch
from jax_impl import weights as jweights

FRAMEWORK = "jax"
STRATEGIES = ("sharding", "shard_map", "pmap")
NUM_CLASSES = 10
AXIS = "data"
STATE = {"params": P(), "batch_stats": P(AXIS), "opt_state": P()}


class Residual(nn.Module):
    """d2l's residual block; `shortcut` is the 1x1 strided conv where the shape changes."""

    features: int
    strides: int = 1
    use_1x1conv: bool = False
    use_bn: bool = True
    axis_name: str | None = None  # 'data' (--sync-bn): BatchNorm's statistics pmean'd over it
    dtype: Any = jnp.float32  # compute dtype; parameters stay float32

    @nn.compact
    def __call__(self, x, train):
        conv = partial(nn.Conv, dtype=self.dtype)
        norm = partial(batch_norm, train, self.use_bn, self.axis_name, self.dtype)
        y = conv(self.features, (3, 3), self.strides, padding=1, name="conv1")(x)
        y = nn.relu(norm("bn1")(y))
        y = conv(self.features, (3, 3), padding=1, name="conv2")(y)
        y = norm("bn2")(y)
        if self.use_1x1conv:
            x = conv(self.features, (1, 1), self.strides, padding=0, name="shortcut")(x)
        return nn.relu(y + x)


def batch_norm(train, use_bn, axis_name, dtype, name):
    if not use_bn:
        return lambda y: y
    # torch's momentum 0.1 is flax's 0.9 (the old running value's weight); eps as torch's. flax's
    # one-pass variance E[x^2] - E[x]^2 keeps to the numerics rule (tools/jax_step.py).
    norm = partial(nn.BatchNorm, momentum=0.9, epsilon=1e-5, axis_name=axis_name, dtype=dtype)
    return norm(use_running_average=not train, name=name)


class ResNet18(nn.Module):
    """flax needs a Module class where torch and MXNet compose a Sequential in `resnet18`;
    submodule names `stem_conv`, `layer1_0` read as `stem.conv`, `layer1.0` in the weights."""

    num_classes: int = NUM_CLASSES
    width: int = 64
    use_bn: bool = True
    residuals: int = 2
    axis_name: str | None = None
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train=True):
        x = nn.Conv(self.width, (3, 3), 1, padding=1, dtype=self.dtype, name="stem_conv")(x)
        x = nn.relu(batch_norm(train, self.use_bn, self.axis_name, self.dtype, "stem_bn")(x))
        block = partial(Residual, use_bn=self.use_bn, axis_name=self.axis_name, dtype=self.dtype)
        for i, mult in enumerate((1, 2, 4, 8), start=1):
            c = self.width * mult
            x = block(c, 1 if i == 1 else 2, i > 1, name=f"layer{i}_0")(x, train)
            for j in range(1, self.residuals):
                x = block(c, name=f"layer{i}_{j}")(x, train)
        x = jnp.mean(x, axis=(1, 2))  # global average pool
        x = nn.Dense(self.num_classes, dtype=self.dtype, name="fc")(x)
        return x.astype(jnp.promote_types(x.dtype, jnp.float32))  # bf16 logits: a float32 loss


def resnet18(num_classes=NUM_CLASSES, in_channels=1, width=64, use_bn=True, residuals=2, **kw):
    """d2l's ResNet-18 (see torch_impl); `in_channels` is inferred by flax at init.
    JAX-only keywords: `axis_name` (--sync-bn's BatchNorm) and `dtype` (bf16 compute)."""
    return ResNet18(num_classes, width, use_bn, residuals, **kw)


def weight_shapes(net):
    """Names and shapes in the exchange format (parameters and BN running statistics)."""
    return jweights.shapes(_abstract_variables(net))


def get_weights(variables):
    return jweights.get_weights(variables)


def set_weights(variables, params):
    """JAX is functional: returns new variables (torch and MXNet load in place)."""
    return jweights.set_weights(variables, params)


def init_weights(net, std, seed):
    """Variables {'params', 'batch_stats'} from the shared seeded init (common.weights)."""
    variables = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), _abstract_variables(net))
    variables = {"params": variables["params"], "batch_stats": variables.get("batch_stats", {})}
    return set_weights(variables, weights.init_normal(weight_shapes(net), std, seed))


def _abstract_variables(net):
    x = jnp.zeros((1, 8, 8, 1))
    return jax.eval_shape(partial(net.init, train=False), jax.random.key(0), x)


def make_optimizer(lr):
    return optax.sgd(lr)  # plain SGD (d2l); optax keeps the rule apart from the parameters


def loss_fn(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def gradients(net, state, x, y, params=None, shares=None):
    """(mean loss, its gradients at `params`, the BatchNorm statistics the batch leaves) on a
    batch; `params`: the state's by default (shard_map passes each device's own copy). `shares`:
    that many parts, each a row of a vmap named 'data' with its own row of statistics (STATE)."""

    def forward(params, x, stats=state["batch_stats"]):
        variables = {"params": params, "batch_stats": stats}
        logits, new = net.apply(variables, x, train=True, mutable=["batch_stats"])
        return logits, new.get("batch_stats", stats)

    def loss_of(params):
        if shares is None:
            logits, stats = forward(params, x)
        else:  # the shares' logits in batch order, each share's statistics its own row
            rows = jax.vmap(forward, (None, 0, 0), axis_name=AXIS)
            logits, stats = rows(params, x.reshape(shares, -1, *x.shape[1:]), state["batch_stats"])
            logits = logits.reshape(len(x), -1)
        return loss_fn(logits, y), stats

    at = state["params"] if params is None else params
    (loss, batch_stats), grads = jax.value_and_grad(loss_of, has_aux=True)(at)
    return loss, grads, batch_stats


def apply_gradients(optimizer, state, grads, batch_stats):
    """The state after an SGD step with `grads` (JAX passes params, batch_stats, opt_state)."""
    updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    return {"params": params, "batch_stats": batch_stats, "opt_state": opt_state}


def train_step(net, optimizer, state, x, y):
    """One SGD step; returns the new state and its mean loss (not synced)."""
    loss, grads, batch_stats = gradients(net, state, x, y)
    return apply_gradients(optimizer, state, grads, batch_stats), loss


def evaluate(net, state, x, y, mask=True):
    """Correct predictions (not synced) with device 0's statistics (STATE's row 0); `mask`: pads."""
    stats = jax.tree.map(lambda a: a[0], state["batch_stats"])
    pred = net.apply({"params": state["params"], "batch_stats": stats}, x, train=False)
    return jnp.sum((pred.argmax(axis=-1) == y) & mask)


def _bucket(tree, bucketed=True):
    """(one flat buffer of `tree`'s arrays, what unpacks it), DDP's bucket: XLA:CPU reduces each
    operand of an all-reduce by itself. `bucketed` False (--unbucketed): the arrays as they are."""
    return ravel_pytree(tree) if bucketed else (tree, lambda t: t)


def _on_mesh(arrays, mesh):  # the data set whole on every device of `mesh`, the state as STATE
    if not isinstance(arrays, dict):
        return jax.device_put(arrays, NamedSharding(mesh, P()))
    rows = jax.tree.map(lambda a: np.broadcast_to(a, (mesh.size, *a.shape)), arrays["batch_stats"])
    layout = jax.tree.map(partial(NamedSharding, mesh), STATE)
    return jax.device_put(dict(arrays, batch_stats=rows), layout)


# --- the parallelism: one function per strategy ------------------------------------------------


def pmap(net, optimizer, world, *, bucketed=True):
    """jax.pmap, in one process: the state and data copied to every device, a row of each batch."""
    devices, n = world.devices, len(world.devices)
    stacked = NamedSharding(Mesh(np.array(devices), (AXIS,)), P(AXIS))  # row i on device i

    def place(arrays):  # a copy for each device, stacked
        copies = jax.tree.map(lambda a: np.broadcast_to(a, (n, *np.shape(a))), arrays)
        return jax.device_put(copies, stacked)

    def shard(batches):  # each batch's (N, B/N) rows, one per device
        return (jax.device_put(data.shard_batch(i, n).astype(np.int32), stacked) for i in batches)

    @partial(jax.pmap, axis_name=AXIS, devices=devices, donate_argnums=0)
    def step(state, x, y, rows):
        loss, grads, stats = gradients(net, state, x[rows], y[rows])
        flat, unravel = _bucket((grads, loss), bucketed)
        grads, loss = unravel(lax.pmean(flat, AXIS))  # every device's, averaged
        return apply_gradients(optimizer, state, grads, stats), loss * len(rows) * n

    @partial(jax.pmap, axis_name=AXIS, devices=devices)
    def count(state, x, y, rows, mask):  # every device's statistics gathered: STATE's rows
        stats = jax.tree.map(partial(lax.all_gather, axis_name=AXIS), state["batch_stats"])
        return lax.psum(evaluate(net, dict(state, batch_stats=stats), x[rows], y[rows], mask), AXIS)

    def correct(state, x, y, idx):  # the test batch padded to one size: one compilation
        padded = [data.shard_batch(a, n) for a in jdev.padded(idx, harness.TEST_BATCH * n)]
        return count(state, x, y, *jax.device_put(padded, stacked))

    def total(losses, hits):  # every device holds the same sums: device 0's
        return sum(float(loss[0]) for loss in losses), sum(float(hit[0]) for hit in hits)

    return place, shard, step, correct, total


def shard_map(net, optimizer, world, *, bucketed=True):
    """jax.shard_map over a Mesh, each batch split on 'data': each device differentiates its own
    copy of the weights (the replicated ones' gradient is their sum already) and pmeans it."""
    n, mesh = len(world.devices), Mesh(np.array(world.devices), (AXIS,))
    batch = NamedSharding(mesh, P(AXIS))

    def place(arrays):  # every device holds the whole data set and state, its own statistics
        return _on_mesh(arrays, mesh)

    def shard(batches):  # each batch whole: `batch` gives device k its k-th block of rows
        return (jax.device_put(np.asarray(idx, np.int32), batch) for idx in batches)

    @partial(jax.jit, donate_argnums=0)
    @partial(jax.shard_map, mesh=mesh, in_specs=(STATE, P(), P(), P(AXIS)), out_specs=(STATE, P()))
    def step(state, x, y, rows):
        mine = lax.pcast(state["params"], AXIS, to="varying")  # this device's own copy
        own = dict(state, batch_stats=jax.tree.map(lambda a: a[0], state["batch_stats"]))
        loss, grads, stats = gradients(net, own, x[rows], y[rows], mine)
        flat, unravel = _bucket((grads, loss), bucketed)
        grads, loss = unravel(lax.pmean(flat, AXIS))  # every device's, averaged
        stats = jax.tree.map(lambda a: a[None], stats)  # its block: one row of STATE's, its own
        return apply_gradients(optimizer, state, grads, stats), loss * len(rows) * n

    count = jax.jit(lambda state, x, y, idx, mask: evaluate(net, state, x[idx], y[idx], mask))

    def correct(state, x, y, idx):  # the test batch padded to one size: one compilation
        return count(state, x, y, *jax.device_put(jdev.padded(idx, harness.TEST_BATCH * n), batch))

    def total(losses, hits):  # the sums over the devices are inside the programs
        return sum(map(float, losses)), sum(map(float, hits))

    return place, shard, step, correct, total


def sharding(net, optimizer, world):
    """One jax.jit program over a Mesh of every process's devices, the state as STATE, each batch
    sharded on 'data', a share per device (`gradients`' vmap); XLA all-reduces the gradients."""
    n, mesh = len(world.devices), Mesh(np.array(world.devices), (AXIS,))
    replicated, batch = NamedSharding(mesh, P()), NamedSharding(mesh, P(AXIS))
    layout = jax.tree.map(partial(NamedSharding, mesh), STATE)  # the state, as `place` puts it

    def place(arrays):  # every device holds the whole data set and state, its own statistics
        return _on_mesh(arrays, mesh)

    def shard(batches):  # each batch whole: `batch` gives device k its k-th block of rows
        return (jax.device_put(np.asarray(idx, np.int32), batch) for idx in batches)

    @partial(jax.jit, out_shardings=(layout, replicated), donate_argnums=0)
    def step(state, x, y, idx):
        x = lax.with_sharding_constraint(x[idx], batch)
        loss, grads, stats = gradients(net, state, x, y[idx], shares=n)
        return apply_gradients(optimizer, state, grads, stats), loss * len(idx)

    count = jax.jit(lambda state, x, y, idx, mask: evaluate(net, state, x[idx], y[idx], mask))

    def correct(state, x, y, idx):  # the test batch padded to one size: one compilation
        return count(state, x, y, *jax.device_put(jdev.padded(idx, harness.TEST_BATCH * n), batch))

    def total(losses, hits):  # the programs sum over every device, every process's: no world.sum
        return sum(map(float, losses)), sum(map(float, hits))

    return place, shard, step, correct, total


def train(net, cfg, ds, strategy, run):
    """d2l's train loop on preloaded arrays: `strategy` (one of the functions above) spreads each
    step over the devices; `run` (common.harness.Run) times, logs and records it."""
    optimizer = make_optimizer(cfg.lr)
    place, shard, step, correct, total = strategy(net, optimizer, run.world)
    x_train, y_train, x_test, y_test = place(data.as_float(ds, np.int32, channels_last=True))
    variables = init_weights(net, cfg.init_std, cfg.seed)
    initial = dict(variables, opt_state=optimizer.init(variables["params"]))
    initial = jax.tree.map(np.asarray, initial)  # on the host: a donated copy cannot alias it
    state = place(initial)

    def newest():  # JAX has no device-wide barrier: the clock waits for the newest state
        return jdev.sync(state)

    for part in run.warm_up(shard, sync=newest):  # each batch shape once (compilation)
        state, _ = step(state, x_train, y_train, part)
    state = place(initial)  # JAX passes state in and out: the epochs start from a fresh copy
    for parts in run.epochs(shard):  # iterating `parts` is the timed epoch
        losses = []
        for part in parts:
            state, loss = step(state, x_train, y_train, part)
            losses.append(loss)
        hits = [correct(state, x_test, y_test, idx) for idx in run.test_batches()]
        run.log(*total(losses, hits))


def main(args, plan, cfg, hooks):
    """Check everything, join the world (jax_impl/launch.py), train and record (process 0)."""
    strategy = training.choose_strategy("resnet18", FRAMEWORK, args.strategy, STRATEGIES)
    world = launch.join(plan, args)  # several processes: every process's devices
    # d2l 13.6: N devices train with N times the batch and the lr (2 devices: 512 and 0.2).
    cfg = config.for_devices(cfg, world.plan.count)
    if cfg.image_size != 28:
        raise config.ConfigError("resnet18 trains on Fashion-MNIST at its native 28x28")
    # Every batch, the epoch's last included, splits evenly (before JAX's IndivisibleError).
    config.check_epoch_split(data.train_size(cfg.train_subset), cfg.batch_size, world.plan.count)
    ds = data.load_subsets(cfg.train_subset, cfg.test_subset, cfg.seed)
    dtype = jnp.bfloat16 if args.amp == "bf16" else jnp.float32  # JAX's bf16: the model's dtype
    net = resnet18(axis_name=AXIS if args.sync_bn else None, dtype=dtype)
    run = harness.Run(args, cfg, ds, world, hooks=hooks)
    with run.sampling(utilization.sampler_for(plan.platform, world.plan.count)):
        chosen = dict(sharding=sharding, shard_map=shard_map, pmap=pmap)[strategy]
        train(net, cfg, ds, partial(chosen, bucketed=False) if args.unbucketed else chosen, run)
    usage = jdev.with_allocator_peaks(run.usage(), world)  # a GPU's: this process's devices'
    run.save(strategy, {**usage, "processes": world.size})
