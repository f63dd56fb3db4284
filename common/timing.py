"""The one timer (docs/design.md, "Timing").

Device work is asynchronous, so every timed region ends with the framework's barrier, passed in
as `sync` (`torch.cuda.synchronize`, `jax.block_until_ready` on the outputs, `mx.nd.waitall`).
Warm-up (compilation, first touch) is timed the same way but kept apart from the statistics.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Stats:
    median: float
    mean: float
    std: float  # sample standard deviation; 0.0 for a single repeat
    min: float
    max: float
    n: int

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.median:.3f} s (mean {self.mean:.3f} +- {self.std:.3f}, n={self.n})"


def summarize(times: list[float]) -> Stats:
    if not times:
        raise ValueError("no timings to summarize")
    return Stats(
        median=statistics.median(times),
        mean=statistics.fmean(times),
        std=statistics.stdev(times) if len(times) > 1 else 0.0,
        min=min(times),
        max=max(times),
        n=len(times),
    )


class Timer:
    """Times regions that end with `sync()`; the first `warmup` regions are kept apart.
    `trace`: a context manager factory (the framework's profiler, --profile) entered around the
    first timed region only, outside its clock (common/profiling.py)."""

    def __init__(
        self,
        sync: Callable[[], object] = lambda: None,
        warmup: int = 0,
        clock: Callable[[], float] = time.perf_counter,
        trace: Callable[[], AbstractContextManager] | None = None,
    ):
        self.sync = sync
        self.warmup = warmup
        self.clock = clock
        self.trace = trace
        self.warmup_times: list[float] = []
        self.times: list[float] = []

    @contextmanager
    def region(self):
        """`with timer.region(): work()`: the elapsed time includes the barrier at the end."""
        first_timed = len(self.warmup_times) == self.warmup and not self.times
        with self.trace() if self.trace and first_timed else nullcontext():
            self.sync()  # work queued before the region is not charged to it
            start = self.clock()
            yield
            self.sync()
            elapsed = self.clock() - start
        if len(self.warmup_times) < self.warmup:
            self.warmup_times.append(elapsed)
        else:
            self.times.append(elapsed)

    def stats(self) -> Stats:
        return summarize(self.times)

    @property
    def warmup_seconds(self) -> float:
        return sum(self.warmup_times)


def benchmark(
    fn: Callable[[], object], sync: Callable[[], object], repeats: int, warmup: int = 1
) -> Timer:
    """Run `fn` `warmup` + `repeats` times, each ended by `sync`, like `timeit` done right."""
    timer = Timer(sync, warmup=warmup)
    for _ in range(warmup + repeats):
        with timer.region():
            fn()
    return timer
