"""torch only: resnet50's stages on torch's own pipelining engine (torch.distributed.pipelining),
`--strategy gpipe` or `1f1b`: one process per stage, started by torchrun (torch_impl/launch.py),
exchanging activations and gradients over gloo (CPU) or NCCL (GPU). The stages are the ones
torch_impl/resnet50.py cuts; resnet50's `main` hands them over (`stage_of`, `make_data`).
"""

import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn, optim

from common import config, devices, profiling, timing
from torch_impl import devices as tdev
from torch_impl import launch

STRATEGIES = ("gpipe", "1f1b")
SPEC_ENV = "MULTIDEVICE_PIPELINING_SPEC"  # what each stage's process runs, as JSON


def check(strategy, n_stages, split_size, batch_size):
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


def launch_stages(cfg, devs, strategy, repeats, train_bn=True, profile=None):
    """Start one process per stage with torchrun and fill `repeats` (common.harness.Repeats) with
    what the last stage measured; returns the record's extra. `profile`: --profile's folder,
    where each rank traces its first timed repeat."""
    split_size, gpu = repeats.split_sizes[0], devs[0].type == "cuda"
    spec = {"cfg": dataclasses.asdict(cfg), "strategy": strategy, "split_size": split_size}
    spec |= {"gpu": gpu, "train_bn": train_bn, "profile": profile}
    with tempfile.TemporaryDirectory() as tmp:
        spec["out"] = str(Path(tmp) / "result.json")
        argv = ["--workload", "resnet50", "--gpus", str(len(devs)), "--preset", cfg.preset]
        argv += ["--platform", "gpu" if gpu else "cpu", "--results", str(Path(tmp) / "unused")]
        launch.torchrun(argv, len(devs), strategy, env={SPEC_ENV: json.dumps(spec)})
        out = json.loads(Path(spec["out"]).read_text())
    timer = repeats.timers[split_size]
    timer.warmup_times, timer.times = out["warmup_times"], out["times"]
    repeats.losses[split_size] = out["losses"]
    return out["extra"]


def worker(hooks, stage_of, make_data):
    """One stage's process: join the group, keep this rank's stage of the seeded model
    (`stage_of(cfg, rank, world, device)`), run the schedule, and (last rank) write what it
    measured to the spec's "out"."""
    spec = json.loads(os.environ[SPEC_ENV])
    cfg = config.Resnet50Config(**{**spec["cfg"], "split_sizes": tuple(spec["cfg"]["split_sizes"])})
    plan = devices.DevicePlan(1, "gpu" if spec["gpu"] else "cpu", not spec["gpu"])
    joined = launch.join(plan)  # left as the worker ends (guard.worker_main)
    rank, world, device = joined.rank, joined.size, joined.devices[0]
    stage_module = stage_of(cfg, rank, world, device)
    schedule = _schedule(spec, cfg, stage_module, rank, world, device)
    trace = profiling.tracer_at(hooks, spec["profile"], "resnet50", spec["strategy"], rank)
    inputs, labels = make_data(cfg, [device])
    timer, losses, busy = _run(schedule, stage_module, cfg, (inputs, labels), rank, world, trace)
    stage_params, stage_busy = [None] * world, [None] * world
    dist.all_gather_object(stage_params, sum(p.numel() for p in stage_module.parameters()))
    dist.all_gather_object(stage_busy, None if spec["gpu"] else busy / sum(timer.times))
    if rank == world - 1:
        n_micro = cfg.batch_size // spec["split_size"]
        extra = {"num_stages": world, "stage_params": stage_params}
        # On a CPU, the share of the timed repeats each stage computed (its CPU time over the
        # wall time and its threads) beside GPipe's bubble (p - 1) / (m + p - 1): the rest of a
        # stage's time it waited, for its peer or for the link.
        extra |= {
            "stage_busy": stage_busy,
            "bubble_formula": (world - 1) / (n_micro + world - 1),
        }
        extra |= {"n_microbatches": n_micro}
        extra |= {"engine": "torch.distributed.pipelining", "backend": dist.get_backend()}
        out = {"times": timer.times, "warmup_times": timer.warmup_times, "extra": extra}
        out["losses"] = [loss.item() for loss in losses]
        Path(spec["out"]).write_text(json.dumps(out))


def _schedule(spec, cfg, stage_module, rank, world, device):
    """This rank's stage in the engine's schedule (GPipe or 1F1B)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    stage_module.train(spec["train_bn"])
    stage = PipelineStage(stage_module, rank, world, device)
    schedule_cls = ScheduleGPipe if spec["strategy"] == "gpipe" else Schedule1F1B
    # Mean loss per micro-batch and gradients divided by their number (scale_grads): with equal
    # micro-batches that is the whole batch's mean, as in resnet50's `train`.
    n_micro = cfg.batch_size // spec["split_size"]
    return schedule_cls(stage, n_microbatches=n_micro, loss_fn=nn.MSELoss())


def _run(schedule, stage_module, cfg, data, rank, world, trace=None):
    """resnet50's `train` loop with the schedule's step: rank 0 feeds the inputs, the last rank
    the labels (and gets the micro-batches' losses). `trace`: --profile's, this rank's. Also
    returns the CPU seconds per thread this rank computed in the timed repeats."""
    optimizer = optim.SGD(stage_module.parameters(), lr=cfg.lr)
    inputs, labels = data
    device = inputs.device

    def barrier():
        tdev.sync([device])
        dist.barrier()

    timer, losses, busy = timing.Timer(barrier, warmup=cfg.warmup, trace=trace), [], 0.0
    for repeat in range(cfg.warmup + cfg.repeats):
        begun = time.process_time()  # every thread of this process: its computing
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
        if repeat >= cfg.warmup:
            busy += (time.process_time() - begun) / torch.get_num_threads()
    return timer, losses, busy
