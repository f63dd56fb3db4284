"""d2l 13.5, multiple GPUs from scratch, in MXNet: LeNet on Fashion-MNIST, data parallel by hand.

Parameters are replicated to every device, each batch is split over the devices, every device
runs its own forward/backward, a hand-written allreduce sums the gradients, and every device
applies the same SGD step. Side by side with torch_impl/lenet.py and jax_impl/lenet.py.
"""

import numpy as np
from mxnet import autograd, gluon, nd

from common import config, data, harness, training, weights
from common.world import World
from mxnet_impl import devices as mdev

FRAMEWORK, STRATEGY = "mxnet", "scratch"
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
    return {k: nd.array(v) for k, v in weights.init_normal(SHAPES, std, seed).items()}


def lenet(X, params):
    def conv(x, name):
        w, b = params[f"{name}.weight"], params[f"{name}.bias"]
        return nd.Convolution(x, w, b, kernel=w.shape[2:], num_filter=w.shape[0])

    def avg_pool(x):
        return nd.Pooling(x, pool_type="avg", kernel=(2, 2), stride=(2, 2))

    def relu(x):
        # Activation, not nd.relu: oneDNN's kernel, faster than MXNet's generic one, with the
        # same numbers (docs/design.md, traps).
        return nd.Activation(x, act_type="relu")

    h = avg_pool(relu(conv(X, "conv1")))
    h = avg_pool(relu(conv(h, "conv2")))
    h = h.reshape((h.shape[0], -1))  # NCHW flatten: 50 x 4 x 4 = 800
    h = relu(nd.FullyConnected(h, params["fc1.weight"], params["fc1.bias"], num_hidden=128))
    return nd.FullyConnected(h, params["fc2.weight"], params["fc2.bias"], num_hidden=10)


def loss_fn(y_hat, y):
    """Cross-entropy summed over the batch (the SGD step divides by the batch size)."""
    return -nd.pick(nd.log_softmax(y_hat), y).sum()


def get_params(params, device):
    new_params = {k: p.copyto(device) for k, p in params.items()}
    for p in new_params.values():
        p.attach_grad()
    return new_params


def allreduce(data):
    """Sum into device 0, then broadcast back, in place: the list's arrays are the gradients."""
    for i in range(1, len(data)):
        data[0][:] += data[i].copyto(data[0].context)
    for i in range(1, len(data)):
        data[i][:] = data[0].copyto(data[i].context)  # `data[i] = ...` would update only the list


def split_batch(X, y, devices):
    """Split a batch over the devices (uneven only for a short last test batch)."""
    assert X.shape[0] == y.shape[0]
    even = X.shape[0] % len(devices) == 0
    return (
        gluon.utils.split_and_load(X, devices, even_split=even),
        gluon.utils.split_and_load(y, devices, even_split=even),
    )


def train_batch(X, y, device_params, devices, lr):
    """One step on every device; returns the batch's summed loss (on device 0, not synced)."""
    X_shards, y_shards = split_batch(X, y, devices)
    with autograd.record():
        ls = [
            loss_fn(lenet(X_shard, params), y_shard)
            for X_shard, y_shard, params in zip(X_shards, y_shards, device_params, strict=True)
        ]
    for l in ls:
        l.backward()
    for name in device_params[0]:
        allreduce([params[name].grad for params in device_params])
    for params in device_params:  # every device: the same update with the full batch size
        for p in params.values():
            # In place, two ops, where `p[:] = p - lr * p.grad / n` takes four (multiply, divide,
            # subtract into a new array, copy back), each dispatched from Python.
            p -= lr / X.shape[0] * p.grad  # grad_req "write": the next backward overwrites
    return nd.add_n(*(l.as_in_context(devices[0]) for l in ls))


def evaluate(device_params, X, y, devices):
    """Correct predictions on the batch (X, y), split over the devices (an int)."""
    correct = 0
    X_shards, y_shards = split_batch(X, y, devices)
    for X_shard, y_shard, params in zip(X_shards, y_shards, device_params, strict=True):
        hits = nd.argmax(lenet(X_shard, params), axis=1) == y_shard
        correct += int(hits.sum().asscalar())  # float32 sum of 0/1: exact below 2**24
    return correct


def train(cfg, ds, run):
    """d2l's train(num_gpus, batch_size, lr) on preloaded arrays, on `run.world.devices`; `run`
    (common.harness.Run) times, logs and records it. Returns the device parameters."""
    devices = run.world.devices
    # MXNet's labels are floats (nd.pick takes float indices).
    X, y, X_test, y_test = mdev.to_device(data.as_float(ds, np.float32), devices[0])
    params = init_params(cfg.init_std, cfg.seed)
    device_params = [get_params(params, d) for d in devices]
    scratch = [get_params(params, d) for d in devices]  # the warm-up's throwaway copies

    def on_device(batches):  # the batches' indices in one copy (a copy per batch would wait)
        return mdev.one_copy(batches, X.context)

    # each batch shape once (first touch, memory pools); the clock waits for the engine
    for idx in run.warm_up(on_device, sync=mdev.sync):
        train_batch(X.take(idx), y.take(idx), scratch, devices, cfg.lr)
    for batches in run.epochs(on_device):  # iterating `batches` is the timed epoch
        losses = [
            train_batch(X.take(i), y.take(i), device_params, devices, cfg.lr) for i in batches
        ]
        hits = [evaluate(device_params, X_test[i], y_test[i], devices) for i in run.test_batches()]
        run.log(float(sum(losses).asscalar()), sum(hits))
    return device_params


def main(args, plan, cfg, hooks) -> None:
    training.choose_strategy("lenet", FRAMEWORK, args.strategy, (STRATEGY,))
    # Every batch is split evenly over the devices, the epoch's last (partial) one included.
    config.check_epoch_split(data.train_size(cfg.train_subset), cfg.batch_size, plan.count)
    devices = mdev.get_devices(plan)
    ds = data.load_subsets(cfg.train_subset, cfg.test_subset, cfg.seed)
    with harness.Run(args, cfg, ds, World.single(devices, plan), hooks=hooks) as run:
        train(cfg, ds, run)
    run.save(STRATEGY)
