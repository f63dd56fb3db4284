"""The measuring around a training loop and the record it makes, kept out of the workload files
(docs/design.md, "Timing"): framework-free, in one place for every workload.

A workload's `train` reads like d2l's: the strategy's functions and the loop over epochs and
batches. Everything else a run does is here. lenet and resnet18 train in epochs, measured by
`Run`: the one timer with its warm-up, each epoch's batch order, the progress bar, the usage
sampler, d2l's line per epoch and the epoch log, the framework's ceiling timed beside each epoch
(--ceiling), the profiler around the first timed epoch (--profile), and the record made from all
of it. resnet50 trains in repeats of a few batches at each split size, measured by `Repeats`
(common.stages.main makes one per strategy). `train` says what the clock waits for, `sync`: the
framework's barrier, or (JAX, which has none) its newest state.

    for part in run.warm_up(shard, sync=wait):    # one step per batch shape, timed apart
        step(x, y, part)
    for parts in run.epochs(shard):               # each epoch's parts; iterating them is the epoch
        losses = [step(x, y, part) for part in parts]
        run.log(*total(losses, [correct(...) for idx in run.test_batches()]))
    run.save(strategy, extra)                     # `main`: the framework's own fields, if any

    for split_size, batches in repeats.timed(sync=wait):   # resnet50: each repeat, timed whole
        for b in batches: repeats.add(step(b))

`make_record` fills in what every record says (settings, environment, commit, FLOPs), for these
and the ceiling's (common/ceiling.py). Each framework hands `Hooks` to common (its `__main__`
makes them), so common imports no framework: the import graph is the run-time graph.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from common import (
    ceiling,
    checks,
    config,
    cores,
    data,
    devices,
    flops,
    link,
    profiling,
    results,
    timing,
    training,
    utilization,
    watchdog,
)

TEST_BATCH = 256  # test images per device in each evaluation batch (not timed)


@dataclass(frozen=True)
class Hooks:
    """What a framework hands to common, made by its `__main__`: its `devices` module (the same
    functions in each framework: get_devices, sync, device_names, versions, threads, profiler)
    and its ceiling step `ceiling.build(args, cfg, device) -> (step, state, sync)`."""

    framework: str
    devices: ModuleType | None = None
    ceiling: Callable | None = None

    def threads(self) -> int | None:
        return self.devices.threads() if self.devices else None

    def versions(self) -> dict[str, str]:
        return self.devices.versions() if self.devices else {}


class Run:
    """One training run's measuring. `ds`: the host arrays (x_train, y_train, x_test, y_test);
    `world` (common.world.World): this process's devices, those the strategy spreads over, and
    its rank (only rank 0 prints and records); `hooks`: the framework's; `calls`: warm-up steps
    per batch shape (torch's CUDA graphs need three). Use `with Run(...) as run:` around
    training."""

    def __init__(self, args, cfg, ds, world, *, hooks: Hooks | None = None, calls: int = 1):
        self.args, self.cfg, self.world, self.calls = args, cfg, world, calls
        self.hooks = hooks or Hooks("unknown")
        self.n_train, self.n_test = len(ds[1]), len(ds[3])
        self._sync: Callable[[], object] = lambda: None  # `train`'s, given to warm_up
        trace = profiling.tracer(self.hooks, args, "epoch", world.rank)  # --profile
        self.timer = timing.Timer(lambda: self._sync(), warmup=1, trace=trace)
        probe = ceiling.paired(self.hooks, args, cfg, world.devices[0])  # --ceiling
        full = -(-self.n_train // cfg.batch_size)  # an epoch's steps: a bounded one extrapolates
        self.epoch_log = training.EpochLog(cfg.epochs, full, quiet=world.rank != 0, ceiling=probe)
        self.sampler = utilization.Sampler("cpu_time")
        self.link = link.Counter()  # a cluster's node: the bytes its link carries in the epochs
        self._steps = self._seen = 0
        # Several processes: each ends itself when the run stops moving (common/watchdog.py).
        self.progress = watchdog.armed(world.size)
        self._beat(watchdog.WARM)  # what comes before the warm-up's first step is set-up

    def sampling(self, sampler: utilization.Sampler) -> Run:
        """Sample with `sampler` (a GPU's utilisation) instead of this process's CPU time."""
        self.sampler = sampler
        return self

    def __enter__(self) -> Run:
        self.sampler.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.sampler.__exit__(*exc)

    def _batches(self, epoch: int) -> list[np.ndarray]:
        """The epoch's global batches in d2l's order (the cpu preset bounds their number)."""
        order = data.batches(self.n_train, self.cfg.batch_size, self.cfg.seed, epoch)
        return order[: getattr(self.cfg, "steps_per_epoch", None)]

    def warm_up(self, shard: Callable[[list], Iterable], *, sync: Callable[[], object]) -> Iterator:
        """This process's part of one batch of each shape the epochs use (`calls` times each),
        timed apart: compilation, autotuning and first touch stay out of the epochs. `sync`:
        what the clock waits for at the end of the warm-up and of every epoch."""
        self._sync = sync
        batches = data.warmup_batches(self._batches(0)) * self.calls
        return self._warm(shard, batches)

    def _warm(self, shard, batches: list[np.ndarray]) -> Iterator:
        with self.timer.region():
            for part in shard(batches):
                self._beat(watchdog.WARM)
                yield part

    def _beat(self, kind: str = watchdog.STEP) -> None:
        if self.progress is not None:
            self.progress.beat(kind)

    def epochs(self, shard: Callable[[list], Iterable]) -> Iterator[Iterator]:
        """Each epoch's parts (`shard` of its global batches); iterating them is the epoch,
        timed whole. Ends after an epoch whose loss was not finite."""
        for epoch in range(self.cfg.epochs):
            if self.epoch_log.diverged:
                return
            yield self._timed(shard, self._batches(epoch), epoch)

    def _timed(self, shard, batches: list[np.ndarray], epoch: int) -> Iterator:
        quiet = getattr(self.args, "no_progress", True) or self.world.rank != 0
        # The bar before the clock starts: its first call imports tqdm.
        bar = progress(None, len(batches), f"epoch {epoch + 1}", quiet)
        begun = self.link.start()
        with self.sampler.measure(), self.timer.region():
            for part in shard(batches):
                self._beat()
                yield part
                bar.update(1)
        self.link.stop(begun, len(batches))
        bar.close()
        self._steps, self._seen = len(batches), sum(len(b) for b in batches)

    def test_batches(self) -> Iterator[np.ndarray]:
        """The test set's indices in batches of TEST_BATCH per device, in order."""
        size = TEST_BATCH * len(self.world.devices)
        for i in range(0, self.n_test, size):
            self._beat(watchdog.EVAL)
            yield np.arange(i, min(i + size, self.n_test))

    def log(self, loss_sum: float, correct: float) -> None:
        """The epoch's summed loss and correct test predictions (over every process): d2l's
        line, the log, and (--ceiling) a repeat of the ceiling after it."""
        self._beat(watchdog.END)
        seconds = self.timer.times[-1]
        acc = correct / self.n_test
        self.epoch_log.add(loss_sum / self._seen, acc, seconds, self._steps, self._seen)

    def usage(self) -> dict:
        return self.sampler.result()

    def save(self, strategy: str, extra: dict | None = None, names: list | None = None) -> None:
        """Record the run (rank 0; with --profile only its traces) and print its last lines;
        a run that diverged is recorded, then ends with one line (training.Diverged). `extra`:
        the framework's own fields; `names`: the devices' (default: the world's devices)."""
        self._beat(watchdog.END)  # the record, then the exit barrier: one more bound
        log, plan = self.epoch_log, self.world.plan
        if self.world.rank != 0:
            if log.diverged:
                raise training.Diverged(log.diverged, log.train_loss[-1])
            return
        if names is None:
            names = self.hooks.devices.device_names(self.world.devices)
        fields = log.record_fields(self.timer.warmup_seconds)
        fields.update(strategy=strategy, extra={**(extra or {}), **self.link.fields()})
        rec = make_record(self.hooks, self.args, plan, self.cfg, names, **fields)
        profiling.append(rec, self.args.results)
        if rec.diverged_at_epoch is not None:
            raise training.Diverged(rec.diverged_at_epoch, rec.train_loss[-1])
        print(f"{rec.images_per_sec:.1f} images/sec ({rec.strategy})")
        median = rec.sec_per_epoch["median"]
        print(final_line(rec.test_acc, median, plan, rec.extrapolated), flush=True)


def progress(iterable, total: int, desc: str, disable: bool = False):
    """A tqdm bar on a terminal; nothing when output is piped (callers print plain lines)."""
    from tqdm import tqdm

    return tqdm(
        iterable, total=total, desc=desc, leave=False, disable=disable or not sys.stderr.isatty()
    )


def final_line(
    test_acc: float | None, sec_per_epoch: float, plan: devices.DevicePlan, extrapolated: bool
) -> str:
    """d2l's closing line: `test acc: 0.84, 2.8 sec/epoch on [2 x cpu (virtual)]`."""
    acc = "n/a" if test_acc is None else f"{test_acc:.2f}"
    mark = " (extrapolated)" if extrapolated else ""
    return f"test acc: {acc}, {sec_per_epoch:.1f} sec/epoch{mark} on [{plan.describe()}]"


class Repeats:
    """resnet50's measuring, which its `train` iterates (`timed`): `(split size, batches)` for
    every split size's `cfg.warmup` untimed repeats, then `cfg.repeats` rounds that take the
    split sizes in turn (round_robin); iterating `batches` (num_batches steps) is the repeat,
    timed whole. --profile: `traces`, one per split size, around its first timed repeat;
    `sweep`: the run is --sweep's. `add` keeps a step's loss (read after the clocks stop)."""

    def __init__(self, cfg, split_sizes=(None,), *, traces=None, sweep: bool = False):
        self.cfg, self.split_sizes, self.sweep = cfg, tuple(split_sizes), sweep
        self._sync: Callable[[], object] = lambda: None  # `train`'s, given to timed
        self._read: Callable = float
        self.timers = {
            s: timing.Timer(lambda: self._sync(), cfg.warmup, trace=(traces or {}).get(s))
            for s in self.split_sizes
        }
        self.losses = {s: [] for s in self.split_sizes}
        self._current = self.split_sizes[0]

    def timed(self, *, sync: Callable[[], object], read: Callable = float) -> Iterator:
        """The repeats. `sync`: what the clock waits for at the end of each; `read`: a kept
        loss as a float (MXNet: NDArray.asscalar)."""
        self._sync, self._read = sync, read
        return self._rounds()

    def _rounds(self) -> Iterator[tuple[int | None, Iterator[int]]]:
        for split_size in round_robin(self.split_sizes, self.cfg.warmup, self.cfg.repeats):
            self._current = split_size
            yield split_size, self._timed(split_size)

    def _timed(self, split_size) -> Iterator[int]:
        with self.timers[split_size].region():
            yield from range(self.cfg.num_batches)

    def add(self, loss) -> None:
        self.losses[self._current].append(loss)

    def results(self) -> dict:
        """{split size: (its Timer, its losses as floats)}, read after every clock stopped."""
        return {
            s: (self.timers[s], [float(self._read(x)) for x in self.losses[s]])
            for s in self.split_sizes
        }

    def save(self, args, plan, hooks: Hooks, strategy: str, extra: dict, used: list) -> None:
        """A record per split size, each with its line. `used`: the stages' devices, two of
        them one device where `plan` has one (common.stages.stage_devices)."""
        shared = len(used) > plan.count
        recorded = dataclasses.replace(plan, count=min(len(used), plan.count))
        names = hooks.devices.device_names(used)
        for split_size, (timer, losses) in self.results().items():
            fields = repeat_fields(self.cfg, timer, losses, split_size, extra, self.sweep, shared)
            rec = make_record(hooks, args, recorded, self.cfg, names, strategy=strategy, **fields)
            _save_repeat(rec, args.results, self.cfg, plan)


def round_robin(split_sizes, warmup: int, repeats: int) -> list:
    """The split size of each repeat of a run: every split size's `warmup` repeats first,
    then `repeats` rounds that take each split size once. The speed of a shared machine drifts
    by tens of percent over minutes; taken round-robin, a drift slows every split size alike
    instead of bending the curve."""
    return [s for s in split_sizes for _ in range(warmup)] + list(split_sizes) * repeats


def repeat_fields(cfg, timer: timing.Timer, losses, split_size, extra: dict, sweep: bool, shared):
    """The results.Record fields of one resnet50 run: seconds per repeat of num_batches steps.
    `shared`: the stages shared one device (common.stages.stage_devices)."""
    stats = timer.stats()
    extra = {**extra, "num_batches": cfg.num_batches, "image_size": cfg.image_size}
    if shared:
        extra["stages_share_device"] = True
    return {
        "seconds": stats.to_dict(),
        "warmup_seconds": timer.warmup_seconds,
        "images_per_sec": cfg.num_batches * cfg.batch_size / stats.median,
        "train_loss": list(losses),
        "split_size": split_size,
        "extra": extra | ({"sweep": True, "round_robin": True} if sweep else {}),
        "diverged_at_epoch": diverged_repeat(losses, cfg.num_batches),
    }


def diverged_repeat(losses, num_batches: int) -> int | None:
    """The repeat (of num_batches steps, warm-up included, from 1) whose loss first went
    non-finite, or None. resnet50 has no epochs: its repeats stand in for them in the record."""
    bad = [i for i, loss in enumerate(losses) if not math.isfinite(loss)]
    return bad[0] // num_batches + 1 if bad else None


def _save_repeat(rec: results.Record, path, cfg, plan) -> None:
    """Append the record and print one line: the time, throughput, loss, stages and devices; a
    run that diverged is recorded as such, then ends with one line. A profiled run (--profile)
    appends nothing: the profiler slowed its first timed repeat."""
    profiling.append(rec, path, "repeat")
    if rec.diverged_at_epoch is not None:
        raise training.Diverged(rec.diverged_at_epoch, rec.train_loss[-1], "repeat")
    split = f" (split {rec.split_size})" if rec.split_size else ""
    where = plan.describe() if rec.devices > 1 else f"1 x {plan.platform}"
    if rec.extra.get("stages_share_device"):
        where += ", both stages on it"
    blocks = rec.extra.get("stage_blocks") or []  # `stem..layer2.3 | layer3.0..head`
    described = " | ".join(f"{b[0]}..{b[-1]}" if len(b) > 1 else b[0] for b in blocks)
    stage_text = f", stages {described}" if blocks else ""
    print(
        f"resnet50 {rec.strategy}{split}: {timing.Stats(**rec.seconds)} per "
        f"{cfg.num_batches} batch(es) of {cfg.batch_size}, {rec.images_per_sec:.1f} images/s, "
        f"loss {rec.train_loss[-1]:.4f}{stage_text} on [{where}]",
        flush=True,
    )


def make_record(hooks: Hooks, args, plan, cfg, device_names, **fields) -> results.Record:
    """A results record of `fields` with what every record says filled in: the run's settings
    and precision, the framework's versions and threads, the machine, the commit, the FLOPs."""
    versions, hardware = results.environment(hooks.versions())
    extra = {"amp": args.amp, **fields.get("extra", {})}
    if "ceiling" in fields:  # --ceiling: measured in this run (training.EpochLog.record_fields)
        extra["ceiling"] = fields.pop("ceiling")
    if args.workload in ("lenet", *config.RESNET18_WORKLOADS):  # which copy of Fashion-MNIST
        extra["data_dir"] = str(data.find_dir())
    if args.workload in config.RESNET18_WORKLOADS:  # each device's share, or all (--sync-bn)
        extra["batch_norm"] = "sync" if getattr(args, "sync_bn", False) else "per-device"
    if checks.packs_buckets(hooks.framework, args.workload, args.strategy):
        extra["bucketed"] = not getattr(args, "unbucketed", False)  # one buffer, or per array
    if hooks.framework == "torch":  # eager, or compiled (--compile): JAX and MXNet always compile
        extra["compiled"] = getattr(args, "compile", False)
    if getattr(args, "profile", None):  # a traced run: its save prints it and keeps no record
        extra["profile"] = args.profile
    # The threads an operator computed with (MXNet's default is half the CPUs), and which
    # cores each device had (--cores-per-device).
    extra["threads"] = hooks.threads()
    fields["extra"] = extra | cores.record_fields(hooks.framework, plan.count)
    gpus = [g["name"] for g in hardware["gpus"]] if plan.platform == "gpu" else []
    fields["flops"] = flops.record_fields(
        args.workload,
        flops.shape_of(args.workload, cfg),
        fields.get("images_per_sec"),
        flops.peak_names(device_names, gpus, plan.count),
        "bf16" if args.amp == "bf16" else "float32",
    )
    return results.Record(
        framework=hooks.framework,
        workload=args.workload,
        devices=plan.count,
        platform=plan.platform,
        virtual=plan.virtual,
        device_names=list(device_names),
        preset=cfg.preset,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        versions=versions,
        hardware=hardware,
        git_commit=results.git_commit(),
        **fields,
    )
