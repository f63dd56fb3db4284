"""ResNet-18 on Fashion-MNIST, concise data parallel in MXNet Gluon (d2l 13.6).

Strategies (`--strategy`), each one function of (net, optimizer, world) that returns (place,
shard, step, correct, total) (common/training.py, "A strategy"):
  gluon (default)  `context_list`: one process, the parameters on a list of contexts (`mx.gpu(i)`,
                   or `mx.cpu(i)` as virtual devices), gradients summed by the kvstore `device`.
  dist             `dist_sync`: the same in each of several worker processes, joined by MXNet's
                   parameter server (kvstore dist_sync), whose servers sum the workers' gradients;
                   mxnet_impl/launch.py starts them (`--gpus N`: all workers' contexts).

BatchNorm is per context, as in d2l and in this project's torch and JAX: each copy normalises its
own part of the batch and keeps its own running averages, never synced. The first context (worker
0's, under dist) evaluates the test batch with its own, as DDP's ranks with rank 0's buffers.
bf16 (`--amp bf16`) is MXNet's AMP (`use_bf16`), on the CPU: MXNet 1.9's bf16 kernels are oneDNN's.
"""

import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn
from mxnet.gluon.utils import split_and_load

from common import config, data, harness, training, utilization, weights
from mxnet_impl import devices as mdev
from mxnet_impl import launch
from mxnet_impl import weights as mweights

FRAMEWORK = "mxnet"
STRATEGIES = ("gluon", "dist")
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
        # Activation, not F.relu: MXNet runs Activation with oneDNN's kernel and relu with a
        # generic one of its own, far slower on a CPU, in bf16 above all (docs/design.md, traps).
        y = self.conv1(x)
        y = F.Activation(self.bn1(y) if self.bn1 is not None else y, act_type="relu")
        y = self.conv2(y)
        y = self.bn2(y) if self.bn2 is not None else y
        if self.shortcut is not None:
            x = self.shortcut(x)
        return F.Activation(y + x, act_type="relu")


def resnet18(num_classes=NUM_CLASSES, in_channels=1, width=64, use_bn=True, residuals=2):
    """d2l's ResNet-18: 3x3 stem, no max-pool, 4 stages of `residuals` blocks; `width` narrows it
    and `residuals=1` halves its depth for tests, `use_bn=False` drops BatchNorm (for exact
    data-parallel == one-device tests)."""

    def named(**blocks):
        # Gluon's Sequential names children 0, 1, ...; register_child gives torch's names.
        seq = nn.HybridSequential()
        for name, block in blocks.items():
            seq.register_child(block, name)
        return seq

    def stage(c_in, c_out, first):
        rest = {str(i): Residual(c_out, c_out, use_bn=use_bn) for i in range(1, residuals)}
        return named(**{"0": Residual(c_in, c_out, 1 if first else 2, not first, use_bn), **rest})

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
    It patches MXNet's operators for the whole process, for good: main calls it first."""
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


def make_optimizer(lr):
    """Plain SGD (d2l): the update rule alone, as optax's; each strategy makes the gluon.Trainer
    that applies it to the parameters on its contexts."""
    return mx.optimizer.SGD(learning_rate=lr)


def loss_fn(logits, labels):
    """Per-sample losses (Gluon's idiom): `Trainer.step(batch_size)` divides their summed
    gradient by the batch size, so the update is that of the mean cross-entropy."""
    return gluon.loss.SoftmaxCrossEntropyLoss()(logits, labels)


def train_step(net, trainer, xs, ys, batch_size):
    """One SGD step on a batch split over the contexts (a part of `xs` and `ys` on each);
    `batch_size`: the global batch, over every process. Each context's summed loss (not synced)."""
    with autograd.record():
        losses = [loss_fn(net(x), y) for x, y in zip(xs, ys, strict=True)]
    for loss in losses:
        loss.backward()
    trainer.step(batch_size)
    return [loss.sum() for loss in losses]


def evaluate(net, x, y):
    """Correct predictions on a batch on one context (not synced), BatchNorm on its running
    statistics (outside autograd.record)."""
    return (net(x).argmax(axis=1) == y.astype("float32")).sum()


def _rows_of(idx, rank, workers, n_contexts):
    """Worker `rank`'s rows of a batch: equal parts per context, the remainder to the last."""
    part = len(idx) // (workers * n_contexts) * n_contexts
    return idx[rank * part : None if rank == workers - 1 else (rank + 1) * part]


def _correct_on(net, device, x, y, rows):
    """Correct predictions on the test rows `rows` (host indices) on one context, with its
    running statistics (not synced)."""
    rows = nd.array(rows, ctx=device, dtype="int64")
    return evaluate(net, x.take(rows), y.take(rows))


# --- the parallelism: one function per strategy ------------------------------------------------


def context_list(net, optimizer, world):
    """Gluon's data parallel in one process: a copy of the parameters on every context; each
    batch is split over the contexts (split_and_load), each runs forward and backward on its
    part, and the Trainer's kvstore `device` sums the gradients, which every context applies to
    its copy. One context: the Trainer needs no kvstore and makes none."""
    devices, params = world.devices, net.collect_params()
    params.reset_ctx(devices)
    # The kvstore only sums: an updating kvstore would keep a copy that set_weights misses.
    trainer = gluon.Trainer(params, optimizer, kvstore="device", update_on_kvstore=False)

    def place(arrays):  # on the first context, where each batch is split from
        return mdev.to_device(data.as_float(arrays, np.int32), devices[0])

    def shard(batches):  # every batch whole, in one copy: split_and_load splits it
        return mdev.one_copy(batches, devices[0])

    def step(x, y, idx):  # a part of the batch on each context; the Trainer sums the gradients
        xs, ys = (split_and_load(a.take(idx), devices, even_split=False) for a in (x, y))
        return mdev.add_up(train_step(net, trainer, xs, ys, len(idx)))

    def correct(x, y, idx):  # the first context, where the data is, with its statistics
        return _correct_on(net, devices[0], x, y, idx)

    def total(losses, hits):  # one process: nothing to add up across processes
        return mdev.float_sum(losses), mdev.float_sum(hits)

    return place, shard, step, correct, total


def dist_sync(net, optimizer, world):
    """MXNet's parameter server: this process is worker `world.rank` of kvstore dist_sync
    (`world.group`), its own contexts as in `context_list`, on its share of each global batch;
    the Trainer pushes its contexts' gradient sum to the servers, which add up every worker's,
    and pulls the total: every worker takes the same step."""
    devices, params = world.devices, net.collect_params()
    params.reset_ctx(devices)
    # The servers only sum (update_on_kvstore=False) and each worker updates its own copy: the
    # servers' update would keep the first step's 1/batch, and an epoch's last batch is smaller.
    trainer = gluon.Trainer(params, optimizer, kvstore=world.group, update_on_kvstore=False)
    mdev.pull_weights_first(trainer)  # before any gradient is pushed on the same keys

    def place(arrays):  # every worker holds the whole data set on its first context
        return mdev.to_device(data.as_float(arrays, np.int32), devices[0])

    def shard(batches):  # this worker's share of every global batch, in one copy; and its size
        mine = [_rows_of(idx, world.rank, world.size, len(devices)) for idx in batches]
        rows = mdev.one_copy(mine, devices[0])
        return zip(rows, [len(idx) for idx in batches], strict=True)

    def step(x, y, part):  # this worker's rows over its contexts; the global batch's size
        rows, batch_size = part
        xs, ys = (split_and_load(a.take(rows), devices, even_split=False) for a in (x, y))
        return mdev.add_up(train_step(net, trainer, xs, ys, batch_size))

    def correct(x, y, idx):  # worker 0's first context counts the test batch, the others none
        return _correct_on(net, devices[0], x, y, idx) if world.rank == 0 else nd.zeros(1)

    def total(losses, hits):  # summed over the workers: the servers add up what each pushes
        return world.sum(np.array([mdev.float_sum(losses), mdev.float_sum(hits)])).tolist()

    return place, shard, step, correct, total


def train(net, cfg, ds, strategy, run):
    """d2l's train loop on preloaded arrays: `strategy` (one of the functions above) spreads each
    step over the contexts; `run` (common.harness.Run) times, logs and records it."""
    place, shard, step, correct, total = strategy(net, make_optimizer(cfg.lr), run.world)
    x_train, y_train, x_test, y_test = place(ds)
    initial = get_weights(net)
    for part in run.warm_up(shard, sync=mdev.sync):  # each batch shape once (graphs, memory)
        step(x_train, y_train, part)
    set_weights(net, initial)  # the epochs start from the initial weights, on every context
    for parts in run.epochs(shard):  # iterating `parts` is the timed epoch
        losses = [step(x_train, y_train, part) for part in parts]
        hits = [correct(x_test, y_test, idx) for idx in run.test_batches()]
        run.log(*total(losses, hits))


def main(args, plan, cfg, hooks):
    """Check everything; then start the dist_sync scheduler, servers and workers on this machine
    (mxnet_impl/launch.py), or train here: join the world (a dist worker joins the kvstore),
    build, train, record (worker 0)."""
    strategy = training.choose_strategy("resnet18", FRAMEWORK, args.strategy, STRATEGIES)
    if args.amp == "bf16":
        use_bf16()  # here, so that a CPU without bf16 kernels fails before dist workers start
    _check(cfg, plan)
    if strategy == "dist" and not launch.is_worker():  # the launcher: every kvstore process
        cmd = [sys.executable, "-m", "mxnet_impl", *launch.worker_argv(args, plan.count)]
        launch.dist_sync(cmd, plan.count, "MXNet dist_sync training", args)
        return
    world = launch.join(plan, args)
    # d2l 13.6: 2 devices train with batch 512 and lr 0.2 (the one-device values times 2).
    cfg = config.for_devices(cfg, world.plan.count)
    ds = data.load_subsets(cfg.train_subset, cfg.test_subset, cfg.seed)
    net = init_weights(resnet18(), cfg.init_std, cfg.seed, world.devices[:1])
    net.hybridize()
    run = harness.Run(args, cfg, ds, world, hooks=hooks)
    with run.sampling(utilization.sampler_for(plan.platform, len(world.devices))):
        train(net, cfg, ds, {"gluon": context_list, "dist": dist_sync}[strategy], run)
    names, extra = mdev.device_names(world.devices), run.usage()
    if world.group is not None:  # every worker's contexts, and the kvstore's processes
        names = [f"worker{r}:{n}" for r in range(world.size) for n in names]
        extra |= launch.dist_fields(world.group)
    run.save(strategy, extra, names)


def _check(cfg, plan):
    if cfg.image_size != 28:
        raise config.ConfigError("resnet18 trains on Fashion-MNIST at its native 28x28")
    # d2l 13.6: N devices train with N times the batch and the lr (for_devices); every batch,
    # the epoch's last included, splits evenly: no sample is dropped.
    cfg = config.for_devices(cfg, plan.count)
    config.check_epoch_split(data.train_size(cfg.train_subset), cfg.batch_size, plan.count)
