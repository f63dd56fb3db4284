"""ResNet-18 on Fashion-MNIST, concise data parallel in MXNet Gluon (d2l 13.6).

Strategy `gluon` (the only one): the parameters live on a list of contexts
(`mx.gpu(0..N-1)`, or `mx.cpu(0..N-1)` as virtual devices), `gluon.utils.split_and_load` splits
each batch over them, every context runs forward/backward on its part, and `gluon.Trainer` with
kvstore `device` sums the gradients and updates every copy. The network is hybridized.

BatchNorm statistics are per context, as in d2l: each copy normalises its own part of the batch
and keeps its own running averages (JAX in this project uses the global batch instead).
bf16 (`--amp bf16`) is not supported: the MXNet 1.9.1 wheel is CPU-only and has no bf16 training
path for Gluon models.
"""

from __future__ import annotations

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn

from common import cli, config, data, results, timing, utilization, weights
from mxnet_impl import devices as mdev

STRATEGIES = ("gluon",)
NUM_CLASSES = 10


class Residual(nn.HybridBlock):
    """d2l's residual block; `shortcut` is the 1x1 strided conv where the shape changes."""

    def __init__(self, in_channels, out_channels, strides=1, use_1x1conv=False, use_bn=True):
        super().__init__()
        with self.name_scope():
            self.conv1 = nn.Conv2D(out_channels, 3, strides, 1, in_channels=in_channels)
            self.bn1 = nn.BatchNorm(in_channels=out_channels) if use_bn else None
            self.conv2 = nn.Conv2D(out_channels, 3, 1, 1, in_channels=out_channels)
            self.bn2 = nn.BatchNorm(in_channels=out_channels) if use_bn else None
            self.shortcut = (
                nn.Conv2D(out_channels, 1, strides, in_channels=in_channels)
                if use_1x1conv
                else None
            )

    def hybrid_forward(self, F, x):
        y = self.conv1(x)
        y = F.relu(self.bn1(y) if self.bn1 is not None else y)
        y = self.conv2(y)
        y = self.bn2(y) if self.bn2 is not None else y
        if self.shortcut is not None:
            x = self.shortcut(x)
        return F.relu(y + x)


def resnet18(num_classes=NUM_CLASSES, in_channels=1, width=64, use_bn=True):
    """d2l's ResNet-18: 3x3 stem, no max-pool, 4 stages of 2 blocks; `width` narrows it for tests,
    `use_bn=False` drops BatchNorm (for exact data-parallel == one-device tests)."""

    def named(**blocks):
        # Gluon's Sequential names children 0, 1, ...; register_child gives torch's names.
        seq = nn.HybridSequential()
        for name, block in blocks.items():
            seq.register_child(block, name)
        return seq

    def stage(c_in, c_out, first):
        return named(
            **{
                "0": Residual(c_in, c_out, 1 if first else 2, not first, use_bn),
                "1": Residual(c_out, c_out, use_bn=use_bn),
            }
        )

    w = [width, 2 * width, 4 * width, 8 * width]
    stem = {"conv": nn.Conv2D(w[0], 3, 1, 1, in_channels=in_channels)}
    if use_bn:
        stem["bn"] = nn.BatchNorm(in_channels=w[0])
    stem["relu"] = nn.Activation("relu")
    return named(
        stem=named(**stem),
        layer1=stage(w[0], w[0], True),
        layer2=stage(w[0], w[1], False),
        layer3=stage(w[1], w[2], False),
        layer4=stage(w[2], w[3], False),
        pool=nn.GlobalAvgPool2D(),
        fc=nn.Dense(num_classes, in_units=w[3]),  # Dense flattens its input
    )


_LEAF = {"gamma": "weight", "beta": "bias"}  # Gluon's BatchNorm names; the rest match torch


def _named_params(net):
    """Dotted structural names (`layer1.0.bn1.gamma`) -> Parameter, with torch's leaf names."""
    out = {}
    for name, p in net._collect_params_with_prefix().items():
        head, leaf = name.rsplit(".", 1)
        out[f"{head}.{_LEAF.get(leaf, leaf)}"] = p
    return out


def weight_shapes(net):
    return {k: tuple(p.shape) for k, p in _named_params(net).items()}


def get_weights(net):
    return {k: p.list_data()[0].asnumpy() for k, p in _named_params(net).items()}


def set_weights(net, params):
    weights.check_shapes(params, weight_shapes(net))
    for k, p in _named_params(net).items():
        # Every context's copy, in the parameter's dtype: nd.array would make float32 of a numpy
        # array and so round a float64 net's weights (the float64 tests compare to 2**-24).
        p.set_data(nd.array(params[k], dtype=p.dtype))
    return net


def init_weights(net, std, seed, ctx=None):
    """d2l init from the shared seed; MXNet allocates parameters on `ctx` when initialising."""
    net.initialize(ctx=ctx or [mx.cpu()], force_reinit=True)
    return set_weights(net, weights.init_normal(weight_shapes(net), std, seed))


def make_optimizer(net, lr):
    # Plain SGD (d2l); kvstore `device` reduces gradients across contexts.
    return gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": lr}, kvstore="device")


def loss_fn(logits, labels):
    """Per-sample losses (Gluon's idiom): `Trainer.step(batch_size)` divides their summed
    gradient by the batch size, so the update is that of the mean cross-entropy."""
    return gluon.loss.SoftmaxCrossEntropyLoss()(logits, labels)


def train_step(net, trainer, xs, ys):
    """One SGD step on a batch already split over the contexts; returns per-context loss sums."""
    with autograd.record():
        losses = [loss_fn(net(x), y) for x, y in zip(xs, ys, strict=True)]
    for loss in losses:
        loss.backward()
    trainer.step(sum(y.shape[0] for y in ys))
    return [loss.sum() for loss in losses]


def evaluate(net, xs, ys):
    """Correct predictions on a batch split over the contexts (BatchNorm in inference mode)."""
    return sum(
        (net(x).argmax(axis=1) == y.astype("float32")).sum().asscalar()
        for x, y in zip(xs, ys, strict=True)
    )


def shard_batch(x_all, y_all, idx, ctxs):
    """Slice the batch from the preloaded arrays and `split_and_load` it over the contexts
    (uneven parts allowed, so a short last batch is kept)."""
    sel = nd.array(idx, ctx=x_all.context, dtype="int64")
    xs = gluon.utils.split_and_load(nd.take(x_all, sel), ctxs, even_split=False)
    ys = gluon.utils.split_and_load(nd.take(y_all, sel), ctxs, even_split=False)
    return xs, ys


def train(net, cfg, ds, ctxs, sampler=None, no_progress=False):
    """d2l's train loop on preloaded arrays (on the first context)."""
    x_train = nd.array(data.to_float(ds[0]), ctx=ctxs[0])
    y_train = nd.array(ds[1].astype(np.int32), ctx=ctxs[0], dtype="int32")
    x_test = nd.array(data.to_float(ds[2]), ctx=ctxs[0])
    y_test = nd.array(ds[3].astype(np.int32), ctx=ctxs[0], dtype="int32")
    init_weights(net, cfg.init_std, cfg.seed, ctxs)
    net.hybridize()
    trainer = make_optimizer(net, cfg.lr)
    sampler = sampler or utilization.Sampler("cpu_time")
    timer = timing.Timer(mdev.sync, warmup=1)
    out = {"train_loss": [], "test_acc": [], "sec_per_epoch": [], "timed_steps": [], "images": 0}
    first = data.batches(len(ds[1]), cfg.batch_size, cfg.seed, 0)
    full_steps = len(first)
    # Warm-up apart from the epochs (graph building, memory planning): one step of each batch
    # shape the epochs will use, then the initial weights are set again (on every context, and
    # in the kvstore), so every epoch is timed whole.
    with timer.region():
        for idx in data.warmup_batches(first[: cfg.steps_per_epoch]):
            train_step(net, trainer, *shard_batch(x_train, y_train, idx, ctxs))
    set_weights(net, weights.init_normal(weight_shapes(net), cfg.init_std, cfg.seed))
    for epoch in range(cfg.epochs):
        steps = data.batches(len(ds[1]), cfg.batch_size, cfg.seed, epoch)[: cfg.steps_per_epoch]
        losses = []
        bar = cli.progress(range(len(steps)), len(steps), f"epoch {epoch + 1}", no_progress)
        with sampler.measure(), timer.region():
            for idx in steps:
                losses += train_step(net, trainer, *shard_batch(x_train, y_train, idx, ctxs))
                bar.update(1)
        bar.close()
        seen = sum(len(b) for b in steps)
        out["train_loss"].append(sum(float(loss.asscalar()) for loss in losses) / seen)
        out["sec_per_epoch"].append(timer.times[-1] * full_steps / len(steps))
        out["timed_steps"].append(len(steps))
        out["images"] += seen
        correct = sum(
            evaluate(net, *shard_batch(x_test, y_test, idx, ctxs))
            for idx in np.array_split(np.arange(len(ds[3])), max(1, len(ds[3]) // 256))
        )
        out["test_acc"].append(float(correct) / len(ds[3]))
        print(
            f"epoch {epoch + 1}/{cfg.epochs}: train loss {out['train_loss'][-1]:.4f}, "
            f"test acc {out['test_acc'][-1]:.4f}, {out['sec_per_epoch'][-1]:.2f} s/epoch",
            flush=True,
        )
    out["full_steps"] = full_steps
    out["warmup_seconds"] = timer.warmup_seconds
    out["timed_seconds"] = sum(timer.times)
    return out


def main(args, plan):
    strategy = args.strategy or "gluon"
    if strategy not in STRATEGIES:
        raise config.ConfigError(
            f"unknown resnet18 strategy {strategy!r} for mxnet; "
            f"choose one of {', '.join(STRATEGIES)}"
        )
    if args.amp == "bf16":
        raise config.ConfigError(
            "--amp bf16 is not supported by the MXNet implementation (CPU-only MXNet 1.9.1 wheel "
            "has no bf16 Gluon training); use --amp off"
        )
    cfg = config.for_devices(
        config.get_config(args.workload, args.preset, **cli.overrides(args)), plan.count
    )
    if cfg.image_size != 28:
        raise config.ConfigError("resnet18 trains on Fashion-MNIST at its native 28x28")
    # Every batch, the epoch's last included, splits evenly: no sample is dropped.
    config.check_epoch_split(data.train_size(cfg.train_subset), cfg.batch_size, plan.count)
    ctxs = mdev.get_devices(plan)
    ds = data.load()
    x_tr, y_tr = data.subset(ds.train_images, ds.train_labels, cfg.train_subset, cfg.seed)
    x_te, y_te = data.subset(ds.test_images, ds.test_labels, cfg.test_subset, cfg.seed)
    gpu = plan.platform == "gpu"
    indices = utilization.visible_gpu_indices(plan.count) if gpu else []
    with utilization.Sampler("nvml" if gpu else "cpu_time", indices) as sampler:
        out = train(resnet18(), cfg, (x_tr, y_tr, x_te, y_te), ctxs, sampler, args.no_progress)
    stats = timing.summarize(out["sec_per_epoch"])
    extrapolated = any(k != out["full_steps"] for k in out["timed_steps"])
    rec = cli.make_record(
        "mxnet",
        args,
        plan,
        cfg,
        mdev.device_names(ctxs),
        mdev.versions(),
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
        extra={**sampler.result(), "amp": args.amp},
    )
    results.append(rec, args.results)
    print(f"{out['images'] / out['timed_seconds']:.1f} images/sec ({strategy})")
    print(cli.final_line(rec.test_acc, stats.median, plan, extrapolated), flush=True)
