"""d2l 13.5, multiple GPUs from scratch, in MXNet: LeNet on Fashion-MNIST, data parallel by hand.

Parameters are replicated to every device, each batch is split over the devices, every device
runs its own forward/backward, a hand-written allreduce sums the gradients, and every device
applies the same SGD step. Side by side with torch_impl/lenet.py and jax_impl/lenet.py.
"""

import numpy as np
from mxnet import autograd, gluon, nd

from common import ceiling, cli, config, data, profiling, timing, training, weights
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
        # Activation, not nd.relu: oneDNN's kernel, not MXNet's generic one (a step at batch
        # 256 on a 2-core AVX2 CPU: 148 against 157 ms, the same numbers).
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
            # In place, two ops; `p[:] = p - lr * p.grad / n` was four (multiply, divide,
            # subtract into a new array, copy back), each dispatched from Python.
            p -= lr / X.shape[0] * p.grad  # grad_req "write": the next backward overwrites
    return nd.add_n(*(l.as_in_context(devices[0]) for l in ls))


def evaluate(device_params, X, y, devices, batch_size):
    """Accuracy on (X, y), every batch split over the devices; the correct count is exact."""
    correct = 0
    for start in range(0, len(y), batch_size):
        X_shards, y_shards = split_batch(
            X[start : start + batch_size], y[start : start + batch_size], devices
        )
        for X_shard, y_shard, params in zip(X_shards, y_shards, device_params, strict=True):
            hits = nd.argmax(lenet(X_shard, params), axis=1) == y_shard
            correct += int(hits.sum().asscalar())  # float32 sum of 0/1: exact below 2**24
    return correct / len(y)


def train(cfg, devices, train_data, test_data, no_progress=False, probe=None, trace=None):
    """d2l's train(num_gpus, batch_size, lr). Returns the device parameters, EpochLog, timer.
    `probe`: --ceiling; `trace`: --profile's profiler around the first timed epoch."""
    X, y = train_data
    params = init_params(cfg.init_std, cfg.seed)
    device_params = [get_params(params, d) for d in devices]
    timer = timing.Timer(lambda: mdev.sync(devices), warmup=1, trace=trace)
    # Warm-up apart from the epochs (first touch, memory pools; compilation in JAX): one step
    # of each batch shape on throwaway copies, so training itself starts from the initial weights.
    order = data.batches(len(y), cfg.batch_size, cfg.seed, 0)
    with timer.region():
        scratch = [get_params(params, d) for d in devices]
        for idx in data.warmup_batches(order):
            idx = nd.array(idx, ctx=X.context, dtype="int64")
            train_batch(X.take(idx), y.take(idx), scratch, devices, cfg.lr)
    log = training.EpochLog(cfg.epochs, len(order), ceiling=probe)  # probe: --ceiling
    for epoch in range(cfg.epochs):
        batches = data.batches(len(y), cfg.batch_size, cfg.seed, epoch)
        total = nd.zeros((1,), ctx=devices[0])
        starts = range(0, len(y), cfg.batch_size)  # the batches, in order
        # The bar before the clock starts: its first call imports tqdm (50 ms on a CPU).
        bar = cli.progress(starts, len(batches), f"epoch {epoch + 1}", no_progress)
        with timer.region():
            # The epoch's order in one copy: a copy per batch (a synchronous copy from NumPy)
            # would stop the CPU from queueing the next batch while the GPU runs this one.
            order = nd.array(np.concatenate(batches), ctx=X.context, dtype="int64")
            for start in bar:
                idx = order[start : start + cfg.batch_size]
                total += train_batch(X.take(idx), y.take(idx), device_params, devices, cfg.lr)
        acc = evaluate(device_params, *test_data, devices, cfg.batch_size)
        log.add(float(total.asscalar()) / len(y), acc, timer.times[-1], len(batches), len(y))
        if log.diverged:  # a non-finite loss: stop, and record what was measured
            break
    return device_params, log, timer


def main(args, plan, cfg) -> None:
    training.choose_strategy("lenet", FRAMEWORK, args.strategy, (STRATEGY,))
    # Every batch is split evenly over the devices, the epoch's last (partial) one included.
    n_train = data.train_size(cfg.train_subset)
    config.check_epoch_split(n_train, cfg.batch_size, plan.count)
    devices = mdev.get_devices(plan)
    fm = data.load()
    # Loaded once, as arrays on device 0; batches are sliced from them.
    train_data, test_data = (
        (
            nd.array(data.to_float(images), ctx=devices[0]),
            nd.array(labels.astype(np.float32), ctx=devices[0]),  # MXNet's labels are floats
        )
        for images, labels in (
            data.subset(fm.train_images, fm.train_labels, cfg.train_subset, cfg.seed),
            data.subset(fm.test_images, fm.test_labels, cfg.test_subset, cfg.seed),
        )
    )
    probe = ceiling.paired(FRAMEWORK, args, cfg, devices[0])  # --ceiling
    trace = profiling.tracer(FRAMEWORK, args, "epoch")  # --profile
    _, log, timer = train(cfg, devices, train_data, test_data, args.no_progress, probe, trace)
    rec = cli.make_record(
        FRAMEWORK,
        args,
        plan,
        cfg,
        mdev.device_names(devices),
        mdev.versions(),
        strategy=STRATEGY,
        **log.record_fields(timer.warmup_seconds),
    )
    cli.save(rec, args.results, plan)
