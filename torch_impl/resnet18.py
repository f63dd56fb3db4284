"""ResNet-18 on Fashion-MNIST, concise data parallel in PyTorch (d2l 13.6).

Strategies (`--strategy`):
  ddp (default)  DistributedDataParallel, one process per device started by torchrun
                 (`python -m torch.distributed.run`): NCCL on GPUs, gloo on CPU. Each rank takes
                 its contiguous slice of every global batch, so a global batch is the one-device
                 batch; gradients are all-reduced by DDP, test accuracy by all-reducing counts.
                 BatchNorm statistics stay per rank (DDP's default; buffers come from rank 0).
  dataparallel   nn.DataParallel, one process scattering each batch over the GPUs (CUDA only:
                 without CUDA it would silently run the plain module, so it is refused).

Several machines: `main()` starts one machine's torchrun with `--standalone`. For N nodes run the
worker entry of this module on every node with the same arguments as `python -m torch_impl`:

  python -m torch.distributed.run --nnodes=2 --node-rank=R --nproc-per-node=G \
      --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \
      -m torch_impl.resnet18 --workload resnet18 --gpus G [--preset ...] [--results ...]

(R = 0 on HOST, 1 on the other; `--gpus` is per node; the world size is nnodes x G and the
batch and lr scale with it). Two "nodes" on one machine work the same with HOST=127.0.0.1.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from collections import OrderedDict

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from common import cli, config, data, devices, results, timing, utilization, weights
from torch_impl import devices as tdev

STRATEGIES = ("ddp", "dataparallel")
NUM_CLASSES = 10
COLLECTIVE_TIMEOUT_S = 300  # a rank stuck in a collective fails after this, never hangs forever
FAIL_RANK_ENV = "RESNET18_FAIL_RANK"  # tests only: this rank exits after its first step


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
    return nn.Sequential(
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


def train_step(net, optimizer, x, y, scale=1.0, amp=False):
    """One SGD step; `scale` weights this shard's mean loss by its share of the global batch."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp):
        logits = net(x)
    loss = loss_fn(logits, y)
    (loss * scale).backward()
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


def shard_batch(idx, rank, world):
    """DistributedSampler-like: this rank's contiguous slice of the global batch `idx`, and its
    share of the batch, so DDP's gradient average equals the one-device mean even when the last
    batch does not divide evenly."""
    part = np.array_split(idx, world)[rank]
    return part, len(part) * world / len(idx)


def ddp_launch(args, plan):
    """Start torchrun with one worker per device; the workers run `ddp_worker` (below)."""
    nproc = plan.count
    argv = worker_argv(args)
    env = dict(os.environ)
    # torchrun sets OMP_NUM_THREADS=1 when unset (DESIGN.md section 9): share the cores instead.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--monitor-interval=0.5",
        "-m",
        "torch_impl.resnet18",
        *argv,
    ]
    rc = subprocess.run(cmd, env=env).returncode
    if rc != 0:
        raise SystemExit(
            f"error: DDP training failed: a worker exited with an error (torchrun exit {rc}); "
            "see the worker output above"
        )


def worker_argv(args):
    """The command line that reproduces `args` for the worker entry."""
    argv = ["--workload", args.workload, "--gpus", str(args.gpus), "--platform", args.platform]
    argv += ["--preset", args.preset, "--strategy", "ddp", "--amp", args.amp]
    argv += ["--results", str(args.results)]
    for flag, value in (
        ("--epochs", args.epochs),
        ("--batch-size", args.batch_size),
        ("--lr", args.lr),
    ):
        if value is not None:
            argv += [flag, str(value)]
    return argv + (["--no-progress"] if args.no_progress else [])


def ddp_worker(argv):
    """One rank: torchrun set RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous in the environment."""
    args = cli.parser("torch").parse_args(argv)
    local = devices.plan(int(os.environ["LOCAL_WORLD_SIZE"]), args.platform)
    plan = devices.DevicePlan(int(os.environ["WORLD_SIZE"]), local.platform, local.virtual)
    gpu = plan.platform == "gpu"
    if gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(
        "nccl" if gpu else "gloo", timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    )
    try:
        device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}") if gpu else torch.device("cpu")
        run(args, plan, "ddp", [device], dist.get_rank(), dist.get_world_size())
    finally:
        dist.destroy_process_group()


def data_parallel(net, devs):
    """nn.DataParallel: scatter each batch over `devs` in one process (CUDA only)."""
    return nn.DataParallel(net, device_ids=[d.index for d in devs])


def train(net, cfg, ds, device, rank=0, world=1, amp=False, sampler=None, no_progress=False):
    """d2l's train loop on preloaded arrays; returns losses, accuracies and epoch times."""
    x_train = torch.from_numpy(data.to_float(ds[0])).to(device)
    y_train = torch.from_numpy(ds[1].astype(np.int64)).to(device)
    x_test = torch.from_numpy(data.to_float(ds[2])).to(device)
    y_test = torch.from_numpy(ds[3].astype(np.int64)).to(device)
    optimizer = make_optimizer(net, cfg.lr)
    sampler = sampler or utilization.Sampler("cpu_time")
    timer = timing.Timer(lambda: tdev.sync([device]), warmup=1)
    out = {"train_loss": [], "test_acc": [], "sec_per_epoch": [], "timed_steps": [], "images": 0}
    first = data.batches(len(y_train), cfg.batch_size, cfg.seed, 0)
    full_steps = len(first)
    # Warm-up apart from the epochs (cuDNN autotuning, allocator): one step of each batch shape
    # the epochs will use, then the initial weights are restored, so every epoch is timed whole.
    warmup = data.warmup_batches(first[: cfg.steps_per_epoch])
    initial = {k: v.detach().clone() for k, v in net.state_dict().items()}
    with timer.region():
        for sel, scale in device_batches(warmup, rank, world, device):
            run_step(net, optimizer, x_train, y_train, sel, scale, amp)
    net.load_state_dict(initial)
    if os.environ.get(FAIL_RANK_ENV) == str(rank):
        os._exit(1)  # tests: a worker dies mid-run; torchrun must end the others
    for epoch in range(cfg.epochs):
        steps = data.batches(len(y_train), cfg.batch_size, cfg.seed, epoch)
        steps = steps[: cfg.steps_per_epoch]
        total = torch.zeros((), device=device)
        bar = cli.progress(range(len(steps)), len(steps), f"epoch {epoch + 1}", no_progress or rank)
        with sampler.measure(), timer.region():
            for sel, scale in device_batches(steps, rank, world, device):
                total += run_step(net, optimizer, x_train, y_train, sel, scale, amp)
                bar.update(1)
        bar.close()
        seen = sum(len(b) for b in steps)
        if world > 1:
            dist.all_reduce(total)
        out["train_loss"].append(float(total) / seen)
        out["sec_per_epoch"].append(timer.times[-1] * full_steps / len(steps))
        out["timed_steps"].append(len(steps))
        out["images"] += seen
        test_x, test_y = x_test, y_test
        if world > 1:  # each rank evaluates its slice; counts are summed
            part = np.array_split(np.arange(len(y_test)), world)[rank]
            test_x, test_y = x_test[part[0] : part[-1] + 1], y_test[part[0] : part[-1] + 1]
        # DDP: each rank runs its local module (no collectives); DataParallel scatters as usual.
        module = net.module if isinstance(net, nn.parallel.DistributedDataParallel) else net
        counts = torch.tensor(  # on the device: NCCL reduces CUDA tensors only
            evaluate(module, test_x, test_y, max(256, cfg.batch_size), amp),
            dtype=torch.float64,
            device=device,
        )
        if world > 1:
            dist.all_reduce(counts)
        out["test_acc"].append(float(counts[0] / counts[1]))
        if rank == 0:
            print(
                f"epoch {epoch + 1}/{cfg.epochs}: train loss {out['train_loss'][-1]:.4f}, "
                f"test acc {out['test_acc'][-1]:.4f}, {out['sec_per_epoch'][-1]:.2f} s/epoch",
                flush=True,
            )
    out["full_steps"] = full_steps
    out["warmup_seconds"] = timer.warmup_seconds
    out["timed_seconds"] = sum(timer.times)
    return out


def device_batches(steps, rank, world, device):
    """(indices on `device`, scale) of this rank's slice of every global batch in `steps`, from
    one host-to-device copy: a copy per step (`.to` waits for the GPU to finish what is queued)
    would stop the CPU from queueing the next step while the GPU runs this one."""
    parts = [shard_batch(idx, rank, world) for idx in steps]
    flat = torch.from_numpy(np.concatenate([part for part, _ in parts])).to(device)
    ends = np.cumsum([len(part) for part, _ in parts])
    return [(flat[end - len(p) : end], scale) for (p, scale), end in zip(parts, ends, strict=True)]


def run_step(net, optimizer, x_train, y_train, sel, scale, amp):
    """One global batch: this rank's slice `sel`, weighted by `scale` (its share of the global
    batch); returns the loss summed over the slice."""
    loss = train_step(net, optimizer, x_train[sel], y_train[sel], scale, amp)
    return loss * len(sel)


def run(args, plan, strategy, devs, rank, world):
    """Build, train and (rank 0) record one run; shared by the DDP worker and DataParallel."""
    cfg = config.for_devices(
        config.get_config(args.workload, args.preset, **cli.overrides(args)), plan.count
    )
    ds = data.load()
    x_tr, y_tr = data.subset(ds.train_images, ds.train_labels, cfg.train_subset, cfg.seed)
    x_te, y_te = data.subset(ds.test_images, ds.test_labels, cfg.test_subset, cfg.seed)
    net = init_weights(resnet18(), cfg.init_std, cfg.seed).to(devs[0])
    if devs[0].type == "cuda":
        # Fixed shapes: cuDNN times its algorithms once, in the warm-up; channels-last (NHWC)
        # is the layout tensor cores want, and spares a transpose around every convolution.
        torch.backends.cudnn.benchmark = True
        net = net.to(memory_format=torch.channels_last)
    if strategy == "ddp":
        net = nn.parallel.DistributedDataParallel(
            net, device_ids=[devs[0].index] if devs[0].type == "cuda" else None
        )
    else:
        net = data_parallel(net, devs)
    gpu = plan.platform == "gpu"
    source = "nvml" if gpu else "cpu_time"
    indices = utilization.visible_gpu_indices(
        len(devs) if strategy == "dataparallel" else int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    )
    with utilization.Sampler(source, indices if rank == 0 else []) as sampler:
        out = train(
            net,
            cfg,
            (x_tr, y_tr, x_te, y_te),
            devs[0],
            rank,
            world,
            args.amp == "bf16",
            sampler,
            args.no_progress,
        )
    usage = [sampler.result()]
    peaks = [torch.cuda.max_memory_allocated(d) for d in devs] if gpu else []
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, (usage[0], peaks))
        usage, peaks = [u for u, _ in gathered], [p for _, ps in gathered for p in ps]
    if rank != 0:
        return
    stats = timing.summarize(out["sec_per_epoch"])
    extrapolated = any(n != out["full_steps"] for n in out["timed_steps"])
    usage = utilization.merge(usage)
    if gpu:
        usage = utilization.with_allocator_peaks(usage, peaks, "torch.cuda.max_memory_allocated")
    extra = {
        **usage,
        "omp_num_threads": torch.get_num_threads(),
        "world_size": world,
    }
    if os.environ.get("OMP_NUM_THREADS"):
        extra["omp_num_threads_env"] = os.environ["OMP_NUM_THREADS"]
    names = (
        tdev.device_names(devs)
        if strategy == "dataparallel"
        else [f"rank{r}:{devs[0].type}" for r in range(world)]
    )
    rec = cli.make_record(
        "torch",
        args,
        plan,
        cfg,
        names,
        tdev.versions(),
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
        extra={**extra, "amp": args.amp},
    )
    results.append(rec, args.results)
    print(f"{out['images'] / out['timed_seconds']:.1f} images/sec ({strategy})")
    print(cli.final_line(rec.test_acc, stats.median, plan, extrapolated), flush=True)


def main(args, plan):
    strategy = args.strategy or "ddp"
    if strategy not in STRATEGIES:
        raise config.ConfigError(
            f"unknown resnet18 strategy {strategy!r} for torch; "
            f"choose one of {', '.join(STRATEGIES)}"
        )
    cfg = config.for_devices(
        config.get_config(args.workload, args.preset, **cli.overrides(args)), plan.count
    )
    if cfg.image_size != 28:
        raise config.ConfigError("resnet18 trains on Fashion-MNIST at its native 28x28")
    # Every batch, the epoch's last included, splits evenly: no sample is dropped.
    config.check_epoch_split(data.train_size(cfg.train_subset), cfg.batch_size, plan.count)
    if strategy == "dataparallel":
        if plan.platform != "gpu":
            raise config.ConfigError(
                "strategy dataparallel needs CUDA GPUs (nn.DataParallel without CUDA silently "
                "runs one module); use --strategy ddp"
            )
        run(args, plan, strategy, tdev.get_devices(plan), 0, 1)
        return
    ddp_launch(args, plan)


if __name__ == "__main__":  # the DDP worker entry, started by torchrun (see the docstring)
    try:
        ddp_worker(sys.argv[1:])
    except cli.USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(cli.EXIT_BAD_INPUT)
