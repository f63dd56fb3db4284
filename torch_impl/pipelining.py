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
from contextlib import contextmanager
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
    spans = Spans(device)
    schedule = _schedule(spec, cfg, stage_module, rank, world, device, spans)
    trace = profiling.tracer_at(hooks, spec["profile"], "resnet50", spec["strategy"], rank)
    inputs, labels = make_data(cfg, [device])
    timer, losses = _run(schedule, stage_module, cfg, (inputs, labels), rank, world, spans, trace)
    stage_params, stage_spans = [None] * world, [None] * world
    dist.all_gather_object(stage_params, sum(p.numel() for p in stage_module.parameters()))
    dist.all_gather_object(stage_spans, spans.totals() | {"wall": sum(timer.times)})
    if rank == world - 1:
        n_micro = cfg.batch_size // spec["split_size"]
        extra = {"num_stages": world, "stage_params": stage_params}
        # Each stage's seconds of the timed repeats: computing (its micro-batches' forwards and
        # backwards), in the schedule's step, and in all (wall), beside GPipe's bubble
        # (p - 1) / (m + p - 1); compare/resnet50.py sets the busy shares beside the schedule.
        extra |= {"stage_spans": stage_spans, "bubble_formula": (world - 1) / (n_micro + world - 1)}
        extra |= {"n_microbatches": n_micro}
        extra |= {"engine": "torch.distributed.pipelining", "backend": dist.get_backend()}
        out = {"times": timer.times, "warmup_times": timer.warmup_times, "extra": extra}
        out["losses"] = [loss.item() for loss in losses]
        Path(spec["out"]).write_text(json.dumps(out))


class Spans:
    """The seconds one stage spends in each kind of span ("forward", "backward", "step"), summed
    over the timed repeats, and its micro-batches (forwards) there. On a GPU a span is a pair of
    CUDA events on the stage's stream, read after the repeat's barrier: synchronising around
    each span would also wait for the sends the engine has in flight, which wait for the peer."""

    KINDS = ("forward", "backward", "step")

    def __init__(self, device: torch.device):
        self.device, self.pending = device, []
        self.seconds, self.forwards = dict.fromkeys(self.KINDS, 0.0), 0

    @contextmanager
    def span(self, kind: str):
        begin = self.mark()
        yield
        self.pending.append((kind, begin, self.mark()))

    def mark(self):
        """Now: the clock, or on a GPU an event on the stage's stream, timed as work reaches it."""
        if self.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def close_repeat(self, timed: bool) -> None:
        """After a repeat's barrier: add its spans if it was timed, else drop them."""
        for kind, begin, end in self.pending if timed else ():
            cuda = isinstance(begin, torch.cuda.Event)
            self.seconds[kind] += begin.elapsed_time(end) / 1e3 if cuda else end - begin
            self.forwards += kind == "forward"
        self.pending.clear()

    def totals(self) -> dict:
        return self.seconds | {"micro_batches": self.forwards}


def timed_stage(stage_module, rank, world, device, spans: Spans):
    """This rank's PipelineStage, with each micro-batch's forward and backward timed as the
    schedule runs them (`forward_one_chunk`, `backward_one_chunk`: after the engine has waited
    for the input, before it sends the result). Not module hooks: stage 0's images need no
    gradient, so a full backward hook on it fires as its backward begins, not as it ends."""
    from torch.distributed.pipelining import PipelineStage

    class TimedStage(PipelineStage):
        def forward_one_chunk(self, *args, **kwargs):
            with spans.span("forward"):
                return super().forward_one_chunk(*args, **kwargs)

        def backward_one_chunk(self, *args, **kwargs):
            with spans.span("backward"):
                return super().backward_one_chunk(*args, **kwargs)

    return TimedStage(stage_module, rank, world, device)


def _schedule(spec, cfg, stage_module, rank, world, device, spans):
    """This rank's stage in the engine's schedule (GPipe or 1F1B)."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    stage_module.train(spec["train_bn"])
    stage = timed_stage(stage_module, rank, world, device, spans)
    schedule_cls = ScheduleGPipe if spec["strategy"] == "gpipe" else Schedule1F1B
    # Mean loss per micro-batch and gradients divided by their number (scale_grads): with equal
    # micro-batches that is the whole batch's mean, as in resnet50's `train`.
    n_micro = cfg.batch_size // spec["split_size"]
    return schedule_cls(stage, n_microbatches=n_micro, loss_fn=nn.MSELoss())


def _run(schedule, stage_module, cfg, data, rank, world, spans, trace=None):
    """resnet50's `train` loop with the schedule's step: the first stage feeds the inputs, the
    last the labels (and gets the micro-batches' losses). `spans`: this stage's, each step one.
    `trace`: --profile's, this rank's."""
    optimizer = optim.SGD(stage_module.parameters(), lr=cfg.lr)
    inputs, labels = data
    device = inputs.device

    def barrier():
        tdev.sync([device])
        dist.barrier()

    timer, losses = timing.Timer(barrier, warmup=cfg.warmup, trace=trace), []
    for repeat in range(cfg.warmup + cfg.repeats):
        with timer.region():
            for b in range(cfg.num_batches):
                optimizer.zero_grad()
                first = (inputs[b],) if rank == 0 else ()
                with spans.span("step"):
                    if rank == world - 1:
                        micro_losses = []
                        schedule.step(*first, target=labels[b], losses=micro_losses)
                        losses.append(torch.stack(micro_losses).mean().detach())
                    else:
                        schedule.step(*first)
                optimizer.step()
        spans.close_repeat(timed=repeat >= cfg.warmup)
    return timer, losses
