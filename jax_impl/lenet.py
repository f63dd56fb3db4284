"""d2l 13.5, multiple GPUs from scratch, in JAX: LeNet on Fashion-MNIST, data parallel by hand.

Parameters are replicated to every device, each batch is split over the devices, every device
runs its own forward/backward, a hand-written allreduce sums the gradients, and every device
applies the same SGD step. Side by side with torch_impl/lenet.py and mxnet_impl/lenet.py.
No pmap, no psum, no sharding: only device_put and jitted per-device functions.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from common import config, data, harness, training, weights
from common.world import World
from jax_impl import devices as jdev

FRAMEWORK, STRATEGY = "jax", "scratch"
SHAPES = {
    "conv1.weight": (20, 1, 3, 3),
    "conv1.bias": (20,),
    "conv2.weight": (50, 20, 5, 5),
    "conv2.bias": (50,),
    "fc1.weight": (128, 800),
    "fc1.bias": (128,),
    "fc2.weight": (10, 128),
    "fc2.bias": (10,),
}


def init_params(std, seed):
    """Weights normal(0, std), biases 0: the same numbers in every framework (common.weights)."""
    return {k: jnp.asarray(v) for k, v in weights.init_normal(SHAPES, std, seed).items()}


def lenet(X, params):
    # Images NHWC inside, XLA's own layout (flax's too): with NCHW, XLA:CPU wraps each conv in
    # transposes, several times slower. The kernels stay OIHW (the shared weight format), the
    # images arrive NCHW, and the features go back to NCHW before the flatten, so the 800-vector
    # has torch's and MXNet's order.
    def conv(x, name):
        dims = ("NHWC", "OIHW", "NHWC")
        w = params[f"{name}.weight"]
        y = lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=dims)
        return y + params[f"{name}.bias"]

    def avg_pool(x):
        return lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4

    h = avg_pool(jax.nn.relu(conv(X.transpose(0, 2, 3, 1), "conv1")))
    h = avg_pool(jax.nn.relu(conv(h, "conv2")))
    h = h.transpose(0, 3, 1, 2).reshape(h.shape[0], -1)  # NCHW flatten: 50 x 4 x 4 = 800
    h = jax.nn.relu(h @ params["fc1.weight"].T + params["fc1.bias"])
    return h @ params["fc2.weight"].T + params["fc2.bias"]


def loss_fn(y_hat, y):
    """Cross-entropy summed over the batch (the SGD step divides by the batch size)."""
    return -jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(y_hat), y[:, None], axis=1))


# JAX compiles: the per-device pieces of train_batch and evaluate are jitted once (torch and MXNet
# run eagerly); each runs on the device where its (committed) arguments live. The small helpers
# are jitted too: each jnp operation outside jit is dispatched from Python on its own, and LeNet's
# step is small enough for that to show.
@jax.jit
def _loss_and_grads(params, X, y):
    """A shard's summed loss and its gradients, on the shard's device (torch: l.backward())."""
    return jax.value_and_grad(lambda p: loss_fn(lenet(X, p), y))(params)


@jax.jit
def _sgd(params, grads, lr, n):
    return jax.tree.map(lambda p, g: p - lr * g / n, params, grads)


@jax.jit
def _correct(params, X, y):
    return jnp.sum(jnp.argmax(lenet(X, params), axis=1) == y)


@jax.jit
def _add(a, b):  # a + b for arrays or pytrees (allreduce's sum, the epoch's loss total)
    return jax.tree.map(jnp.add, a, b)


@partial(jax.jit, static_argnums=2)
def _split(X, y, n):  # n slices each, cut on the batch's device
    return jnp.array_split(X, n), jnp.array_split(y, n)


@jax.jit
def _take(X, y, idx):  # the batch's rows: indexing with a NumPy index outside jit runs in Python
    return X[idx], y[idx]


def get_params(params, device):
    return {k: jax.device_put(p, device) for k, p in params.items()}


def allreduce(data):
    """Sum into device 0, then broadcast back. `data[i]` is device i's array or pytree (a step
    passes all its gradients at once: a parameter at a time cost a transfer and an add each,
    every one dispatched from Python). JAX arrays are immutable: where torch and MXNet write
    `data[i][:] = ...` in place, this returns the new list, one per device."""
    devs = [jax.tree.leaves(x)[0].device for x in data]
    total = data[0]
    for i in range(1, len(data)):
        total = _add(total, jax.device_put(data[i], devs[0]))
    return [total] + [jax.device_put(total, d) for d in devs[1:]]


def split_batch(X, y, devices):
    """Split a batch over the devices: slices (cut on the batch's device in one jitted call;
    outside jit, jnp.array_split dispatches a slice at a time), each transferred to its device."""
    assert X.shape[0] == y.shape[0]
    X_shards, y_shards = _split(X, y, len(devices))
    return jax.device_put(X_shards, devices), jax.device_put(y_shards, devices)


def train_batch(X, y, device_params, devices, lr):
    """One step on every device; returns the new device parameters (JAX passes state in and
    out) and the batch's summed loss (on device 0, not synced)."""
    X_shards, y_shards = split_batch(X, y, devices)
    outs = [
        _loss_and_grads(params, X_shard, y_shard)
        for X_shard, y_shard, params in zip(X_shards, y_shards, device_params, strict=True)
    ]
    # One allreduce for the whole step: the gradients, and the losses riding along with them
    # (summed apart, they would cost a device_put and an add per device, each from Python).
    summed = allreduce(outs)
    # every device: the same update with the full batch size
    device_params = [
        _sgd(params, grads, lr, X.shape[0])
        for params, (_, grads) in zip(device_params, summed, strict=True)
    ]
    return device_params, summed[0][0]


def evaluate(device_params, X, y, devices):
    """Correct predictions on the batch (X, y), split over the devices (an int). A short last
    test batch may leave a device an empty shard: it has nothing to count."""
    X_shards, y_shards = split_batch(X, y, devices)
    return sum(
        int(_correct(params, X_shard, y_shard))
        for X_shard, y_shard, params in zip(X_shards, y_shards, device_params, strict=True)
        if len(y_shard)
    )


def train(cfg, ds, run):
    """d2l's train(num_gpus, batch_size, lr) on preloaded arrays, on `run.world.devices`; `run`
    (common.harness.Run) times, logs and records it. Returns the device parameters."""
    devices = run.world.devices
    X, y, X_test, y_test = jax.device_put(data.as_float(ds, np.int32), devices[0])
    params = init_params(cfg.init_std, cfg.seed)
    device_params = [get_params(params, d) for d in devices]
    scratch = [get_params(params, d) for d in devices]  # the warm-up's throwaway copies
    total = jnp.zeros((), device=devices[0])  # the epoch's summed loss, on device 0

    def on_host(batches):  # the batches' indices as they are (NumPy): each _take copies its own
        return batches

    def newest():  # JAX has no device-wide barrier: the clock waits for the newest values
        return jdev.sync((scratch, device_params, total))

    for idx in run.warm_up(on_host, sync=newest):  # each batch shape once (compiling, first touch)
        scratch, loss = train_batch(*_take(X, y, idx), scratch, devices, cfg.lr)
        total = _add(total, loss)  # the epoch's sum compiles here too
    for batches in run.epochs(on_host):  # iterating `batches` is the timed epoch
        total = jnp.zeros((), device=devices[0])
        for idx in batches:
            device_params, loss = train_batch(*_take(X, y, idx), device_params, devices, cfg.lr)
            total = _add(total, loss)  # jitted, as `+=` is not
        hits = [evaluate(device_params, X_test[i], y_test[i], devices) for i in run.test_batches()]
        run.log(float(total), sum(hits))
    return device_params


def main(args, plan, cfg, hooks) -> None:
    training.choose_strategy("lenet", FRAMEWORK, args.strategy, (STRATEGY,))
    # Every batch is split evenly over the devices, the epoch's last (partial) one included.
    config.check_epoch_split(data.train_size(cfg.train_subset), cfg.batch_size, plan.count)
    devices = jdev.get_devices(plan)
    ds = data.load_subsets(cfg.train_subset, cfg.test_subset, cfg.seed)
    with harness.Run(args, cfg, ds, World.single(devices, plan), hooks=hooks) as run:
        train(cfg, ds, run)
    run.save(STRATEGY)
