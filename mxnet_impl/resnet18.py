"""ResNet-18 on Fashion-MNIST, concise data parallel in MXNet Gluon (d2l 13.6).

Strategy `gluon`, in the function `gluon`: the parameters live on a list of contexts
(`mx.gpu(0..N-1)`, or `mx.cpu(0..N-1)` as virtual devices), `split_and_load` splits each batch
over them, every context runs forward/backward on its part, and `gluon.Trainer` with kvstore
`device` sums the gradients and updates every copy. The network is hybridized.

Strategy `dist`, in the function `dist`: the same on each of several worker processes, which
MXNet's parameter server (kvstore `dist_sync`) joins: the servers sum the workers' gradients. The
project starts the scheduler, servers and workers on one machine (mxnet_impl/launch.py, which
also says how to run them on several); `--gpus N` counts the contexts of all workers.

BatchNorm statistics are per context, as in d2l: each copy normalises its own part of the batch
and keeps its own running averages (JAX in this project uses the global batch instead).
bf16 (`--amp bf16`) is MXNet's AMP (`use_bf16`), on the CPU: MXNet 1.9's bf16 kernels are oneDNN's.
"""

from __future__ import annotations

import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, nd
from mxnet.gluon import nn

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
from mxnet_impl import devices as mdev
from mxnet_impl import launch
from mxnet_impl import weights as mweights

FRAMEWORK = "mxnet"
STRATEGIES = ("gluon", "dist")
NUM_CLASSES = 10
TOTALS_KEY = 1 << 20  # the kvstore key of the epoch's sums over the workers (not a parameter's)


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
        # Activation, not F.relu: MXNet runs Activation with oneDNN and relu with a generic kernel
        # of its own, which took 17% of the float32 step on 2 CPU cores and half the bf16 step.
        y = self.conv1(x)
        y = F.Activation(self.bn1(y) if self.bn1 is not None else y, act_type="relu")
        y = self.conv2(y)
        y = self.bn2(y) if self.bn2 is not None else y
        if self.shortcut is not None:
            x = self.shortcut(x)
        return F.Activation(y + x, act_type="relu")


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


def use_bf16():
    """bf16 the MXNet way: AMP makes every Convolution and FullyConnected built after this call
    run in bf16 (oneDNN's kernels; BatchNorm, ReLU and pooling follow their input), parameters,
    gradients and loss staying float32 (no loss scaling: bf16 has float32's exponent range).
    It patches MXNet's operators for the whole process, for good: main calls it once, before
    the network is built."""
    from mxnet.contrib import amp

    if not mdev.has_bf16():
        raise config.ConfigError(
            "MXNet's bf16 needs an AVX-512 CPU (its oneDNN has no bf16 kernels for this one); "
            "use --amp off"
        )
    amp.init(target_dtype="bfloat16")


def init_weights(net, std, seed, ctx=None):
    """d2l init from the shared seed; MXNet allocates parameters on `ctx` when initialising."""
    net.initialize(ctx=ctx or [mx.cpu()], force_reinit=True)
    return set_weights(net, weights.init_normal(weight_shapes(net), std, seed))


def make_optimizer(net, lr, kvstore="device"):
    # Plain SGD (d2l). The kvstore `device` is Gluon's data-parallel reduction: it sums the
    # contexts' gradients before the one update of every copy (see `gluon`). A dist_sync kvstore
    # (see `dist`) also sums over the workers; each worker then updates its own copy
    # (update_on_kvstore=False), as the servers' update would keep the first step's 1/batch and
    # an epoch's last batch is smaller.
    trainer = mx.gluon.Trainer(
        net.collect_params(), "sgd", {"learning_rate": lr}, kvstore=kvstore,
        update_on_kvstore=None if kvstore == "device" else False,
    )  # fmt: skip
    if kvstore != "device":
        _pull_initial_weights(trainer)
    return trainer


def _pull_initial_weights(trainer):
    """Set up the Trainer's dist kvstore now and wait until this worker has its weights.

    The race this prevents (issue 14, about 1 run in 10): the Trainer lazily does, in its first
    step, kv.broadcast of every weight (worker 0 stores it, every worker pulls it) and then the
    pushpull of every gradient on the same keys. The pull writes the weight and the pushpull the
    gradient, different arrays, so the threaded engine does not order them: a worker could push
    its gradients before its weight pull was served, and once every worker had pushed, the
    server (no updater: update_on_kvstore=False) held the gradient sum under that key, which
    the late pull copied into the weight. Waiting here serves every worker's weight pulls
    before its first push, hence before any round replaces the stored weights."""
    # Gluon 1.9 has no public call for what its first step does: these two, then the step.
    trainer._init_kvstore()
    trainer._init_params()
    nd.waitall()


def loss_fn(logits, labels):
    """Per-sample losses (Gluon's idiom): `Trainer.step(batch_size)` divides their summed
    gradient by the batch size, so the update is that of the mean cross-entropy."""
    return mx.gluon.loss.SoftmaxCrossEntropyLoss()(logits, labels)


def train_step(net, trainer, xs, ys, batch_size=None):
    """One SGD step on a batch already split over the contexts; returns per-context loss sums.
    `batch_size`: the global batch (`dist`: all workers' parts); default this process's parts."""
    with autograd.record():
        losses = [loss_fn(net(x), y) for x, y in zip(xs, ys, strict=True)]
    for loss in losses:
        loss.backward()
    trainer.step(batch_size or sum(y.shape[0] for y in ys))
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


def dist(net, ctxs, kv):
    """MXNet's parameter server: this process is worker `kv.rank` of `kv.num_workers` (kvstore
    dist_sync), with its own contexts set up as in `gluon`. It takes its share of each global
    batch (the parts its contexts would get if one process had every worker's contexts) and
    splits it over its contexts; the Trainer (make_optimizer) sums the gradients over its
    contexts, pushes the sum to the servers, which add up every worker's, and pulls the total,
    so every worker takes the same step. Returns the splitter of this worker's share."""
    local = gluon(net, ctxs)
    slots = kv.num_workers * len(ctxs)
    kv.init(TOTALS_KEY, nd.zeros(2, dtype="float64"))  # see _sum_over_workers

    def split(x_all, y_all, idx):
        # split_and_load's rule over all the slots: equal parts, the remainder to the last.
        part = len(idx) // slots * len(ctxs)
        lo = kv.rank * part
        hi = len(idx) if kv.rank == kv.num_workers - 1 else lo + part
        return local(x_all, y_all, idx[lo:hi])

    return split


def train(
    net, cfg, ds, devs, strategy, sampler=None, no_progress=False, kv=None, probe=None, trace=None
):
    """d2l's train loop on preloaded arrays (on the first context); `kv`: dist's kvstore;
    `probe`: --ceiling; `trace`: --profile's profiler around the first timed epoch."""
    init_weights(net, cfg.init_std, cfg.seed, devs[:1])
    split = dist(net, devs, kv) if strategy == "dist" else gluon(net, devs)
    net.hybridize()
    trainer = make_optimizer(net, cfg.lr, "device" if kv is None else kv)
    x_train, y_train, x_test, y_test = _to_device(ds, devs[0])
    sampler = sampler or utilization.Sampler("cpu_time")
    timer = timing.Timer(mdev.sync, warmup=1, trace=trace)
    first = data.batches(len(ds[1]), cfg.batch_size, cfg.seed, 0)
    quiet = kv is not None and kv.rank != 0
    log = training.EpochLog(cfg.epochs, len(first), quiet=quiet, ceiling=probe)
    # Warm-up apart from the epochs (graph building, memory planning): one step of each batch
    # shape the epochs will use, then the initial weights are set again (on every context, and
    # in the kvstore), so every epoch is timed whole.
    with timer.region():
        for idx in data.warmup_batches(first[: cfg.steps_per_epoch]):
            train_step(net, trainer, *split(x_train, y_train, idx), len(idx))
    set_weights(net, weights.init_normal(weight_shapes(net), cfg.init_std, cfg.seed))
    for epoch in range(cfg.epochs):
        steps = data.batches(len(ds[1]), cfg.batch_size, cfg.seed, epoch)[: cfg.steps_per_epoch]
        losses = []
        bar = cli.progress(range(len(steps)), len(steps), f"epoch {epoch + 1}", no_progress)
        with sampler.measure(), timer.region():
            for idx in steps:
                losses += train_step(net, trainer, *split(x_train, y_train, idx), len(idx))
                bar.update(1)
        bar.close()
        seen = sum(len(b) for b in steps)
        correct = sum(
            evaluate(net, *split(x_test, y_test, idx))
            for idx in np.array_split(np.arange(len(ds[3])), max(1, len(ds[3]) // 256))
        )
        loss = sum(float(loss.asscalar()) for loss in losses)
        loss, correct = _sum_over_workers(kv, [loss, float(correct)])
        log.add(loss / seen, correct / len(ds[3]), timer.times[-1], len(steps), seen)
        if log.diverged:  # a non-finite loss: stop, and record what was measured
            break
    return log, timer


def _sum_over_workers(kv, values):
    """`dist`: each worker's numbers summed over the workers (dist_sync's servers add up what
    every worker pushes to a key); otherwise `values` as they are."""
    if kv is None:
        return values
    total = nd.array(values, dtype="float64")
    kv.push(TOTALS_KEY, total)
    kv.pull(TOTALS_KEY, out=total)
    return total.asnumpy().tolist()


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
    """Check everything, then train here (`gluon`, or one `dist` worker: DMLC_ROLE=worker), or
    start the dist_sync scheduler, servers and workers on this machine (launch.py)."""
    strategy = training.choose_strategy("resnet18", FRAMEWORK, args.strategy, STRATEGIES)
    if args.amp == "bf16":
        use_bf16()  # here, so that a CPU without bf16 kernels fails before dist workers start
    # d2l 13.6: N devices train with N times the batch and the lr (2 devices: 512 and 0.2).
    cfg = config.for_devices(cfg, plan.count)
    if cfg.image_size != 28:
        raise config.ConfigError("resnet18 trains on Fashion-MNIST at its native 28x28")
    # Every batch, the epoch's last included, splits evenly: no sample is dropped.
    config.check_epoch_split(data.train_size(cfg.train_subset), cfg.batch_size, plan.count)
    if strategy == "dist" and "DMLC_ROLE" not in os.environ:
        launch.counts(plan.count)  # a bad worker count fails here, before any process starts
        cmd = [sys.executable, "-m", "mxnet_impl", *_worker_argv(args)]
        launch.dist_sync(cmd, plan.count, "MXNet dist_sync training")
        return
    kv, ctxs = _join(plan) if strategy == "dist" else (None, mdev.get_devices(plan))
    ds = data.load_subsets(cfg.train_subset, cfg.test_subset, cfg.seed)
    with utilization.sampler_for(plan.platform, len(ctxs)) as sampler:
        probe = ceiling.paired(FRAMEWORK, args, cfg, ctxs[0])  # --ceiling
        trace = profiling.tracer(FRAMEWORK, args, "epoch", kv.rank if kv else 0)  # --profile
        log, timer = train(
            resnet18(), cfg, ds, ctxs, strategy, sampler, args.no_progress, kv, probe, trace
        )
    names, extra = mdev.device_names(ctxs), {**sampler.result(), "amp": args.amp}
    if kv is not None:
        if kv.rank != 0:  # worker 0 records the run; the others end as it does
            if log.diverged:
                raise training.Diverged(log.diverged, log.train_loss[-1])
            return
        names = [f"worker{r}:{n}" for r in range(kv.num_workers) for n in names]
        extra.update(_dist_fields(kv))
    rec = cli.make_record(
        FRAMEWORK, args, plan, cfg, names, mdev.versions(), strategy=strategy,
        **log.record_fields(timer.warmup_seconds), extra=extra,
    )  # fmt: skip
    cli.save(rec, args.results, plan)


# --- MXNet only: a dist_sync worker, started by launch.py (or by hand, see there) ------------


def _join(plan):
    """This worker's kvstore and contexts. ps-lite waits for every peer without a deadline
    (a missing one would hang the run): MXNET_DIST_INIT_TIMEOUT bounds the wait."""
    workers, servers = launch.counts(plan.count)
    needed = ("DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT")
    if os.environ.get("DMLC_ROLE") != "worker" or not all(map(os.environ.get, needed)):
        raise config.ConfigError(
            "strategy dist runs as DMLC_ROLE=worker with DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT "
            "set (see mxnet_impl/launch.py), or with none of them set (one machine)"
        )
    where = f"{os.environ['DMLC_PS_ROOT_URI']}:{os.environ['DMLC_PS_ROOT_PORT']}"
    wait = processes.env_int("MXNET_DIST_INIT_TIMEOUT", "60", 1)
    line = (
        f"error: kvstore dist_sync: the scheduler at {where}, {servers} server(s) and {workers} "
        f"worker(s) did not all join within {wait} s (MXNET_DIST_INIT_TIMEOUT); start every one"
    )
    with processes.deadline(wait, line, cli.EXIT_BAD_INPUT):
        kv = mx.kv.create("dist_sync")
    local = devices.DevicePlan(plan.count // workers, plan.platform, plan.virtual)
    return kv, mdev.get_devices(local)


def _dist_fields(kv):
    servers = int(os.environ["DMLC_NUM_SERVER"])
    return {
        "kvstore": "dist_sync",
        "workers": kv.num_workers,
        "servers": servers,
        "processes": kv.num_workers + servers + 1,  # and the scheduler
    }


def _worker_argv(args):
    """The command line that reproduces `args` for a worker."""
    argv = ["--workload", args.workload, "--gpus", str(args.gpus), "--platform", args.platform]
    argv += ["--preset", args.preset, "--strategy", "dist", "--amp", args.amp]
    argv += ["--results", str(args.results)]
    argv += ["--profile", args.profile] if args.profile else []
    for flag, value in (("--epochs", args.epochs), ("--batch-size", args.batch_size)):
        if value is not None:
            argv += [flag, str(value)]
    if args.lr is not None:
        argv += ["--lr", str(args.lr)]
    return argv + (["--no-progress"] if args.no_progress else [])
