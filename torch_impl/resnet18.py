"""ResNet-18 on Fashion-MNIST, concise data parallel in PyTorch (d2l 13.6).

Strategies (`--strategy`), each in one function below:
  ddp (default)  `ddp`: DistributedDataParallel, one process per device started by torchrun
                 (torch_impl/launch.py): NCCL on GPUs, gloo on CPU. Each rank takes its row of
                 every global batch (common.data.shard_batch), so a global batch is the one-device
                 batch; DDP all-reduces the gradients during backward, the test accuracy is an
                 all-reduce of counts. BatchNorm statistics stay per rank (DDP's default).
  dataparallel   `data_parallel`: nn.DataParallel, one process scattering each batch over the
                 GPUs (CUDA only: without CUDA it would silently run the plain module: refused).

Several machines (ddp): the same command on every node, with `--gpus` per node:

  python -m torch_impl --workload resnet18 --gpus G --nnodes 2 --node-rank R \
      --rdzv-endpoint HOST:29500 [--rdzv-timeout 300] [--preset ...] [--results ...]

R = 0 on HOST, whose torchrun hosts the rendezvous on port 29500, and 1 on the other. The world
size is nnodes x G and the batch and lr scale with it; the record (extra.nnodes) is appended to
`--results` on the node that torchrun makes rank 0 (c10d numbers the nodes itself). Two "nodes"
on one machine work the same with HOST=127.0.0.1. What each node runs (torch_impl/launch.py,
through torch_impl/torchrun.py):

  python -m torch.distributed.run --nnodes=2 --nproc-per-node=G --rdzv-backend=c10d \
      --rdzv-endpoint=HOST:29500 --rdzv-id=multidevice \
      --rdzv-conf=is_host=true,join_timeout=360,read_timeout=360 -m torch_impl.resnet18 ...

(is_host=false on the other nodes). torch's waits end in tracebacks, and a client of a busy port
waits forever (torch 2.15): node 0 checks that the port is free, every node waits at most
`--rdzv-timeout` s (torch's are 60 s later); a busy port or a missing node: one line, exit 2.
Ctrl-C stops the node's torchrun and workers (exit 130, "interrupted; no record written"); the
other nodes then fail (tracebacks for the lost peer, then a line of their own).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
from collections import OrderedDict

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from common import (
    ceiling,
    cli,
    config,
    data,
    devices,
    profiling,
    timing,
    training,
    utilization,
    weights,
)
from torch_impl import devices as tdev
from torch_impl import launch

FRAMEWORK = "torch"
STRATEGIES = ("ddp", "dataparallel")
NUM_CLASSES = 10
COLLECTIVE_TIMEOUT_S = 300  # a rank stuck in a collective fails after this, never hangs forever


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
    """A Sequential with a forward of its own: torch 2.11's Module.compile traces it as one graph,
    a plain one block by block (8 graphs, stem and head eager: one H100, 2.3 s/epoch, as eager)."""

    def forward(self, x):
        for layer in self:
            x = layer(x)
        return x


def resnet18(num_classes=NUM_CLASSES, in_channels=1, width=64, use_bn=True):
    """d2l's ResNet-18: 3x3 stem, no max-pool, 4 stages of 2 blocks; `width` narrows it for tests,
    `use_bn=False` drops BatchNorm (for exact data-parallel == one-device tests)."""

    def norm(c):
        return nn.BatchNorm2d(c) if use_bn else nn.Identity()

    def stage(c_in, c_out, first):
        return nn.Sequential(
            Residual(c_in, c_out, 1 if first else 2, use_1x1conv=not first, use_bn=use_bn),
            Residual(c_out, c_out, use_bn=use_bn),
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
        )
    )


def weight_shapes(net):
    """Names and shapes in the exchange format (parameters and BN running statistics)."""
    return {k: tuple(v.shape) for k, v in get_weights(net).items()}


def get_weights(net):
    # num_batches_tracked is torch-only bookkeeping, not a weight; float64 (tests) stays float64;
    # a copy, since on the CPU .numpy() shares memory.
    return {
        k: v.detach().to(torch.promote_types(v.dtype, torch.float32)).cpu().numpy().copy()
        for k, v in net.state_dict().items()
        if not k.endswith("num_batches_tracked")
    }


def set_weights(net, params):
    weights.check_shapes(params, weight_shapes(net))
    state = {k: torch.from_numpy(np.asarray(v)) for k, v in params.items()}
    net.load_state_dict(state, strict=False)  # strict=False: num_batches_tracked is kept
    return net


def init_weights(net, std, seed):
    """d2l init (conv/dense weights normal(0, std), biases 0) from a seed shared by frameworks."""
    return set_weights(net, weights.init_normal(weight_shapes(net), std, seed))


def make_optimizer(net, lr):
    return torch.optim.SGD(net.parameters(), lr=lr)  # plain SGD, no momentum (d2l)


def loss_fn(logits, labels):
    # Mean over the batch, in float32 at least: bf16 autocast hands back bf16 logits.
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), labels)


def train_step(net, optimizer, x, y, amp=False):
    """One SGD step on this process's batch; returns its mean loss (not synced)."""
    # A new step: CUDA graphs (--compile on one GPU) may reuse the last step's output memory.
    torch.compiler.cudagraph_mark_step_begin()
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp):
        logits = net(x)
    loss = loss_fn(logits, y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def evaluate(net, images, labels, batch_size, amp=False):
    """(correct, count) on `images`; the caller all-reduces the counts across ranks."""
    net.eval()
    correct = torch.zeros((), dtype=torch.int64, device=images.device)
    with torch.no_grad(), torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=amp):
        for i in range(0, len(labels), batch_size):
            pred = net(images[i : i + batch_size]).argmax(dim=1)
            correct += (pred == labels[i : i + batch_size]).sum()
    net.train()
    return int(correct), len(labels)


# --- the parallelism: one function per strategy ------------------------------------------------


def data_parallel(net, devs):
    """nn.DataParallel: one process; each step scatters the batch over `devs`, replicates the
    module, gathers the outputs on devs[0], and backward sums the gradients there (CUDA only)."""
    return nn.DataParallel(net, device_ids=[d.index for d in devs])


def ddp(net, device):
    """DistributedDataParallel: this process is one rank of the process group (torchrun started
    one per device). DDP broadcasts rank 0's weights, and during backward all-reduces (averages)
    the gradients in buckets, so every rank takes the same step on its row of the batch. One rank
    has nothing to average, but DDP would still all-reduce every gradient (one H100: 3.17 s/epoch,
    DataParallel 2.60): it trains the plain module, as JAX and Gluon do on one device."""
    if dist.get_world_size() == 1:
        return net
    return nn.parallel.DistributedDataParallel(
        net, device_ids=[device.index] if device.type == "cuda" else None
    )


def train(
    net, cfg, ds, devs, strategy, sampler=None, no_progress=False, amp=False, compiled=False,
    probe=None, trace=None,
):  # fmt: skip
    """d2l's train loop on preloaded arrays. Under DDP each process runs this for its rank.
    `amp`: torch's bf16 is an autocast context around each step (JAX's is the model's dtype).
    `compiled`: torch.compile (--compile; JAX's jit, Gluon's hybridize); `probe`: --ceiling;
    `trace`: --profile's profiler around the first timed epoch."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if strategy == "ddp" else (0, 1)
    device = devs[0]
    # --compile: the inner module, in place (its weights keep their names), before DDP or
    # DataParallel wraps it, as torch's docs advise. It compiles (and captures CUDA graphs) in
    # the warm-up below, never in a timed epoch; evaluation runs eagerly.
    calls = tdev.compile_model(net, device, world) if compiled else 1
    net = ddp(net, device) if strategy == "ddp" else data_parallel(net, devs)
    x_train, y_train, x_test, y_test = _to_device(ds, device)
    optimizer = make_optimizer(net, cfg.lr)
    sampler = sampler or utilization.Sampler("cpu_time")
    timer = timing.Timer(lambda: tdev.sync([device]), warmup=1, trace=trace)
    first = data.batches(len(y_train), cfg.batch_size, cfg.seed, 0)
    log = training.EpochLog(cfg.epochs, len(first), quiet=rank != 0, ceiling=probe)
    # Warm-up apart from the epochs (compilation, cuDNN autotuning, allocator): `calls` steps of
    # each batch shape the epochs will use, then the initial weights are restored, so every
    # epoch is timed whole.
    initial = {k: v.detach().clone() for k, v in net.state_dict().items()}
    warmup = data.warmup_batches(first[: cfg.steps_per_epoch]) * calls
    with timer.region():
        for sel in _rows(warmup, rank, world, device):
            train_step(net, optimizer, x_train[sel], y_train[sel], amp)
    net.load_state_dict(initial)
    for epoch in range(cfg.epochs):
        steps = data.batches(len(y_train), cfg.batch_size, cfg.seed, epoch)[: cfg.steps_per_epoch]
        total = torch.zeros((), device=device)
        bar = cli.progress(range(len(steps)), len(steps), f"epoch {epoch + 1}", no_progress or rank)
        with sampler.measure(), timer.region():
            for sel in _rows(steps, rank, world, device):
                total += train_step(net, optimizer, x_train[sel], y_train[sel], amp) * len(sel)
                bar.update(1)
        bar.close()
        seen = sum(len(b) for b in steps)
        if world > 1:
            dist.all_reduce(total)
        acc = _test_accuracy(net, x_test, y_test, max(256, cfg.batch_size), amp, rank, world)
        log.add(float(total) / seen, acc, timer.times[-1], len(steps), seen)
        if log.diverged:  # a non-finite loss: stop, and record what was measured
            break
    return log, timer


def _to_device(ds, device):
    """(x_train, y_train, x_test, y_test) as tensors on `device`, once."""
    x_train, y_train, x_test, y_test = ds
    return (
        torch.from_numpy(data.to_float(x_train)).to(device),
        torch.from_numpy(y_train.astype(np.int64)).to(device),
        torch.from_numpy(data.to_float(x_test)).to(device),
        torch.from_numpy(y_test.astype(np.int64)).to(device),
    )


def _rows(steps, rank, world, device):
    """This rank's row of every global batch in `steps`, from one host-to-device copy: a copy
    per step (`.to` waits for the queued GPU work) would keep the CPU from queueing ahead."""
    rows = [data.shard_batch(idx, world)[rank] for idx in steps]
    flat = torch.from_numpy(np.concatenate(rows)).to(device)
    ends = np.cumsum([len(r) for r in rows])
    return [flat[end - len(r) : end] for r, end in zip(rows, ends, strict=True)]


def _test_accuracy(net, x_test, y_test, batch_size, amp, rank, world):
    """Each rank evaluates its slice of the test set; the counts are summed over the ranks."""
    if world > 1:
        part = data.shard_batch(np.arange(len(y_test)), world)[rank]
        x_test, y_test = x_test[part[0] : part[-1] + 1], y_test[part[0] : part[-1] + 1]
    # DDP: each rank runs its local module (no collectives); DataParallel scatters as usual.
    module = net.module if isinstance(net, nn.parallel.DistributedDataParallel) else net
    # A compiled module (--compile) evaluates eagerly: evaluation is not timed, and compiling
    # its mode and batch shapes would spend time outside the warm-up.
    with torch.compiler.set_stance("force_eager"):
        correct = evaluate(module, x_test, y_test, batch_size, amp)
    counts = torch.tensor(correct, dtype=torch.float64, device=x_test.device)  # NCCL: CUDA only
    if world > 1:
        dist.all_reduce(counts)
    return float(counts[0] / counts[1])


def main(args, plan, cfg):
    """Check everything, then start the DDP workers (torchrun) or run DataParallel here."""
    strategy = training.choose_strategy("resnet18", FRAMEWORK, args.strategy, STRATEGIES)
    nodes = launch.Nodes.of(args)  # several machines: `--gpus` devices on each
    world = plan if nodes is None else dataclasses.replace(plan, count=plan.count * nodes.count)
    _check(cfg, world, strategy)
    if strategy == "dataparallel":
        _run(args, plan, cfg, strategy, tdev.get_devices(plan))
        return
    argv = _worker_argv(args)
    launch.torchrun("torch_impl.resnet18", argv, plan.count, "DDP training", nodes)


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


def _run(args, plan, cfg, strategy, devs):
    """Train and (rank 0) record one run: the DataParallel process, or one DDP rank."""
    # d2l 13.6: 2 devices train with batch 512 and lr 0.2 (the one-device values times 2).
    cfg = config.for_devices(cfg, plan.count)
    ds = data.load_subsets(cfg.train_subset, cfg.test_subset, cfg.seed)
    net = tdev.gpu_layout(init_weights(resnet18(), cfg.init_std, cfg.seed).to(devs[0]), devs[0])
    local = len(devs) if strategy == "dataparallel" else int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    rank = dist.get_rank() if strategy == "ddp" else 0
    with utilization.sampler_for(plan.platform, local if rank == 0 else 0) as sampler:
        log, timer = train(
            net, cfg, ds, devs, strategy, sampler, args.no_progress, args.amp == "bf16",
            args.compile, ceiling.paired(FRAMEWORK, args, cfg, devs[0]),  # --ceiling
            profiling.tracer(FRAMEWORK, args, "epoch", rank),  # --profile
        )  # fmt: skip
    world = dist.get_world_size() if strategy == "ddp" else 1
    usage = tdev.gather_usage(sampler.result(), devs, plan.platform == "gpu", world)
    if rank != 0:
        return
    ranks = [f"rank{r}:{devs[0].type}" for r in range(world)]
    names = tdev.device_names(devs) if strategy == "dataparallel" else ranks
    extra = {**usage, "world_size": world}  # threads: cli.make_record
    extra["ddp_wrapper"] = strategy == "ddp" and world > 1  # one rank: the plain module (ddp)
    extra |= tdev.compile_fields(args.compile, devs[0], world)  # --compile: mode, graphs left out
    extra["nnodes"] = int(os.environ.get("GROUP_WORLD_SIZE", 1))  # torchrun's: the nodes
    if os.environ.get("OMP_NUM_THREADS"):
        extra["omp_num_threads_env"] = os.environ["OMP_NUM_THREADS"]
    rec = cli.make_record(
        FRAMEWORK, args, plan, cfg, names, tdev.versions(), strategy=strategy,
        **log.record_fields(timer.warmup_seconds), extra={**extra, "amp": args.amp},
    )  # fmt: skip
    cli.save(rec, args.results, plan)


# --- torch only: the DDP worker, one process per device, started by torchrun ------------------


def _worker_argv(args):
    """The command line that reproduces `args` for the worker entry."""
    argv = ["--workload", args.workload, "--gpus", str(args.gpus), "--platform", args.platform]
    argv += ["--preset", args.preset, "--strategy", "ddp", "--amp", args.amp]
    argv += ["--results", str(args.results)]
    argv += ["--profile", args.profile] if args.profile else []
    overrides = (("--epochs", args.epochs), ("--batch-size", args.batch_size), ("--lr", args.lr))
    argv += [part for flag, v in overrides if v is not None for part in (flag, str(v))]
    argv += [flag for flag, on in (("--compile", args.compile), ("--ceiling", args.ceiling)) if on]
    return argv + (["--no-progress"] if args.no_progress else [])


def ddp_worker(argv):
    """One rank: torchrun set RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous in the environment."""
    args = cli.parser(FRAMEWORK).parse_args(argv)
    local = devices.plan(int(os.environ["LOCAL_WORLD_SIZE"]), args.platform)
    plan = devices.DevicePlan(int(os.environ["WORLD_SIZE"]), local.platform, local.virtual)
    gpu = plan.platform == "gpu"
    if gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(
        "nccl" if gpu else "gloo", timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    )
    launch.signal_ready()  # every node has joined: the launcher's wait ends
    try:
        device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}") if gpu else torch.device("cpu")
        _run(args, plan, cli.config_of(args), "ddp", [device])
    finally:
        launch.end_process_group()


if __name__ == "__main__":  # the DDP worker entry, started by torchrun (see the docstring)
    launch.worker_main(ddp_worker, sys.argv[1:])
