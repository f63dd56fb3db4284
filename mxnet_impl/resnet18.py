"""ResNet-18 on Fashion-MNIST, concise data parallel in MXNet Gluon (d2l 13.6).

Strategy `gluon` (the only one), in the function `gluon`: the parameters live on a list of
contexts (`mx.gpu(0..N-1)`, or `mx.cpu(0..N-1)` as virtual devices), `split_and_load` splits each
batch over them, every context runs forward/backward on its part, and `gluon.Trainer` with
kvstore `device` sums the gradients and updates every copy. The network is hybridized.

BatchNorm statistics are per context, as in d2l: each copy normalises its own part of the batch
and keeps its own running averages (JAX in this project uses the global batch instead).
bf16 (`--amp bf16`) is not supported: the MXNet 1.9.1 wheel is CPU-only and has no bf16 training
path for Gluon models.
"""

from __future__ import annotations

import mxnet as mx
import numpy as np
from mxnet import autograd, nd
from mxnet.gluon import nn

from common import cli, config, data, timing, training, utilization, weights
from mxnet_impl import devices as mdev
from mxnet_impl import weights as mweights

FRAMEWORK = "mxnet"
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


def weight_shapes(net):
    """Names and shapes in the exchange format (parameters and BN running statistics)."""
    return mweights.shapes(net)


def get_weights(net):
    return mweights.get_weights(net)


def set_weights(net, params):
    mweights.set_weights(net, params)  # every context's copy
    return net


def init_weights(net, std, seed, ctx=None):
    """d2l init from the shared seed; MXNet allocates parameters on `ctx` when initialising."""
    net.initialize(ctx=ctx or [mx.cpu()], force_reinit=True)
    return set_weights(net, weights.init_normal(weight_shapes(net), std, seed))


def make_optimizer(net, lr):
    # Plain SGD (d2l). The kvstore `device` is Gluon's data-parallel reduction: it sums the
    # contexts' gradients before the one update of every copy (see `gluon`).
    return mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": lr}, kvstore="device")


def loss_fn(logits, labels):
    """Per-sample losses (Gluon's idiom): `Trainer.step(batch_size)` divides their summed
    gradient by the batch size, so the update is that of the mean cross-entropy."""
    return mx.gluon.loss.SoftmaxCrossEntropyLoss()(logits, labels)


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


# --- the parallelism: one function per strategy ------------------------------------------------


def gluon(net, ctxs):
    """Gluon's data parallel: a copy of the parameters on every context; each batch is split
    over the contexts (split_and_load), each context runs forward and backward on its part, and
    the Trainer's kvstore sums the gradients (make_optimizer). Returns the batch splitter."""
    net.collect_params().reset_ctx(ctxs)

    def split(x_all, y_all, idx):
        sel = nd.array(idx, ctx=x_all.context, dtype="int64")
        xs = mx.gluon.utils.split_and_load(nd.take(x_all, sel), ctxs, even_split=False)
        ys = mx.gluon.utils.split_and_load(nd.take(y_all, sel), ctxs, even_split=False)
        return xs, ys

    return split


def train(net, cfg, ds, devs, strategy, sampler=None, no_progress=False):
    """d2l's train loop on preloaded arrays (on the first context)."""
    init_weights(net, cfg.init_std, cfg.seed, devs[:1])
    split = {"gluon": gluon}[strategy](net, devs)
    net.hybridize()
    trainer = make_optimizer(net, cfg.lr)
    x_train, y_train, x_test, y_test = _to_device(ds, devs[0])
    sampler = sampler or utilization.Sampler("cpu_time")
    timer = timing.Timer(mdev.sync, warmup=1)
    first = data.batches(len(ds[1]), cfg.batch_size, cfg.seed, 0)
    log = training.EpochLog(cfg.epochs, len(first))
    # Warm-up apart from the epochs (graph building, memory planning): one step of each batch
    # shape the epochs will use, then the initial weights are set again (on every context, and
    # in the kvstore), so every epoch is timed whole.
    with timer.region():
        for idx in data.warmup_batches(first[: cfg.steps_per_epoch]):
            train_step(net, trainer, *split(x_train, y_train, idx))
    set_weights(net, weights.init_normal(weight_shapes(net), cfg.init_std, cfg.seed))
    for epoch in range(cfg.epochs):
        steps = data.batches(len(ds[1]), cfg.batch_size, cfg.seed, epoch)[: cfg.steps_per_epoch]
        losses = []
        bar = cli.progress(range(len(steps)), len(steps), f"epoch {epoch + 1}", no_progress)
        with sampler.measure(), timer.region():
            for idx in steps:
                losses += train_step(net, trainer, *split(x_train, y_train, idx))
                bar.update(1)
        bar.close()
        seen = sum(len(b) for b in steps)
        correct = sum(
            evaluate(net, *split(x_test, y_test, idx))
            for idx in np.array_split(np.arange(len(ds[3])), max(1, len(ds[3]) // 256))
        )
        loss = sum(float(loss.asscalar()) for loss in losses) / seen
        log.add(loss, float(correct) / len(ds[3]), timer.times[-1], len(steps), seen)
        if log.diverged:  # a non-finite loss: stop, and record what was measured
            break
    return log, timer


def _to_device(ds, ctx):
    """(x_train, y_train, x_test, y_test) as NDArrays on `ctx`, once."""
    x_train, y_train, x_test, y_test = ds
    return (
        nd.array(data.to_float(x_train), ctx=ctx),
        nd.array(y_train.astype(np.int32), ctx=ctx, dtype="int32"),
        nd.array(data.to_float(x_test), ctx=ctx),
        nd.array(y_test.astype(np.int32), ctx=ctx, dtype="int32"),
    )


def main(args, plan, cfg):
    strategy = training.choose_strategy("resnet18", FRAMEWORK, args.strategy, STRATEGIES)
    if args.amp == "bf16":
        raise config.ConfigError(
            "--amp bf16 is not supported by the MXNet implementation (CPU-only MXNet 1.9.1 wheel "
            "has no bf16 Gluon training); use --amp off"
        )
    # d2l 13.6: N devices train with N times the batch and the lr (2 devices: 512 and 0.2).
    cfg = config.for_devices(cfg, plan.count)
    if cfg.image_size != 28:
        raise config.ConfigError("resnet18 trains on Fashion-MNIST at its native 28x28")
    # Every batch, the epoch's last included, splits evenly: no sample is dropped.
    config.check_epoch_split(data.train_size(cfg.train_subset), cfg.batch_size, plan.count)
    ctxs = mdev.get_devices(plan)
    ds = data.load_subsets(cfg.train_subset, cfg.test_subset, cfg.seed)
    with utilization.sampler_for(plan.platform, plan.count) as sampler:
        log, timer = train(resnet18(), cfg, ds, ctxs, strategy, sampler, args.no_progress)
    rec = cli.make_record(
        FRAMEWORK, args, plan, cfg, mdev.device_names(ctxs), mdev.versions(), strategy=strategy,
        **log.record_fields(timer.warmup_seconds), extra={**sampler.result(), "amp": args.amp},
    )  # fmt: skip
    cli.save(rec, args.results, plan)
