"""ResNet-18 on Fashion-MNIST, concise data parallel in PyTorch (d2l 13.6).

Strategies (`--strategy`), each one function of (net, optimizer, world) that returns (place,
shard, step, correct, total) (common/training.py, "A strategy"):
  ddp (default)  `ddp`: DistributedDataParallel, one process per device started by torchrun
                 (torch_impl/launch.py, which also runs it over several machines): NCCL on GPUs,
                 gloo on CPU.
  dataparallel   `data_parallel`: nn.DataParallel, one process scattering each batch over the
                 GPUs (CUDA only: without CUDA it would silently run the plain module: refused).

BatchNorm: each device normalises its share of the batch (d2l 13.6), and every device evaluates
with device 0's running statistics, as JAX and Gluon do: DDP broadcasts rank 0's buffers before
every forward, DataParallel copies device 0's module to every device. --sync-bn: SyncBatchNorm.
"""

import copy
import os
from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common import cli, config, data, harness, training, utilization, weights
from torch_impl import devices as tdev
from torch_impl import launch
from torch_impl import weights as tweights

FRAMEWORK = "torch"
STRATEGIES = ("ddp", "dataparallel")
NUM_CLASSES = 10


class Residual(nn.Module):
    """d2l's residual block; `shortcut` is the 1x1 strided conv where the shape changes."""

    def __init__(self, in_channels, out_channels, strides=1, use_1x1conv=False, use_bn=True):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=strides, padding=1)
        self.bn1 = nn.BatchNorm2d(out_channels) if use_bn else nn.Identity()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(out_channels) if use_bn else nn.Identity()
        self.shortcut = (
            nn.Conv2d(in_channels, out_channels, 1, stride=strides) if use_1x1conv else None
        )

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.shortcut is not None:
            x = self.shortcut(x)
        return F.relu(y + x)


class ResNet18(nn.Sequential):
    """A Sequential with a forward of its own, which torch.compile traces as one graph (the
    in-place Module.compile traces a plain Sequential block by block). `amp`: torch's bf16 is
    autocast around the forward (JAX's is the model's dtype, MXNet's a process-wide switch)."""

    def __init__(self, layers, amp=False):
        super().__init__(layers)
        self.amp = amp

    def forward(self, x):
        bf16 = torch.autocast(x.device.type, dtype=torch.bfloat16) if self.amp else nullcontext()
        with bf16:
            for layer in self:
                x = layer(x)
        return x


def resnet18(num_classes=NUM_CLASSES, in_channels=1, width=64, use_bn=True, residuals=2, amp=False):
    """d2l's ResNet-18: 3x3 stem, no max-pool, 4 stages of `residuals` blocks; `width` narrows it
    and `residuals=1` halves its depth for tests, `use_bn=False` drops BatchNorm (for exact
    data-parallel == one-device tests), `amp` computes the convolutions in bf16 (--amp bf16)."""

    def norm(c):
        return nn.BatchNorm2d(c) if use_bn else nn.Identity()

    def stage(c_in, c_out, first):
        return nn.Sequential(
            Residual(c_in, c_out, 1 if first else 2, use_1x1conv=not first, use_bn=use_bn),
            *(Residual(c_out, c_out, use_bn=use_bn) for _ in range(residuals - 1)),
        )

    w = [width, 2 * width, 4 * width, 8 * width]
    return ResNet18(
        OrderedDict(
            stem=nn.Sequential(
                OrderedDict(
                    conv=nn.Conv2d(in_channels, w[0], 3, stride=1, padding=1),
                    bn=norm(w[0]),
                    relu=nn.ReLU(),
                )
            ),
            layer1=stage(w[0], w[0], True),
            layer2=stage(w[0], w[1], False),
            layer3=stage(w[1], w[2], False),
            layer4=stage(w[2], w[3], False),
            pool=nn.AdaptiveAvgPool2d(1),
            flatten=nn.Flatten(),
            fc=nn.Linear(w[3], num_classes),
        ),
        amp,
    )


def weight_shapes(net):
    """Names and shapes in the exchange format (parameters and BN running statistics)."""
    return tweights.shapes(net)


def get_weights(net):
    return tweights.get_weights(net)


def set_weights(net, params):
    tweights.set_weights(net, params)  # in place, each tensor on its device
    return net


def init_weights(net, std, seed):
    """d2l init (conv/dense weights normal(0, std), biases 0) from a seed shared by frameworks."""
    return set_weights(net, weights.init_normal(weight_shapes(net), std, seed))


def make_optimizer(net, lr):
    return torch.optim.SGD(net.parameters(), lr=lr)  # plain SGD, no momentum (d2l)


def loss_fn(logits, labels):
    # Mean over the batch, in float32 at least: bf16 autocast hands back bf16 logits.
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), labels)


def train_step(net, optimizer, x, y):
    """One SGD step on a batch; returns its mean loss (not synced)."""
    tdev.new_step()
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(net(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _sync_batch_norm(net):
    """--sync-bn: `net` with a SyncBatchNorm for each BatchNorm, which normalises with the whole
    global batch's statistics, gathered over the process group in every forward (CUDA only:
    common.checks refuses it elsewhere). Before DDP wraps the net."""
    return nn.SyncBatchNorm.convert_sync_batchnorm(net)


def evaluate(net, x, y):
    """Correct predictions on a batch (not synced). A compiled module evaluates eagerly:
    evaluation is not timed, and compiling its mode and shapes would spend time outside the
    warm-up."""
    net.eval()
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        correct = (net(x).argmax(dim=1) == y).sum()
    net.train()
    return correct


# --- the parallelism: one function per strategy ------------------------------------------------


def data_parallel(net, optimizer, world):
    """nn.DataParallel: one process; each step scatters the batch over the world's devices,
    replicates the module, gathers the outputs on the first, and backward sums the gradients
    there."""
    devices = world.devices
    wrapped = nn.DataParallel(net, device_ids=[d.index for d in devices])

    def place(arrays):  # on the first device, where DataParallel scatters from
        return tdev.to_device(data.as_float(arrays, np.int64), devices[0])

    def shard(batches):  # every batch whole, in one copy: DataParallel splits it
        return tdev.one_copy(batches, devices[0])

    def step(x, y, idx):
        return train_step(wrapped, optimizer, x[idx], y[idx]) * len(idx)

    def correct(x, y, idx):
        return evaluate(wrapped, x[idx], y[idx])

    def total(losses, hits):  # one process: nothing to add up across processes
        return float(sum(losses)), float(sum(hits))

    return place, shard, step, correct, total


def ddp(net, optimizer, world):
    """DistributedDataParallel: this process is rank `world.rank` of a process group of one
    process per device (torchrun started them, launch.join joined the group), on its one device,
    taking its row of every global batch. DDP broadcasts rank 0's weights once, and its BatchNorm
    buffers (running statistics) before every forward, evaluation's too; each rank normalises its
    own rows (--sync-bn: SyncBatchNorm, the whole batch), and backward all-reduces (averages)
    the gradients in buckets: every rank takes the same step. One rank has nothing to average,
    yet DDP would all-reduce every gradient: it trains the plain module, as JAX and Gluon do."""
    device, rank, size = world.devices[0], world.rank, world.size
    wrapped = net
    if size > 1:
        ids = [device.index] if device.type == "cuda" else None
        wrapped = nn.parallel.DistributedDataParallel(net, device_ids=ids)

    def place(arrays):  # every rank holds the whole data set on its device
        return tdev.to_device(data.as_float(arrays, np.int64), device)

    def shard(batches):  # this rank's row of every global batch, in one copy
        return tdev.one_copy([data.shard_batch(idx, size)[rank] for idx in batches], device)

    def step(x, y, rows):
        return train_step(wrapped, optimizer, x[rows], y[rows]) * len(rows)

    def correct(x, y, idx):  # this rank's share of the test batch, with rank 0's statistics
        rows = np.array_split(idx, size)[rank]
        return evaluate(wrapped, x[rows], y[rows])

    def total(losses, hits):  # summed over the ranks: one all-reduce of both
        return world.sum(np.array([float(sum(losses)), float(sum(hits))])).tolist()

    return place, shard, step, correct, total


def train(net, cfg, ds, strategy, run):
    """d2l's train loop on preloaded arrays: `strategy` (one of the functions above) spreads each
    step over the devices; `run` (common.harness.Run) times, logs and records it."""
    place, shard, step, correct, total = strategy(net, make_optimizer(net, cfg.lr), run.world)
    x_train, y_train, x_test, y_test = place(ds)
    initial = copy.deepcopy(net.state_dict())
    # each batch shape once (compilation, autotuning); the clock waits for the devices
    for part in run.warm_up(shard, sync=lambda: tdev.sync(run.world.devices)):
        step(x_train, y_train, part)
    net.load_state_dict(initial)  # the epochs start from the initial weights
    for parts in run.epochs(shard):  # iterating `parts` is the timed epoch
        losses = [step(x_train, y_train, part) for part in parts]
        hits = [correct(x_test, y_test, idx) for idx in run.test_batches()]
        run.log(*total(losses, hits))


def main(args, plan, cfg, hooks):
    """Check everything; then start one DDP rank per device with torchrun (torch_impl/launch.py),
    or train here: join the world (a DDP rank joins its group), build, train, record (rank 0)."""
    strategy = training.choose_strategy("resnet18", FRAMEWORK, args.strategy, STRATEGIES)
    nodes = launch.Nodes.of(args)  # several machines: `--gpus` devices on each
    _check(cfg, plan if nodes is None else replace(plan, count=plan.count * nodes.count), strategy)
    if strategy == "ddp" and not launch.is_worker():  # the launcher: a rank per device
        launch.torchrun(cli.worker_argv(args, strategy="ddp"), plan.count, "DDP training", nodes)
        return
    world = launch.join(plan, args)
    # d2l 13.6: 2 devices train with batch 512 and lr 0.2 (the one-device values times 2).
    cfg = config.for_devices(cfg, world.plan.count)
    ds = data.load_subsets(cfg.train_subset, cfg.test_subset, cfg.seed)
    device = world.devices[0]
    net = init_weights(resnet18(amp=args.amp == "bf16"), cfg.init_std, cfg.seed).to(device)
    if args.sync_bn:  # the whole batch's statistics across the ranks (CUDA: checks.check_sync_bn)
        net = _sync_batch_norm(net)
    net = tdev.gpu_layout(net, device)
    # --compile: in place, before DDP or DataParallel wraps it, as torch's docs advise; it
    # compiles (and captures CUDA graphs) in the warm-up, never in a timed epoch.
    calls = tdev.compile_model(net, device, world.size) if args.compile else 1
    run = harness.Run(args, cfg, ds, world, hooks=hooks, calls=calls)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) * len(world.devices)  # on this machine
    with run.sampling(utilization.sampler_for(plan.platform, local if world.rank == 0 else 0)):
        train(net, cfg, ds, {"ddp": ddp, "dataparallel": data_parallel}[strategy], run)
    names = tdev.device_names(world.devices)
    if world.group is not None:  # a DDP rank knows its own device only
        names = [f"rank{r}:{device.type}" for r in range(world.size)]
    run.save(strategy, _extra(args, run, world), names)


def _check(cfg, plan, strategy):
    if cfg.image_size != 28:
        raise config.ConfigError("resnet18 trains on Fashion-MNIST at its native 28x28")
    # d2l 13.6: N devices train with N times the batch and the lr (for_devices); every batch,
    # the epoch's last included, splits evenly: no sample is dropped.
    cfg = config.for_devices(cfg, plan.count)
    config.check_epoch_split(data.train_size(cfg.train_subset), cfg.batch_size, plan.count)
    if strategy == "dataparallel" and plan.platform != "gpu":
        raise config.ConfigError(
            "strategy dataparallel needs CUDA GPUs (nn.DataParallel without CUDA silently "
            "runs one module); use --strategy ddp"
        )


def _extra(args, run, world):
    """The record's torch fields: every rank's usage, the world, --compile's and the threads."""
    gpu = world.plan.platform == "gpu"
    extra = tdev.gather_usage(run.usage(), world.devices, gpu, world.size)
    extra |= {"world_size": world.size, "ddp_wrapper": world.size > 1}
    # --compile: its mode, and the graphs left out of CUDA graphs
    extra |= tdev.compile_fields(args.compile, world.devices[0], world.size)
    extra["nnodes"] = int(os.environ.get("GROUP_WORLD_SIZE", 1))  # torchrun's: the nodes
    if os.environ.get("OMP_NUM_THREADS"):
        extra["omp_num_threads_env"] = os.environ["OMP_NUM_THREADS"]
    return extra
