"""ResNet-18 on Fashion-MNIST, concise data parallel in JAX (d2l 13.6), flax linen + optax.

Strategies (`--strategy`):
  sharding (default)  one `jax.jit` program over a Mesh: the batch is sharded on the 'data' axis
                      (NamedSharding P('data')), parameters and optimizer state are replicated
                      (P()); XLA inserts the gradient all-reduce.
  pmap                `jax.pmap` over the devices with `lax.pmean` of the gradients; the train
                      state is replicated (a leading device axis). pmap is in maintenance mode
                      since JAX 0.8; it is kept as the classic form of the same program.

BatchNorm: under `sharding` the model sees the global batch, so batch statistics are computed
over all devices' samples (XLA all-reduces them); under `pmap` BatchNorm gets
`axis_name='data'` and pmean-averages its statistics. Either way N devices compute what one
device computes on the whole batch (torch DDP and MXNet Gluon keep per-device statistics).

Several processes (hosts, or one process per GPU): with JAX_COORDINATOR_ADDRESS (host:port of
process 0), JAX_NUM_PROCESSES and JAX_PROCESS_ID set, `main` calls `jax.distributed.initialize`
and the `sharding` strategy runs one program over every process's devices (the global batch is
the same as on one machine; process 0 writes the record). Two processes on one machine:

  JAX_COORDINATOR_ADDRESS=127.0.0.1:29600 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=R \
      python -m jax_impl --workload resnet18 --gpus 1 --platform cpu   # R = 0 and 1
Layout: flax is NHWC with HWIO kernels and (in, out) dense weights; images arrive NCHW from
common.data and are transposed once at the boundary, weights at the exchange-format boundary.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from common import (
    ceiling,
    cli,
    config,
    data,
    devices,
    processes,
    profiling,
    timing,
    training,
    utilization,
    weights,
)
from jax_impl import devices as jdev
from jax_impl import weights as jweights

FRAMEWORK = "jax"
STRATEGIES = ("sharding", "pmap")
NUM_CLASSES = 10
AXIS = "data"


class Residual(nn.Module):
    """d2l's residual block; `shortcut` is the 1x1 strided conv where the shape changes."""

    features: int
    strides: int = 1
    use_1x1conv: bool = False
    use_bn: bool = True
    axis_name: str | None = None  # 'data' under pmap: BatchNorm statistics pmean'd over devices
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
    # torch's momentum 0.1 is flax's 0.9 (weight of the old running value); eps as torch;
    # two-pass variance as torch (the fast E[x^2]-E[x]^2 loses float32 digits).
    return nn.BatchNorm(
        use_running_average=not train,
        momentum=0.9,
        epsilon=1e-5,
        use_fast_variance=False,
        axis_name=axis_name,
        dtype=dtype,
        name=name,
    )


class ResNet18(nn.Module):
    """flax needs a Module class where torch and MXNet compose a Sequential in `resnet18`;
    submodule names `stem_conv`, `layer1_0` read as `stem.conv`, `layer1.0` in the weights."""

    num_classes: int = NUM_CLASSES
    width: int = 64
    use_bn: bool = True
    axis_name: str | None = None
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train=True):
        x = nn.Conv(self.width, (3, 3), 1, padding=1, dtype=self.dtype, name="stem_conv")(x)
        x = nn.relu(batch_norm(train, self.use_bn, self.axis_name, self.dtype, "stem_bn")(x))
        block = partial(Residual, use_bn=self.use_bn, axis_name=self.axis_name, dtype=self.dtype)
        for i, mult in enumerate((1, 2, 4, 8), start=1):
            first = i == 1
            c = self.width * mult
            x = block(c, 1 if first else 2, not first, name=f"layer{i}_0")(x, train)
            x = block(c, name=f"layer{i}_1")(x, train)
        x = jnp.mean(x, axis=(1, 2))  # global average pool
        x = nn.Dense(self.num_classes, dtype=self.dtype, name="fc")(x)
        return x.astype(jnp.promote_types(x.dtype, jnp.float32))  # bf16 logits: a float32 loss


def resnet18(num_classes=NUM_CLASSES, in_channels=1, width=64, use_bn=True, **kw):
    """d2l's ResNet-18 (see torch_impl); `in_channels` is inferred by flax at init.
    JAX-only keywords: `axis_name` (pmap BatchNorm) and `dtype` (bf16 compute)."""
    return ResNet18(num_classes, width, use_bn, **kw)


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
    variables = jax.tree_util.tree_map(
        lambda s: np.zeros(s.shape, s.dtype), _abstract_variables(net)
    )
    variables = {"params": variables["params"], "batch_stats": variables.get("batch_stats", {})}
    return set_weights(variables, weights.init_normal(weight_shapes(net), std, seed))


def _abstract_variables(net):
    """The variables' shapes and dtypes, without running the network (eval_shape)."""
    x = jnp.zeros((1, 8, 8, 1))
    return jax.eval_shape(partial(net.init, train=False), jax.random.key(0), x)


def make_optimizer(lr):
    # optax builds the update rule apart from the parameters (torch and Gluon bind them).
    return optax.sgd(lr)  # plain SGD, no momentum (d2l)


def loss_fn(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def train_step(net, optimizer, state, x, y, axis_name=None):
    """One SGD step; JAX passes the state (params, batch_stats, opt_state) in and out."""

    def loss_of(params):
        variables = {"params": params, "batch_stats": state["batch_stats"]}
        logits, new = net.apply(variables, x, train=True, mutable=["batch_stats"])
        return loss_fn(logits, y), new.get("batch_stats", state["batch_stats"])

    (loss, batch_stats), grads = jax.value_and_grad(loss_of, has_aux=True)(state["params"])
    if axis_name is not None:  # pmap: average per-device gradients (jit sharding needs none)
        grads, loss = lax.pmean((grads, loss), axis_name)
    updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    return {"params": params, "batch_stats": batch_stats, "opt_state": opt_state}, loss


def evaluate(net, state, x_all, y_all, idx, mask):
    """Correct predictions among the valid (`mask`) samples `idx` of the device-resident set."""
    variables = {"params": state["params"], "batch_stats": state["batch_stats"]}
    pred = net.apply(variables, x_all[idx], train=False).argmax(axis=-1)
    return jnp.sum((pred == y_all[idx]) & mask)


# --- the parallelism: one function per strategy ------------------------------------------------


def pmap(net, optimizer, devs):
    """pmap: state and data replicated per device, each device its (B/N) slice, pmean."""

    n = len(devs)
    stacked = NamedSharding(Mesh(np.array(devs), (AXIS,)), P(AXIS))  # leading axis: one per device

    def place(tree, sharded_batch=False):
        if sharded_batch:  # (N, B/N) rows, one per device
            return jax.device_put(tree, stacked)
        copies = jax.tree_util.tree_map(lambda a: np.broadcast_to(a, (n, *np.shape(a))), tree)
        return jax.device_put(copies, stacked)

    def step(state, x_all, y_all, idx):
        return train_step(net, optimizer, state, x_all[idx], y_all[idx], AXIS)

    def correct(state, x_all, y_all, idx, mask):
        return lax.psum(evaluate(net, state, x_all, y_all, idx, mask), AXIS)

    step = jax.pmap(step, AXIS, devices=devs, donate_argnums=0)
    return place, step, jax.pmap(correct, AXIS, devices=devs)


def sharding(net, optimizer, devs):
    """jit + Mesh: replicated state, batch sharded on 'data'. Returns (place, step, correct)."""
    mesh = Mesh(np.array(devs), (AXIS,))
    replicated, batch = NamedSharding(mesh, P()), NamedSharding(mesh, P(AXIS))

    def place(tree, sharded_batch=False):
        if sharded_batch:  # (N, B/N) indices -> one global batch of B split over 'data'
            return jax.device_put(tree.reshape(-1), batch)
        return jax.device_put(tree, replicated)

    def step(state, x_all, y_all, idx):
        x = lax.with_sharding_constraint(x_all[idx], batch)
        return train_step(net, optimizer, state, x, y_all[idx])

    def correct(state, x_all, y_all, idx, mask):
        return evaluate(net, state, x_all, y_all, idx, mask)

    step = jax.jit(step, out_shardings=(replicated, replicated), donate_argnums=0)
    return place, step, jax.jit(correct)


def train(net, cfg, ds, devs, strategy, sampler=None, no_progress=False, probe=None, trace=None):
    """d2l's train loop on preloaded, device-resident arrays. In several processes each runs
    this with its own devices; the program spans all of them. `probe`: --ceiling; `trace`:
    --profile's profiler around the first timed epoch."""
    n = len(devs)
    optimizer = make_optimizer(cfg.lr)
    place, step, correct = (sharding if strategy == "sharding" else pmap)(net, optimizer, devs)
    x_train, y_train, x_test, y_test = _to_device(ds, place)
    variables = init_weights(net, cfg.init_std, cfg.seed)
    initial = dict(variables, opt_state=optimizer.init(variables["params"]))
    # On the host: `place` must copy it (a donated device array could alias it otherwise).
    initial = jax.tree_util.tree_map(np.asarray, initial)
    sampler = sampler or utilization.Sampler("cpu_time")
    timer = timing.Timer(lambda: jdev.sync(state), warmup=1, trace=trace)
    first = data.batches(len(ds[1]), cfg.batch_size, cfg.seed, 0)
    quiet = jax.process_index() != 0
    log = training.EpochLog(cfg.epochs, len(first), quiet=quiet, ceiling=probe)
    # Warm-up apart from the epochs (compilation): one step of each batch shape the epochs will
    # use, on a throwaway copy of the initial state, so every epoch is timed whole.
    state = place(initial)
    with timer.region():
        for idx in data.warmup_batches(first[: cfg.steps_per_epoch]):
            rows = place(data.shard_batch(idx, n).astype(np.int32), True)
            state, _ = step(state, x_train, y_train, rows)
    state = place(initial)  # JAX passes state in and out: training starts from a fresh copy
    for epoch in range(cfg.epochs):
        steps = data.batches(len(ds[1]), cfg.batch_size, cfg.seed, epoch)[: cfg.steps_per_epoch]
        losses = []
        bar = cli.progress(range(len(steps)), len(steps), f"epoch {epoch + 1}", no_progress)
        with sampler.measure(), timer.region():
            for idx in steps:
                rows = place(data.shard_batch(idx, n).astype(np.int32), True)
                state, loss = step(state, x_train, y_train, rows)
                losses.append((loss, len(idx)))
                bar.update(1)
        bar.close()
        seen = sum(k for _, k in losses)
        mean_loss = sum(float(np.mean(l)) * k for l, k in losses) / seen
        acc = _accuracy(correct, state, x_test, y_test, len(ds[3]), n, place)
        log.add(mean_loss, acc, timer.times[-1], len(steps), seen)
        if log.diverged:  # a non-finite loss: stop, and record what was measured
            break
    return log, timer


def _to_device(ds, place):
    """(x_train, y_train, x_test, y_test) placed once; images NCHW -> NHWC (flax's layout)."""
    x_train, y_train, x_test, y_test = ds
    return (
        place(data.to_float(x_train).transpose(0, 2, 3, 1)),
        place(y_train.astype(np.int32)),
        place(data.to_float(x_test).transpose(0, 2, 3, 1)),
        place(y_test.astype(np.int32)),
    )


def _accuracy(correct, state, x_test, y_test, count, n, place):
    """Fixed-size eval batches (one compilation); the last is padded and masked."""
    size = 256 * n
    total = 0
    for i in range(0, count, size):
        idx = np.arange(i, i + size)
        mask = idx < count
        idx = np.where(mask, idx, 0)
        rows = place(data.shard_batch(idx.astype(np.int32), n), True)
        valid = place(data.shard_batch(mask, n), True)
        got = correct(state, x_test, y_test, rows, valid)
        total += int(np.asarray(got).reshape(-1)[0])
    return total / count


def distributed_init(strategy, plan):
    """Multi-process JAX when JAX_NUM_PROCESSES > 1: join the coordinator; the plan then counts
    every process's devices. Must run before anything touches a JAX backend. Bad JAX_* values
    are config errors; waiting for the others ends after JAX_INIT_TIMEOUT s (default 60)."""
    count = processes.env_int("JAX_NUM_PROCESSES", "1", 1)
    if count < 2:
        return plan, None
    if strategy != "sharding":
        raise config.ConfigError("several JAX processes need --strategy sharding (not pmap)")
    if "JAX_COORDINATOR_ADDRESS" not in os.environ or "JAX_PROCESS_ID" not in os.environ:
        raise config.ConfigError(
            "JAX_NUM_PROCESSES is set: also set JAX_COORDINATOR_ADDRESS and JAX_PROCESS_ID"
        )
    rank = processes.env_int("JAX_PROCESS_ID", None, 0)
    if rank >= count:
        raise config.ConfigError(
            f"JAX_PROCESS_ID={rank} of {count} processes: use 0 to {count - 1}"
        )
    address = os.environ["JAX_COORDINATOR_ADDRESS"]
    port = processes.port_of(address, "JAX_COORDINATOR_ADDRESS")
    if rank == 0:  # jax segfaults when its coordinator cannot bind the port
        processes.check_port_free(port, "JAX_COORDINATOR_ADDRESS")
    timeout = processes.env_int("JAX_INIT_TIMEOUT", "60", 1)
    # jax's own deadline aborts with a C++ stack dump: this one ends the wait first, in one line
    with processes.deadline(
        timeout, _not_joined(rank, count, address, timeout), cli.EXIT_BAD_INPUT
    ):
        jax.distributed.initialize(address, count, rank, initialization_timeout=timeout + 60)
    devs = jax.devices("gpu" if plan.platform == "gpu" else "cpu")  # every process's devices
    return devices.DevicePlan(len(devs), plan.platform, plan.virtual), devs


def _not_joined(rank, count, address, timeout):
    """What to do when the processes did not all meet in time, as seen from process `rank`."""
    if rank == 0:
        ids = "1" if count == 2 else f"1 to {count - 1}"
        what = f"process {ids} of {count} did not join within {timeout} s; start it"
    else:
        ids = f"0 (the coordinator) to {count - 1}"
        what = f"process {rank} of {count} waited {timeout} s for the others; start them"
    return (
        f"error: {what} with JAX_PROCESS_ID={ids}, JAX_NUM_PROCESSES={count} and "
        f"JAX_COORDINATOR_ADDRESS={address} (or raise JAX_INIT_TIMEOUT)"
    )


def main(args, plan, cfg):
    strategy = training.choose_strategy("resnet18", FRAMEWORK, args.strategy, STRATEGIES)
    plan, devs = distributed_init(strategy, plan)
    # d2l 13.6: N devices train with N times the batch and the lr (2 devices: 512 and 0.2).
    cfg = config.for_devices(cfg, plan.count)
    if cfg.image_size != 28:
        raise config.ConfigError("resnet18 trains on Fashion-MNIST at its native 28x28")
    # Every batch, the epoch's last included, splits evenly (before JAX's IndivisibleError).
    config.check_epoch_split(data.train_size(cfg.train_subset), cfg.batch_size, plan.count)
    devs = devs or jdev.get_devices(plan)
    ds = data.load_subsets(cfg.train_subset, cfg.test_subset, cfg.seed)
    dtype = jnp.bfloat16 if args.amp == "bf16" else jnp.float32  # JAX's bf16: the model's dtype
    net = resnet18(axis_name=AXIS if strategy == "pmap" else None, dtype=dtype)
    with utilization.sampler_for(plan.platform, plan.count) as sampler:
        probe = ceiling.paired(FRAMEWORK, args, cfg, devs[0])  # --ceiling
        trace = profiling.tracer(FRAMEWORK, args, "epoch", jax.process_index())  # --profile
        log, timer = train(net, cfg, ds, devs, strategy, sampler, args.no_progress, probe, trace)
    usage = sampler.result()
    if plan.platform == "gpu":
        mine = [d for d in devs if d.process_index == jax.process_index()]
        peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use", 0) for d in mine]
        usage = utilization.with_allocator_peaks(usage, peaks, "jax peak_bytes_in_use")
    extra = {**usage, "amp": args.amp, "processes": jax.process_count()}
    rec = cli.make_record(
        FRAMEWORK, args, plan, cfg, jdev.device_names(devs), jdev.versions(), strategy=strategy,
        **log.record_fields(timer.warmup_seconds), extra=extra,
    )  # fmt: skip
    if jax.process_index() == 0:  # several processes: process 0 reports
        cli.save(rec, args.results, plan)
