from contextlib import contextmanager

import pytest

from common import timing


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_sync_ends_every_region_and_warmup_is_apart():
    clock = FakeClock()
    events = []

    def sync():
        events.append(("sync", clock.now))
        clock.now += 0.5  # the barrier waits for queued work: that time belongs in the region

    timer = timing.Timer(sync, warmup=1, clock=clock)
    for work in (10.0, 1.0, 2.0, 3.0):
        with timer.region():
            events.append(("work", clock.now))
            clock.now += work
    # Every region: sync before the clock starts, work, sync before the clock stops.
    assert [e[0] for e in events] == ["sync", "work", "sync"] * 4
    assert timer.warmup_times == [10.5]
    assert timer.times == [1.5, 2.5, 3.5]
    s = timer.stats()
    assert (s.median, s.mean, s.min, s.max, s.n) == (2.5, 2.5, 1.5, 3.5, 3)
    assert s.std == pytest.approx(1.0)


def test_benchmark_counts_calls():
    calls = []
    syncs = []
    timer = timing.benchmark(lambda: calls.append(1), lambda: syncs.append(1), repeats=3, warmup=2)
    assert len(calls) == 5
    assert len(syncs) == 10  # one before and one after each region
    assert len(timer.warmup_times) == 2 and timer.stats().n == 3


def test_single_repeat_has_zero_std_and_empty_is_an_error():
    assert timing.summarize([2.0]).std == 0.0
    with pytest.raises(ValueError):
        timing.summarize([])


def test_trace_wraps_the_first_timed_region_only_outside_its_clock():
    """--profile: the profiler runs around the first region after the warm-up (its syncs
    included), entered before the clock starts and left after it stops."""
    clock, events = FakeClock(), []

    @contextmanager
    def trace():
        events.append("enter")
        clock.now += 100.0  # the profiler's start and its export are not the region's time
        yield
        events.append("exit")
        clock.now += 100.0

    timer = timing.Timer(lambda: events.append("sync"), warmup=2, clock=clock, trace=trace)
    for work in (1.0, 2.0, 3.0, 4.0):
        with timer.region():
            events.append(f"work {work:g}")
            clock.now += work
    regions = ["sync", "work 1", "sync", "sync", "work 2", "sync"]
    regions += ["enter", "sync", "work 3", "sync", "exit", "sync", "work 4", "sync"]
    assert events == regions
    assert (timer.warmup_times, timer.times) == ([1.0, 2.0], [3.0, 4.0])
