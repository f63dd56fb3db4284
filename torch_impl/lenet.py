"""d2l 13.5, multiple GPUs from scratch, in PyTorch: LeNet on Fashion-MNIST, data parallel by hand.

Parameters are replicated to every device, each batch is split over the devices, every device
runs its own forward/backward, a hand-written allreduce sums the gradients, and every device
applies the same SGD step. Side by side with jax_impl/lenet.py and mxnet_impl/lenet.py.
"""

import numpy as np
import torch
import torch.nn.functional as F

from common import config, data, harness, training, weights
from common.world import World
from torch_impl import devices as tdev

FRAMEWORK, STRATEGY = "torch", "scratch"
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
    return {k: torch.from_numpy(v) for k, v in weights.init_normal(SHAPES, std, seed).items()}


def lenet(X, params):
    h = F.avg_pool2d(F.relu(F.conv2d(X, params["conv1.weight"], params["conv1.bias"])), 2)
    h = F.avg_pool2d(F.relu(F.conv2d(h, params["conv2.weight"], params["conv2.bias"])), 2)
    h = h.reshape(h.shape[0], -1)  # NCHW flatten: 50 x 4 x 4 = 800
    h = F.relu(h @ params["fc1.weight"].T + params["fc1.bias"])
    return h @ params["fc2.weight"].T + params["fc2.bias"]


def loss_fn(y_hat, y):
    """Cross-entropy summed over the batch (the SGD step divides by the batch size)."""
    return F.cross_entropy(y_hat, y, reduction="sum")


def get_params(params, device):
    # clone: virtual CPU devices are all the same torch device, where `.to` would share storage.
    return {k: p.detach().clone().to(device).requires_grad_() for k, p in params.items()}


def allreduce(data):
    """Sum into device 0, then broadcast back, in place: the list's tensors are the gradients."""
    for i in range(1, len(data)):
        data[0][:] += data[i].to(data[0].device)
    for i in range(1, len(data)):
        data[i][:] = data[0].to(data[i].device)  # `data[i] = ...` would update only the list


def split_batch(X, y, devices):
    """Split a batch over the devices (nn.parallel.scatter fails on CPU: chunk + .to instead).
    Training batches divide evenly; a short last test batch may give fewer chunks than devices."""
    assert X.shape[0] == y.shape[0]
    n = len(devices)
    return (
        [x.to(d) for x, d in zip(X.chunk(n), devices, strict=False)],
        [t.to(d) for t, d in zip(y.chunk(n), devices, strict=False)],
    )


def train_batch(X, y, device_params, devices, lr, model=lenet):
    """One step on every device; returns the batch's summed loss (on device 0, not synced).
    `model`: lenet, or lenet torch.compiled (--compile; JAX jits its per-device step)."""
    tdev.new_step()
    X_shards, y_shards = split_batch(X, y, devices)
    ls = [
        loss_fn(model(X_shard, params), y_shard)
        for X_shard, y_shard, params in zip(X_shards, y_shards, device_params, strict=True)
    ]
    for l in ls:
        l.backward()
    with torch.no_grad():
        for name in device_params[0]:
            allreduce([params[name].grad for params in device_params])
        for params in device_params:  # every device: the same update with the full batch size
            for p in params.values():  # d2l's sgd: p -= lr / batch size * grad, as one op
                p.add_(p.grad, alpha=-lr / X.shape[0])
                p.grad = None  # the next backward writes fresh gradients: no zeroing
    return sum(l.detach().to(devices[0]) for l in ls)


def evaluate(device_params, X, y, devices):
    """Correct predictions on the batch (X, y), split over the devices (an int)."""
    correct = 0
    with torch.no_grad():
        X_shards, y_shards = split_batch(X, y, devices)
        for X_shard, y_shard, params in zip(X_shards, y_shards, device_params, strict=False):
            correct += int((lenet(X_shard, params).argmax(dim=1) == y_shard).sum())
    return correct


def train(cfg, ds, run, model=lenet):
    """d2l's train(num_gpus, batch_size, lr) on preloaded arrays, on `run.world.devices`; `run`
    (common.harness.Run) times, logs and records it. `model`: lenet, or lenet torch.compiled
    (--compile), as JAX jits its per-device step. Returns the device parameters."""
    devices = run.world.devices
    X, y, X_test, y_test = tdev.to_device(data.as_float(ds, np.int64), devices[0])
    params = init_params(cfg.init_std, cfg.seed)
    device_params = [get_params(params, d) for d in devices]
    scratch = [get_params(params, d) for d in devices]  # the warm-up's throwaway copies

    def on_device(batches):  # the batches' indices in one copy (a copy per batch would wait)
        return tdev.one_copy(batches, X.device)

    # each batch shape once (first touch, compilation); the clock waits for the devices
    for idx in run.warm_up(on_device, sync=lambda: tdev.sync(devices)):
        train_batch(X[idx], y[idx], scratch, devices, cfg.lr, model)
    for batches in run.epochs(on_device):  # iterating `batches` is the timed epoch
        losses = [train_batch(X[i], y[i], device_params, devices, cfg.lr, model) for i in batches]
        hits = [evaluate(device_params, X_test[i], y_test[i], devices) for i in run.test_batches()]
        run.log(float(sum(losses)), sum(hits))
    return device_params


def main(args, plan, cfg, hooks) -> None:
    training.choose_strategy("lenet", FRAMEWORK, args.strategy, (STRATEGY,))
    # Every batch is split evenly over the devices, the epoch's last (partial) one included.
    config.check_epoch_split(data.train_size(cfg.train_subset), cfg.batch_size, plan.count)
    devices = tdev.get_devices(plan)
    ds = data.load_subsets(cfg.train_subset, cfg.test_subset, cfg.seed)
    model, calls = lenet, 1
    if args.compile:  # compiled (and CUDA graphs captured) in the warm-up, never in an epoch
        model, calls = tdev.compile_function(lenet, devices[0], len(devices))
    with harness.Run(args, cfg, ds, World.single(devices, plan), hooks=hooks, calls=calls) as run:
        train(cfg, ds, run, model)
    extra = tdev.compile_fields(args.compile, devices[0], len(devices))  # mode, graphs left out
    run.save(STRATEGY, extra)
