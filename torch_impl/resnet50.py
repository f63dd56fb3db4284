"""ResNet-50 split over devices: model parallel and pipelined, after the PyTorch tutorial
"Single-machine model parallel best practices", timed correctly (docs/design.md).

Read in order: the toy model (the whole idea in ten lines), the network and how it is cut into
stages, the model-parallel and pipelined models, the training loop, the split-size sweep, main.
torch only: `gpipe` and `1f1b` run the same stages on torch.distributed.pipelining, one process
per stage started through torchrun (gloo on CPU, NCCL on GPU).
"""

import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn, optim
from torchvision.models.resnet import Bottleneck, ResNet

from common import cli, config, profiling, stages, timing
from common.stages import stage_blocks
from torch_impl import devices as tdev
from torch_impl import launch

FRAMEWORK = "torch"
STRATEGIES = ("single", "model_parallel", "pipeline", "gpipe", "1f1b")


class ToyModel(nn.Module):
    """The tutorial's first example: one layer per device, the activation moved in between."""

    def __init__(self, devices):
        super().__init__()
        self.devices = [devices[0], devices[-1]]
        self.net1 = nn.Linear(10, 10).to(self.devices[0])
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5).to(self.devices[1])

    def forward(self, x):
        x = self.relu(self.net1(x.to(self.devices[0])))
        return self.net2(x.to(self.devices[1]))


def train_toy(devices, lr=0.001, seed=0):
    """One SGD step of ToyModel; autograd follows the activation back across devices.
    Returns the model (updated in place) and the loss before the step."""
    torch.manual_seed(seed)
    model = ToyModel(devices)
    inputs, labels = torch.randn(20, 10), torch.randn(20, 5)
    optimizer = optim.SGD(model.parameters(), lr=lr)
    optimizer.zero_grad()
    outputs = model(inputs)
    loss = nn.functional.mse_loss(outputs, labels.to(outputs.device))  # labels go to the output
    loss.backward()
    optimizer.step()
    return model, loss.item()


def resnet50(num_classes=1000):
    """torchvision's ResNet-50 (Bottleneck, [3, 4, 6, 3]), as the tutorial builds it."""
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes=num_classes)


def get_weights(model):
    """The shared weight format (common/weights.py): torch's state_dict is already its layout."""
    state = model.state_dict()
    return {k: v.detach().cpu().numpy() for k, v in state.items() if "num_batches" not in k}


def set_weights(model, params):
    """Copy shared-format arrays into `model` in place (each tensor stays on its device)."""
    state = {k: torch.as_tensor(v) for k, v in params.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if "num_batches" not in k]
    if missing or unexpected:
        raise ValueError(f"weights do not match: missing {missing[:3]}, extra {unexpected[:3]}")


def split_into_stages(model, devices):
    """One nn.Sequential per device, made of `model`'s own layers (shared, not copied), moved
    to its device. On two devices this is the tutorial's split: stage 1 = stem (conv1, bn1,
    relu, maxpool) + layer1 + layer2, stage 2 = layer3 + layer4 + avgpool + fc; on more, the
    blocks are cut into contiguous stages of balanced FLOPs (common.stages.stage_blocks)."""
    parts = {
        "stem": [model.conv1, model.bn1, model.relu, model.maxpool],
        "head": [model.avgpool, nn.Flatten(1), model.fc],
    }
    stages = []
    for names, device in zip(stage_blocks(len(devices)), devices, strict=True):
        layers = [m for b in names for m in (parts[b] if b in parts else [model.get_submodule(b)])]
        stages.append(nn.Sequential(*layers).to(device))
    return stages


class ModelParallelResNet50(ResNet):
    """Stage i on devices[i]; the activation moves to the next device between stages."""

    def __init__(self, devices, num_classes=1000):
        super().__init__(Bottleneck, [3, 4, 6, 3], num_classes=num_classes)
        self.devices = list(devices)
        # A plain list, not a ModuleList: the stages share the model's layers, and registering
        # them again would give every weight a second name in state_dict().
        self.stages = split_into_stages(self, self.devices)

    def forward(self, x):
        for stage, device in zip(self.stages, self.devices, strict=True):
            x = stage(x.to(device))
        return x


class PipelineParallelResNet50(ModelParallelResNet50):
    """The batch cut into micro-batches of `split_size` (the last one may be smaller): while
    stage s+1 works on micro-batch i, stage s works on micro-batch i+1 (CUDA launches are
    asynchronous, so both devices run at once; on CPU the ops run one after another)."""

    def __init__(self, devices, split_size=20, num_classes=1000):
        super().__init__(devices, num_classes)
        self.split_size = split_size

    def forward(self, x):
        config.check_split_size(self.split_size, len(x))
        acts = list(x.split(self.split_size, dim=0))
        n, m = len(self.stages), len(acts)
        # At tick t stage s takes micro-batch t - s; later stages are launched first, so for two
        # stages this is the tutorial's loop exactly.
        for t in range(m + n - 1):
            for s in reversed(range(n)):
                if 0 <= t - s < m:
                    acts[t - s] = self.stages[s](acts[t - s].to(self.devices[s]))
        return torch.cat(acts)


def make_data(cfg, devices, dtype=torch.float32):
    """num_batches batches of random images, made on the first device before any clock starts,
    and one-hot labels on the last device (where the output lands); `dtype`: float64 in tests."""
    gen = torch.Generator(device=devices[0]).manual_seed(cfg.seed)
    shape = (cfg.num_batches, cfg.batch_size, 3, cfg.image_size, cfg.image_size)
    inputs = torch.randn(shape, generator=gen, device=devices[0]).to(dtype)
    classes = torch.randint(
        0, cfg.num_classes, (cfg.num_batches, cfg.batch_size), generator=torch.Generator()
    )
    labels = nn.functional.one_hot(classes, cfg.num_classes).to(dtype).to(devices[-1])
    return inputs, labels


def measure_stages(model, cfg, repeats=3):
    """For the compare report's pipeline model: seconds each stage takes for one whole batch,
    forward and backward, on its own device, stages run one after another (median of
    `repeats`); parameters per stage; peak memory per stage (torch.cuda.max_memory_allocated,
    read before this runs) or else parameter + gradient bytes."""
    x = make_data(dataclasses.replace(cfg, num_batches=1), model.devices)[0][0]
    seconds, params, memory = [], [], []
    for i, (stage, device) in enumerate(zip(model.stages, model.devices, strict=True)):
        x = x.to(device).detach().requires_grad_(i > 0)  # later stages need the input grad

        def step(stage=stage, x=x):
            out = stage(x)
            out.backward(torch.ones_like(out))

        timer = timing.benchmark(step, lambda device=device: tdev.sync([device]), repeats)
        seconds.append(timer.stats().median)
        params.append(sum(p.numel() for p in stage.parameters()))
        if device.type == "cuda":
            memory.append(torch.cuda.max_memory_allocated(device))
        else:
            memory.append(sum(2 * p.numel() * p.element_size() for p in stage.parameters()))
        with torch.no_grad():
            x = stage(x)
    model.zero_grad(set_to_none=True)
    source = "max_memory_allocated" if model.devices[0].type == "cuda" else "param_grad_bytes"
    return {
        "num_stages": len(model.stages),
        "stage_blocks": [list(b) for b in stage_blocks(len(model.stages))],
        "stage_seconds": seconds,
        "stage_params": params,
        "stage_peak_memory_bytes": memory,
        "memory_source": source,
    }


def train(model, cfg, devices, train_bn=True, split_sizes=(None,), traces=None):
    """The tutorial's loop: MSE on one-hot labels, SGD, `num_batches` steps per timed repeat,
    `warmup` repeats apart; several `split_sizes` (the sweep) taken round-robin
    (stages.round_robin). train_bn=False: BatchNorm uses its running statistics, so
    micro-batches change nothing (tests). `traces`: --profile's, per split size. Returns a
    Timer and every loss per split size."""
    model.train(train_bn)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(model.parameters(), lr=cfg.lr)
    inputs, labels = make_data(cfg, devices, next(model.parameters()).dtype)
    timers = {
        s: timing.Timer(lambda: tdev.sync(devices), cfg.warmup, trace=traces and traces[s])
        for s in split_sizes
    }
    losses = {s: [] for s in split_sizes}
    for split_size in stages.round_robin(split_sizes, cfg.warmup, cfg.repeats):
        model.split_size = split_size  # None: the whole batch (single, model_parallel)
        with timers[split_size].region():
            for b in range(cfg.num_batches):
                torch.compiler.cudagraph_mark_step_begin()  # --compile's CUDA graphs: a new step
                optimizer.zero_grad()
                outputs = model(inputs[b])
                loss = loss_fn(outputs, labels[b])
                loss.backward()
                optimizer.step()
                # read after the clock stops: .item() would sync
                losses[split_size].append(loss.detach())
    return {s: (timers[s], [loss.item() for loss in losses[s]]) for s in split_sizes}


def build(strategy, devices, split_size, num_classes):
    if strategy == "single":
        return resnet50(num_classes).to(devices[0])
    if strategy == "model_parallel":
        return ModelParallelResNet50(devices, num_classes)
    return PipelineParallelResNet50(devices, split_size, num_classes)


def run_strategy(args, plan, cfg, devs, strategy, split_sizes=(None,), sweep=False):
    """Build, train, time and record one strategy, a record per split size; returns them."""
    used = stages.stage_devices(devs, strategy)
    shared = len(used) > plan.count  # one GPU: both stages on it
    torch.manual_seed(cfg.seed)
    if strategy in ("gpipe", "1f1b"):
        out = launch_pipelining(cfg, plan, strategy, split_sizes[0], profile=args.profile)
        timer = timing.Timer(warmup=cfg.warmup)
        timer.warmup_times, timer.times = out["warmup_times"], out["times"]
        runs, extra = {split_sizes[0]: (timer, out["losses"])}, out["extra"]
    else:
        model = build(strategy, used, split_sizes[0], cfg.num_classes)
        if args.compile:  # torch.compile (--compile, `single` only): compiled in train's warm-up
            tdev.compile_model(model, used[0])
        cuda = list(dict.fromkeys(d for d in used if d.type == "cuda"))
        for d in cuda:  # after the build: CUDA refuses this on a device it has not touched yet
            torch.cuda.reset_peak_memory_stats(d)
        traces = profiling.resnet50_traces(FRAMEWORK, args, strategy, split_sizes, sweep)
        runs = train(model, cfg, used, split_sizes=split_sizes, traces=traces)
        extra = measure_stages(model, cfg) if strategy != "single" else {}
        if strategy == "single" and cuda:
            extra = {"peak_memory_bytes": [torch.cuda.max_memory_allocated(cuda[0])]}
        if args.compile:
            extra |= tdev.compile_fields(True, used[0])
    recs = []
    for split_size, (timer, losses) in runs.items():
        recs.append(cli.make_record(
            FRAMEWORK, args, dataclasses.replace(plan, count=min(len(used), plan.count)), cfg,
            tdev.device_names(used), tdev.versions(), strategy=strategy,
            **stages.record_fields(cfg, timer, losses, split_size, extra, sweep, shared),
        ))  # fmt: skip
        stages.save(recs[-1], args.results, cfg, plan)
    return recs


def main(args, plan, cfg):
    one_gpu = plan.count == 1 and plan.platform == "gpu"
    strategies = stages.choose_strategies(args, plan.count, STRATEGIES, FRAMEWORK, one_gpu)
    for s in strategies:  # the engine's own limits, before anything runs
        if s in ("gpipe", "1f1b"):
            check_pipelining(s, plan.count, cfg.split_size, cfg.batch_size)
    devs = tdev.get_devices(plan)
    for strategy, split_sizes, sweep in stages.runs(args, cfg, strategies):
        run_strategy(args, plan, cfg, devs, strategy, split_sizes, sweep)


# --- torch only: the same stages on torch.distributed.pipelining, one process per stage --------
def check_pipelining(strategy, n_stages, split_size, batch_size):
    """The engine needs equal micro-batches (static shapes); 1F1B needs at least one per stage."""
    if batch_size % split_size:
        raise config.ConfigError(
            f"{strategy} needs micro-batches of equal size: split_size {split_size} must divide "
            f"the batch size {batch_size}"
        )
    if strategy == "1f1b" and batch_size // split_size < n_stages:
        raise config.ConfigError(
            f"1f1b needs at least {n_stages} micro-batches (one per stage); split_size "
            f"{split_size} of batch {batch_size} gives {batch_size // split_size}"
        )


def launch_pipelining(cfg, plan, strategy, split_size, train_bn=True, profile=None):
    """Start one process per stage with torchrun and return what the last stage reports.
    `profile`: --profile's folder, where each rank traces its first timed repeat."""
    spec = {
        "cfg": dataclasses.asdict(cfg),
        "strategy": strategy,
        "split_size": split_size,
        "gpu": plan.platform == "gpu",
        "train_bn": train_bn,
        "profile": profile,
    }
    with tempfile.TemporaryDirectory() as tmp:
        spec["out"] = str(Path(tmp) / "result.json")
        argv = ["--pipelining-worker", json.dumps(spec)]
        launch.torchrun("torch_impl.resnet50", argv, plan.count, strategy)
        return json.loads(Path(spec["out"]).read_text())


def pipelining_worker(spec):
    """One torchrun process: build the seeded model, keep this rank's stage, run the schedule,
    and (last rank) write what it measured to spec["out"]."""
    cfg = config.Resnet50Config(**{**spec["cfg"], "split_sizes": tuple(spec["cfg"]["split_sizes"])})
    dist.init_process_group("nccl" if spec["gpu"] else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if spec["gpu"]:
        device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}")
        torch.cuda.set_device(device)
    stage_module, schedule = _stage_and_schedule(spec, cfg, rank, world, device)
    trace = profiling.tracer_at(FRAMEWORK, spec["profile"], "resnet50", spec["strategy"], rank)
    timer, losses = _run_schedule(schedule, stage_module, cfg, rank, world, device, trace)
    stage_params = [None] * world
    dist.all_gather_object(stage_params, sum(p.numel() for p in stage_module.parameters()))
    if rank == world - 1:
        extra = {"num_stages": world, "stage_params": stage_params}
        extra |= {"n_microbatches": cfg.batch_size // spec["split_size"]}
        extra |= {"engine": "torch.distributed.pipelining", "backend": dist.get_backend()}
        out = {"times": timer.times, "warmup_times": timer.warmup_times, "extra": extra}
        out["losses"] = [loss.item() for loss in losses]
        Path(spec["out"]).write_text(json.dumps(out))
    launch.end_process_group()


def _stage_and_schedule(spec, cfg, rank, world, device):
    """This rank's stage of the seeded model (every rank builds the same one) and its schedule."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    torch.manual_seed(cfg.seed)
    model = resnet50(cfg.num_classes)
    placement = [device if r == rank else torch.device("cpu") for r in range(world)]
    stage_module = split_into_stages(model, placement)[rank]
    stage_module.train(spec["train_bn"])
    stage = PipelineStage(stage_module, rank, world, device)
    schedule_cls = ScheduleGPipe if spec["strategy"] == "gpipe" else Schedule1F1B
    # Mean loss per micro-batch and gradients divided by their number (scale_grads): with equal
    # micro-batches that is the whole batch's mean, as in `train`.
    n_micro = cfg.batch_size // spec["split_size"]
    schedule = schedule_cls(stage, n_microbatches=n_micro, loss_fn=nn.MSELoss())
    return stage_module, schedule


def _run_schedule(schedule, stage_module, cfg, rank, world, device, trace=None):
    """`train`'s loop with the schedule's step: rank 0 feeds the inputs, the last rank the
    labels (and gets the micro-batches' losses). `trace`: --profile's, this rank's."""
    optimizer = optim.SGD(stage_module.parameters(), lr=cfg.lr)
    inputs, labels = make_data(cfg, [device])

    def barrier():
        tdev.sync([device])
        dist.barrier()

    timer, losses = timing.Timer(barrier, warmup=cfg.warmup, trace=trace), []
    for _ in range(cfg.warmup + cfg.repeats):
        with timer.region():
            for b in range(cfg.num_batches):
                optimizer.zero_grad()
                micro_losses = []
                if rank == 0:
                    schedule.step(inputs[b])
                elif rank == world - 1:
                    schedule.step(target=labels[b], losses=micro_losses)
                    losses.append(torch.stack(micro_losses).mean().detach())
                else:
                    schedule.step()
                optimizer.step()
    return timer, losses


if __name__ == "__main__" and sys.argv[1:2] == ["--pipelining-worker"]:
    launch.worker_main(lambda argv: pipelining_worker(json.loads(argv[0])), sys.argv[2:])
