"""The measuring around a training loop, kept out of the workload files (docs/design.md, "Timing").

A workload's `train` reads like d2l's: the strategy's functions and the loop over epochs and
batches. Everything else a run does is here, in `Run`, framework-free: the one timer with its
warm-up, each epoch's batch order, the progress bar, the usage sampler, d2l's line per epoch and
the epoch log, the framework's ceiling timed beside each epoch (--ceiling), the profiler around
the first timed epoch (--profile), and the record made from all of it.

    for part in run.warm_up(shard):       # one step per batch shape, timed apart
        step(x, y, part)
    for parts in run.epochs(shard):       # each epoch's parts; iterating them is the timed epoch
        losses = [step(x, y, part) for part in parts]
        run.log(*total(losses, [correct(...) for idx in run.test_batches()]))

Each framework hands `Hooks` to common (its `__main__` makes them), so common imports no
framework: the import graph is the run-time graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from common import ceiling, cli, data, link, profiling, timing, training, utilization

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


class Run:
    """One training run's measuring. `ds`: the host arrays (x_train, y_train, x_test, y_test);
    `world` (common.world.World): this process's devices, those the strategy spreads over, and
    its rank (only rank 0 prints and records); `sync`: the framework's barrier (JAX sets it in
    `train`: it waits for the newest state); `calls`: warm-up steps per batch shape (torch's
    CUDA graphs need three). Use `with Run(...) as run:` around training."""

    def __init__(self, args, cfg, ds, world, sync=None, hooks=None, calls=1):
        self.args, self.cfg, self.world, self.calls = args, cfg, world, calls
        self.hooks = hooks or Hooks("unknown")
        self.n_train, self.n_test = len(ds[1]), len(ds[3])
        self.sync = sync or (lambda: None)
        trace = profiling.tracer(self.hooks, args, "epoch", world.rank)  # --profile
        self.timer = timing.Timer(lambda: self.sync(), warmup=1, trace=trace)
        probe = ceiling.paired(self.hooks, args, cfg, world.devices[0])  # --ceiling
        full = -(-self.n_train // cfg.batch_size)  # an epoch's steps: a bounded one extrapolates
        self.epoch_log = training.EpochLog(cfg.epochs, full, quiet=world.rank != 0, ceiling=probe)
        self.sampler = utilization.Sampler("cpu_time")
        self.link = link.Counter()  # a cluster's node: the bytes its link carries in the epochs
        self._steps = self._seen = 0

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

    def warm_up(self, shard: Callable[[list], Iterable]) -> Iterator:
        """This process's part of one batch of each shape the epochs use (`calls` times each),
        timed apart: compilation, autotuning and first touch stay out of the epochs."""
        batches = data.warmup_batches(self._batches(0)) * self.calls
        with self.timer.region():
            yield from shard(batches)

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
        bar = cli.progress(None, len(batches), f"epoch {epoch + 1}", quiet)
        begun = self.link.start()
        with self.sampler.measure(), self.timer.region():
            for part in shard(batches):
                yield part
                bar.update(1)
        self.link.stop(begun, len(batches))
        bar.close()
        self._steps, self._seen = len(batches), sum(len(b) for b in batches)

    def test_batches(self) -> list[np.ndarray]:
        """The test set's indices in batches of TEST_BATCH per device, in order."""
        size = TEST_BATCH * len(self.world.devices)
        return [np.arange(i, min(i + size, self.n_test)) for i in range(0, self.n_test, size)]

    def log(self, loss_sum: float, correct: float) -> None:
        """The epoch's summed loss and correct test predictions (over every process): d2l's
        line, the log, and (--ceiling) a repeat of the ceiling after it."""
        seconds = self.timer.times[-1]
        acc = correct / self.n_test
        self.epoch_log.add(loss_sum / self._seen, acc, seconds, self._steps, self._seen)

    def usage(self) -> dict:
        return self.sampler.result()

    def save(self, plan, names, versions, strategy, extra=None) -> None:
        """Record the run (rank 0; with --profile only its traces) and print its last lines;
        a run that diverged is recorded, then ends with one line (training.Diverged)."""
        if self.world.rank != 0:
            if self.epoch_log.diverged:
                raise training.Diverged(self.epoch_log.diverged, self.epoch_log.train_loss[-1])
            return
        fields = self.epoch_log.record_fields(self.timer.warmup_seconds)
        extra = {**(extra or {}), **self.link.fields()}
        fields.update(strategy=strategy, extra=extra, threads=self.hooks.threads())
        rec = cli.make_record(
            self.hooks.framework, self.args, plan, self.cfg, names, versions, **fields
        )
        cli.save(rec, self.args.results, plan)
