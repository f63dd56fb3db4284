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

from common import cli, config, data, devices, results, timing, utilization, weights
from jax_impl import devices as jdev

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
        return x.astype(jnp.float32)


def resnet18(num_classes=NUM_CLASSES, in_channels=1, width=64, use_bn=True, **kw):
    """d2l's ResNet-18 (see torch_impl); `in_channels` is inferred by flax at init.
    JAX-only keywords: `axis_name` (pmap BatchNorm) and `dtype` (bf16 compute)."""
    return ResNet18(num_classes, width, use_bn, **kw)


_LEAF = {"kernel": "weight", "bias": "bias", "scale": "weight", "mean": "running_mean"}
_LEAF["var"] = "running_var"


def _flat(variables):
    """(dotted torch-style name, flax path, array) for every parameter and BN statistic."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(dict(variables))[0]:
        keys = [k.key for k in path]
        name = ".".join([k.replace("_", ".") for k in keys[1:-1]] + [_LEAF[keys[-1]]])
        yield name, tuple(keys), leaf


def _to_format(a):
    a = np.asarray(a, dtype=np.float32)
    return a.transpose(3, 2, 0, 1) if a.ndim == 4 else a.T if a.ndim == 2 else a  # HWIO->OIHW


def _from_format(a):
    a = np.asarray(a, dtype=np.float32)
    return a.transpose(2, 3, 1, 0) if a.ndim == 4 else a.T if a.ndim == 2 else a  # OIHW->HWIO


def weight_shapes(net):
    shapes = jax.eval_shape(
        partial(net.init, train=False), jax.random.key(0), jnp.zeros((1, 8, 8, 1))
    )
    return {name: _to_format(np.zeros(leaf.shape)).shape for name, _, leaf in _flat(shapes)}


def get_weights(variables):
    return {name: _to_format(leaf) for name, _, leaf in _flat(variables)}


def set_weights(variables, params):
    """JAX is functional: returns new variables (torch and MXNet load in place)."""
    weights.check_shapes(params, {n: _to_format(v).shape for n, _, v in _flat(variables)})
    out = jax.tree_util.tree_map(lambda v: v, dict(variables))
    for name, keys, _ in _flat(variables):
        node = out
        for k in keys[:-1]:
            node[k] = dict(node[k])
            node = node[k]
        node[keys[-1]] = jnp.asarray(_from_format(params[name]))
    return out


def init_weights(net, std, seed):
    """Variables {'params', 'batch_stats'} from the shared seeded init (common.weights)."""
    variables = jax.eval_shape(
        partial(net.init, train=False), jax.random.key(0), jnp.zeros((1, 8, 8, 1))
    )
    variables = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), variables)
    variables = {"params": variables["params"], "batch_stats": variables.get("batch_stats", {})}
    return set_weights(variables, weights.init_normal(weight_shapes(net), std, seed))


def make_optimizer(net, lr):
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


def shard_batch(idx, n_devices):
    """Batch indices per device: (N, B/N) rows; the batch must split evenly."""
    config.check_divisible(len(idx), n_devices)
    return np.asarray(idx, np.int32).reshape(n_devices, -1)


def sharding_parallel(net, optimizer, devs):
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


def pmap_parallel(net, optimizer, devs):
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


def train(net, cfg, ds, devs, strategy, sampler=None, no_progress=False):
    """d2l's train loop on preloaded, device-resident arrays."""
    n = len(devs)
    parallel = sharding_parallel if strategy == "sharding" else pmap_parallel
    optimizer = make_optimizer(net, cfg.lr)
    place, step, correct = parallel(net, optimizer, devs)
    x_train = place(data.to_float(ds[0]).transpose(0, 2, 3, 1))  # NCHW -> NHWC, once
    y_train = place(ds[1].astype(np.int32))
    x_test = place(data.to_float(ds[2]).transpose(0, 2, 3, 1))
    y_test = place(ds[3].astype(np.int32))
    variables = init_weights(net, cfg.init_std, cfg.seed)
    initial = dict(variables, opt_state=optimizer.init(variables["params"]))
    # On the host: `place` must copy it (a donated device array could alias it otherwise).
    initial = jax.tree_util.tree_map(np.asarray, initial)
    sampler = sampler or utilization.Sampler("cpu_time")
    timer = timing.Timer(lambda: jdev.sync(state), warmup=1)
    out = {"train_loss": [], "test_acc": [], "sec_per_epoch": [], "timed_steps": [], "images": 0}
    first = data.batches(len(ds[1]), cfg.batch_size, cfg.seed, 0)
    full_steps = len(first)
    # Warm-up apart from the epochs (compilation): one step of each batch shape the epochs will
    # use, on a throwaway copy of the initial state, so every epoch is timed whole.
    state = place(initial)
    with timer.region():
        for idx in data.warmup_batches(first[: cfg.steps_per_epoch]):
            state, _ = step(state, x_train, y_train, place(shard_batch(idx, n), True))
    state = place(initial)  # JAX passes state in and out: training starts from a fresh copy
    for epoch in range(cfg.epochs):
        steps = data.batches(len(ds[1]), cfg.batch_size, cfg.seed, epoch)[: cfg.steps_per_epoch]
        losses = []
        bar = cli.progress(range(len(steps)), len(steps), f"epoch {epoch + 1}", no_progress)
        with sampler.measure(), timer.region():
            for idx in steps:
                state, loss = step(state, x_train, y_train, place(shard_batch(idx, n), True))
                losses.append((loss, len(idx)))
                bar.update(1)
        bar.close()
        seen = sum(k for _, k in losses)
        out["train_loss"].append(sum(float(np.mean(l)) * k for l, k in losses) / seen)
        out["sec_per_epoch"].append(timer.times[-1] * full_steps / len(steps))
        out["timed_steps"].append(len(steps))
        out["images"] += seen
        out["test_acc"].append(accuracy(correct, state, x_test, y_test, len(ds[3]), n, place))
        if jax.process_index() == 0:
            print(
                f"epoch {epoch + 1}/{cfg.epochs}: train loss {out['train_loss'][-1]:.4f}, "
                f"test acc {out['test_acc'][-1]:.4f}, {out['sec_per_epoch'][-1]:.2f} s/epoch",
                flush=True,
            )
    out["full_steps"] = full_steps
    out["warmup_seconds"] = timer.warmup_seconds
    out["timed_seconds"] = sum(timer.times)
    return out


def accuracy(correct, state, x_test, y_test, count, n, place):
    """Fixed-size eval batches (one compilation); the last is padded and masked."""
    size = 256 * n
    total = 0
    for i in range(0, count, size):
        idx = np.arange(i, i + size)
        mask = idx < count
        idx = np.where(mask, idx, 0)
        rows, valid = place(shard_batch(idx, n), True), place(shard_batch(mask, n), True)
        got = correct(state, x_test, y_test, rows, valid)
        total += int(np.asarray(got).reshape(-1)[0])
    return total / count


def distributed_init(strategy, plan):
    """Multi-process JAX when JAX_NUM_PROCESSES > 1: join the coordinator; the plan then counts
    every process's devices. Must run before anything touches a JAX backend."""
    processes = int(os.environ.get("JAX_NUM_PROCESSES", "1"))
    if processes < 2:
        return plan, None
    if strategy != "sharding":
        raise config.ConfigError("several JAX processes need --strategy sharding (not pmap)")
    if "JAX_COORDINATOR_ADDRESS" not in os.environ or "JAX_PROCESS_ID" not in os.environ:
        raise config.ConfigError(
            "JAX_NUM_PROCESSES is set: also set JAX_COORDINATOR_ADDRESS and JAX_PROCESS_ID"
        )
    jax.distributed.initialize(
        os.environ["JAX_COORDINATOR_ADDRESS"],
        processes,
        int(os.environ["JAX_PROCESS_ID"]),
        initialization_timeout=120,
    )
    devs = jax.devices("gpu" if plan.platform == "gpu" else "cpu")  # every process's devices
    return devices.DevicePlan(len(devs), plan.platform, plan.virtual), devs


def main(args, plan):
    strategy = args.strategy or "sharding"
    if strategy not in STRATEGIES:
        raise config.ConfigError(
            f"unknown resnet18 strategy {strategy!r} for jax; choose one of {', '.join(STRATEGIES)}"
        )
    plan, devs = distributed_init(strategy, plan)
    cfg = config.for_devices(
        config.get_config(args.workload, args.preset, **cli.overrides(args)), plan.count
    )
    if cfg.image_size != 28:
        raise config.ConfigError("resnet18 trains on Fashion-MNIST at its native 28x28")
    # Every batch, the epoch's last included, splits evenly (before JAX's IndivisibleError).
    config.check_epoch_split(data.train_size(cfg.train_subset), cfg.batch_size, plan.count)
    devs = devs or jdev.get_devices(plan)
    ds = data.load()
    x_tr, y_tr = data.subset(ds.train_images, ds.train_labels, cfg.train_subset, cfg.seed)
    x_te, y_te = data.subset(ds.test_images, ds.test_labels, cfg.test_subset, cfg.seed)
    dtype = jnp.bfloat16 if args.amp == "bf16" else jnp.float32
    net = resnet18(axis_name=AXIS if strategy == "pmap" else None, dtype=dtype)
    gpu = plan.platform == "gpu"
    indices = utilization.visible_gpu_indices(plan.count) if gpu else []
    with utilization.Sampler("nvml" if gpu else "cpu_time", indices) as sampler:
        out = train(net, cfg, (x_tr, y_tr, x_te, y_te), devs, strategy, sampler, args.no_progress)
    stats = timing.summarize(out["sec_per_epoch"])
    extrapolated = any(k != out["full_steps"] for k in out["timed_steps"])
    usage = sampler.result()
    if gpu:
        mine = [d for d in devs if d.process_index == jax.process_index()]
        peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use", 0) for d in mine]
        usage = utilization.with_allocator_peaks(usage, peaks, "jax peak_bytes_in_use")
    rec = cli.make_record(
        "jax",
        args,
        plan,
        cfg,
        jdev.device_names(devs),
        jdev.versions(),
        strategy=strategy,
        epochs=cfg.epochs,
        sec_per_epoch=stats.to_dict(),
        warmup_seconds=out["warmup_seconds"],
        images_per_sec=out["images"] / out["timed_seconds"],
        test_acc=out["test_acc"][-1],
        test_acc_per_epoch=out["test_acc"],
        train_loss=out["train_loss"],
        extrapolated=extrapolated,
        steps_timed=out["timed_steps"][-1] if extrapolated else None,
        extra={**usage, "amp": args.amp, "processes": jax.process_count()},
    )
    if jax.process_index() != 0:  # several processes: process 0 reports
        return
    results.append(rec, args.results)
    print(f"{out['images'] / out['timed_seconds']:.1f} images/sec ({strategy})")
    print(cli.final_line(rec.test_acc, stats.median, plan, extrapolated), flush=True)
