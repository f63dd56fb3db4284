"""d2l 13.5, multiple GPUs from scratch, in PyTorch: LeNet on Fashion-MNIST, data parallel by hand.

Parameters are replicated to every device, each batch is split over the devices, every device
runs its own forward/backward, a hand-written allreduce sums the gradients, and every device
applies the same SGD step. Side by side with jax_impl/lenet.py and mxnet_impl/lenet.py.
"""

import numpy as np
import torch
import torch.nn.functional as F

from common import ceiling, cli, config, data, profiling, timing, training, weights
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
    # A new step: CUDA graphs (--compile on one GPU) may reuse the last step's output memory.
    torch.compiler.cudagraph_mark_step_begin()
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
            ps = list(params.values())
            # One foreach op for all parameters (as torch.optim.SGD does); `p -= lr * p.grad / n`
            # per parameter launched three kernels each, each dispatched from Python.
            torch._foreach_add_(ps, [p.grad for p in ps], alpha=-lr / X.shape[0])
            for p in ps:  # the next backward writes fresh gradients: no zeroing, nor
                p.grad = None  # the add into zeros that accumulating into them would cost
    return sum(l.detach().to(devices[0]) for l in ls)


def evaluate(device_params, X, y, devices, batch_size):
    """Accuracy on (X, y), every batch split over the devices; the correct count is exact."""
    correct = 0
    with torch.no_grad():
        for start in range(0, len(y), batch_size):
            X_shards, y_shards = split_batch(
                X[start : start + batch_size], y[start : start + batch_size], devices
            )
            for X_shard, y_shard, params in zip(X_shards, y_shards, device_params, strict=False):
                correct += int((lenet(X_shard, params).argmax(dim=1) == y_shard).sum())
    return correct / len(y)


def train(
    cfg, devices, train_data, test_data, no_progress=False, probe=None, compiled=False, trace=None
):
    """d2l's train(num_gpus, batch_size, lr). Returns the device parameters, EpochLog, timer.
    `compiled`: the per-device forward torch.compiled (--compile), as JAX jits its own;
    `probe`: --ceiling; `trace`: --profile's profiler around the first timed epoch."""
    X, y = train_data
    params = init_params(cfg.init_std, cfg.seed)
    device_params = [get_params(params, d) for d in devices]
    model, calls = (lenet, 1)
    if compiled:  # compiled (and CUDA graphs captured) in the warm-up, never in an epoch
        model, calls = tdev.compile_function(lenet, devices[0], len(devices))
    timer = timing.Timer(lambda: tdev.sync(devices), warmup=1, trace=trace)
    # Warm-up apart from the epochs (first touch, allocator; compilation): `calls` steps of each
    # batch shape on throwaway copies, so training itself starts from the initial weights.
    order = data.batches(len(y), cfg.batch_size, cfg.seed, 0)
    with timer.region():
        scratch = [get_params(params, d) for d in devices]
        for idx in data.warmup_batches(order) * calls:
            idx = torch.from_numpy(idx).to(X.device)
            train_batch(X[idx], y[idx], scratch, devices, cfg.lr, model)
    log = training.EpochLog(cfg.epochs, len(order), ceiling=probe)  # probe: --ceiling
    for epoch in range(cfg.epochs):
        batches = data.batches(len(y), cfg.batch_size, cfg.seed, epoch)
        total = torch.zeros((), device=devices[0])
        starts = range(0, len(y), cfg.batch_size)  # the batches, in order
        # The bar before the clock starts: its first call imports tqdm (50 ms on a CPU).
        bar = cli.progress(starts, len(batches), f"epoch {epoch + 1}", no_progress)
        with timer.region():
            # The epoch's order in one copy: a copy per batch (`.to` waits for the GPU) would
            # stop the CPU from queueing the next batch while the GPU runs this one.
            order = torch.from_numpy(np.concatenate(batches)).to(X.device)
            for start in bar:
                idx = order[start : start + cfg.batch_size]
                total += train_batch(X[idx], y[idx], device_params, devices, cfg.lr, model)
        acc = evaluate(device_params, *test_data, devices, cfg.batch_size)
        log.add(float(total) / len(y), acc, timer.times[-1], len(batches), len(y))
        if log.diverged:  # a non-finite loss: stop, and record what was measured
            break
    return device_params, log, timer


def main(args, plan, cfg) -> None:
    training.choose_strategy("lenet", FRAMEWORK, args.strategy, (STRATEGY,))
    # Every batch is split evenly over the devices, the epoch's last (partial) one included.
    n_train = data.train_size(cfg.train_subset)
    config.check_epoch_split(n_train, cfg.batch_size, plan.count)
    devices = tdev.get_devices(plan)
    fm = data.load()
    # Loaded once, as arrays on device 0; batches are sliced from them.
    train_data, test_data = (
        (
            torch.from_numpy(data.to_float(images)).to(devices[0]),
            torch.from_numpy(labels.astype(np.int64)).to(devices[0]),
        )
        for images, labels in (
            data.subset(fm.train_images, fm.train_labels, cfg.train_subset, cfg.seed),
            data.subset(fm.test_images, fm.test_labels, cfg.test_subset, cfg.seed),
        )
    )
    probe = ceiling.paired(FRAMEWORK, args, cfg, devices[0])  # --ceiling
    trace = profiling.tracer(FRAMEWORK, args, "epoch")  # --profile
    _, log, timer = train(
        cfg, devices, train_data, test_data, args.no_progress, probe, args.compile, trace
    )
    rec = cli.make_record(
        FRAMEWORK,
        args,
        plan,
        cfg,
        tdev.device_names(devices),
        tdev.versions(),
        strategy=STRATEGY,
        **log.record_fields(timer.warmup_seconds),
        extra=tdev.compile_fields(args.compile, devices[0], len(devices)),  # mode, graphs left out
    )
    cli.save(rec, args.results, plan)
