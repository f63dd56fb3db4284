"""The ceiling benchmark: `python -m <framework>_impl.ceiling --workload lenet|resnet18`.

How fast the framework itself can step a workload's model on this machine: the model built by
the workload's own module, one device, one fixed batch already on the device, the framework's
plain step (forward, loss, backward, SGD update) in a tight loop with the framework's barrier at
the end of each timed repeat only. No batch indexing, no loss bookkeeping, no evaluation, no
data-parallel wrapper: what is left is the framework's own cost of the step, so a training
record's sec/epoch over the ceiling's says how far its loop is from its framework's ceiling.

Framework-free: the command line, the checks, the timing loop and the record are here; each
`<framework>_impl/ceiling.py` builds the step and calls `run`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

from common import checks, cli, config, data, devices, profiling, results, signals, timing

STRATEGY = "ceiling"  # the record's strategy: compare/ keeps it apart from training records
WORKLOADS = ("lenet", "resnet18")
# Per preset: steps per timed repeat, repeats (a median, never one run), untimed warm-up steps.
STEPS = {"smoke": 3, "cpu": 20, "full": 100}
REPEATS = {"smoke": 2, "cpu": 3, "full": 5}
WARMUP = {"smoke": 1, "cpu": 2, "full": 5}
MEASURES = (
    "the workload's model stepped in a tight loop on one device: one fixed batch on the device, "
    "forward, loss, backward and SGD update, the framework's barrier only at the end of a repeat"
)


def parser(framework: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m {framework}_impl.ceiling",
        description=f"The ceiling of {framework}: a workload's training step in a tight loop.",
    )
    p.add_argument("--workload", required=True, choices=config.WORKLOADS)
    p.add_argument("--gpus", type=cli.whole_number, default=1, help="must be 1: one device")
    p.add_argument(
        "--platform", default=os.environ.get("PLATFORM", "auto"), choices=devices.PLATFORMS
    )
    p.add_argument("--preset", default=None, choices=config.PRESETS, help="smoke | cpu | full")
    p.add_argument("--steps", type=cli.whole_number, default=None, help="steps per timed repeat")
    p.add_argument("--repeats", type=cli.whole_number, default=None, help="timed repeats")
    p.add_argument("--warmup", type=cli.whole_number, default=None, help="untimed steps first")
    p.add_argument("--amp", choices=("off", "bf16"), default="off", help="as in training")
    p.add_argument("--compile", action="store_true", help="torch: torch.compile, as in training")
    p.add_argument("--results", default=str(results.DEFAULT_PATH))
    p.add_argument(
        "--profile", default=None, metavar="DIR", help="trace the first timed repeat into DIR"
    )
    p.add_argument("--no-progress", action="store_true", help="accepted, as by training runs")
    # checks.check_compile reads the strategy: the ceiling has none of the training's, so the
    # default (lenet: scratch, resnet18: ddp, both of which compile) applies.
    p.set_defaults(strategy=None, sweep=False)
    return p


def check(framework: str, args: argparse.Namespace):
    """The plan and config, or a one-line ConfigError / DeviceError, before any framework work."""
    if args.workload not in WORKLOADS:
        raise config.ConfigError(
            f"the ceiling covers {' and '.join(WORKLOADS)}, not {args.workload} (its repeats of "
            "num_batches steps are a tight loop already)"
        )
    for name in ("steps", "repeats", "warmup"):
        value = getattr(args, name)
        if value is not None and value < 1:  # warm-up too: a first step compiles or allocates
            raise config.ConfigError(f"--{name} must be at least 1, got {value}")
    if args.gpus != 1:
        raise config.ConfigError(f"the ceiling runs on one device; drop --gpus {args.gpus}")
    plan = devices.plan(1, args.platform)
    if args.preset is None:
        args.preset = config.default_preset(plan.platform == "gpu")
    cfg = config.get_config(args.workload, args.preset)
    checks.check_compile(framework, args, plan.count)
    checks.check_amp(framework, args, plan.platform)
    config.check_epoch_split(data.train_size(cfg.train_subset), cfg.batch_size, 1)
    profiling.check(framework, args)
    results.check_writable(args.results)  # before the measurement, not after
    return plan, cfg


def run(framework: str, main: Callable, argv: list[str] | None = None) -> int:
    """Parse, check, then `main(args, plan, cfg)`; bad input: one line on stderr and exit 2."""
    args = parser(framework).parse_args(argv)
    try:
        plan, cfg = check(framework, args)
        for note in (devices.notice(plan), checks.bf16_note(framework, args, plan.platform)):
            if note:
                print(note, file=sys.stderr)
        main(args, plan, cfg)
    except cli.USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return cli.EXIT_BAD_INPUT
    except KeyboardInterrupt:
        signals.say_stopped()
        return cli.EXIT_INTERRUPTED
    return 0


def first_batch(cfg):
    """(images NCHW float32, labels int64) of the first training batch."""
    fm = data.load()
    x_train, y_train = data.subset(fm.train_images, fm.train_labels, cfg.train_subset, cfg.seed)
    idx = data.batches(len(y_train), cfg.batch_size, cfg.seed, 0)[0]
    return data.to_float(x_train[idx]), y_train[idx].astype("int64")


def _epoch_steps(cfg) -> int:
    """An epoch's steps: the batches of the preset's training set, the last partial one counted."""
    return -(-data.train_size(cfg.train_subset) // cfg.batch_size)


def counts(args, cfg) -> tuple[int, int, int]:
    """(warm-up steps, steps per repeat, repeats): the command line's, else the preset's; never
    more steps per repeat than a bounded training epoch times (resnet18's cpu preset)."""
    bounded = getattr(cfg, "steps_per_epoch", None) or STEPS[cfg.preset]
    # A training run's --ceiling has no --steps, --warmup or --repeats: the preset's.
    asked = {k: getattr(args, k, None) for k in ("steps", "warmup", "repeats")}
    steps = asked["steps"] if asked["steps"] is not None else min(STEPS[cfg.preset], bounded)
    warmup = asked["warmup"] if asked["warmup"] is not None else WARMUP[cfg.preset]
    return warmup, steps, asked["repeats"] if asked["repeats"] is not None else REPEATS[cfg.preset]


def measure(
    step: Callable, state, sync: Callable, warmup: int, steps: int, repeats: int, trace=None
):
    """Run `state = step(state)` `warmup` times (timed apart: compilation, first touch), then
    `repeats` timed repeats of `steps` steps, each ending with `sync(state)`. JAX threads its
    state through `step`; torch and Gluon update in place and return the loss. `trace`:
    --profile's profiler around the first timed repeat."""
    last = [state]
    timer = timing.Timer(lambda: sync(last[0]), warmup=1, trace=trace)
    for n in [warmup] + [steps] * repeats:
        with timer.region():
            for _ in range(n):
                last[0] = step(last[0])
    return timer


class Paired:
    """The ceiling inside a training run (`--ceiling`): after each epoch, one timed repeat of the
    framework's ceiling step, the first preceded by its untimed warm-up. Each epoch is set
    against the repeat beside it: on a shared machine whose speed drifts by tens of percent over
    minutes, a ceiling run apart from the training run measured another machine state."""

    def __init__(
        self, step, state, sync, warmup: int, steps: int, clock=time.perf_counter, trace=None
    ):
        self.step, self.last, self.warmup, self.steps = step, [state], warmup, steps
        self.timer = timing.Timer(lambda: sync(self.last[0]), warmup=1, clock=clock, trace=trace)

    def repeat(self) -> None:
        for n in ([self.warmup] if not self.timer.warmup_times else []) + [self.steps]:
            with self.timer.region():
                for _ in range(n):
                    self.last[0] = self.step(self.last[0])

    def fields(self, sec_per_epoch: list[float], steps_per_epoch: int) -> dict:
        """The record's `extra.ceiling`: the ceiling per epoch, and x ceiling = the median of
        (epoch's sec/epoch / its repeat's, the same steps_per_epoch)."""
        per_step = [t / self.steps for t in self.timer.times]
        timed = zip(sec_per_epoch[: len(per_step)], per_step, strict=True)  # not a diverged epoch
        ratios = [t / (s * steps_per_epoch) for t, s in timed]
        return {
            "sec_per_epoch": timing.summarize([s * steps_per_epoch for s in per_step]).to_dict(),
            "s_per_step": statistics.median(per_step),
            "x_ceiling": statistics.median(ratios),
            "ratios": ratios,  # per epoch, in order
            "steps_timed": self.steps,
            "repeats": len(per_step),
            "warmup_steps": self.warmup,
            "warmup_seconds": self.timer.warmup_seconds,
            "measures": MEASURES + "; one repeat after each epoch of the training run",
        }


def paired(hooks, args, cfg, device) -> Paired | None:
    """--ceiling: the framework's ceiling step (`hooks.ceiling`: its `ceiling.build`) on the
    training run's device, to be timed beside its epochs; None without --ceiling."""
    if not getattr(args, "ceiling", False):
        return None
    if hooks.ceiling is None:
        raise config.ConfigError(f"--ceiling: no ceiling step for {hooks.framework}; drop it")
    step, state, sync = hooks.ceiling(args, cfg, device)
    warmup, steps, _ = counts(args, cfg)
    trace = profiling.tracer(hooks, args, "ceiling")  # --profile: the first timed repeat
    return Paired(step, state, sync, warmup, steps, trace=trace)


def record_fields(timer: timing.Timer, cfg, amp: str, warmup: int, steps: int):
    """The Record fields of a ceiling: sec_per_epoch = seconds per step x an epoch's steps."""
    steps_per_epoch = _epoch_steps(cfg)
    per_step = [t / steps for t in timer.times]
    s_per_step = timing.summarize(per_step).median
    extra = {
        "amp": amp,  # as training records say it: the report matches a ceiling to them by it
        "s_per_step": s_per_step,
        "s_per_epoch": s_per_step * steps_per_epoch,
        "steps_per_epoch": steps_per_epoch,
        "repeats": len(per_step),
        "warmup_steps": warmup,
        "measures": MEASURES,
    }
    return {
        "strategy": STRATEGY,
        "sec_per_epoch": timing.summarize([s * steps_per_epoch for s in per_step]).to_dict(),
        "warmup_seconds": timer.warmup_seconds,
        "images_per_sec": cfg.batch_size / s_per_step,
        "extrapolated": True,  # always: N steps of one batch, projected to an epoch
        "steps_timed": steps,
        "extra": extra,
    }


def save(rec: results.Record, path, plan: devices.DevicePlan) -> None:
    """Append the record (not a profiled one's: the profiler slowed its first repeat) and print
    the ceiling's line."""
    profiling.append(rec, path, "repeat")
    x = rec.extra
    print(
        f"ceiling: {x['s_per_step']:.4g} s/step (median of {x['repeats']} x {rec.steps_timed} "
        f"steps of batch {rec.batch_size}), {x['s_per_epoch']:.4g} s/epoch extrapolated to "
        f"{x['steps_per_epoch']} steps, on [{plan.describe()}]",
        flush=True,
    )
