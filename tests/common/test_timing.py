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
