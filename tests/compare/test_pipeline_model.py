"""The two sweep models: hand-computed values; synthetic serial and pipelined sweeps from known
parameters, where the selection must pick the model that made them and recover its parameters;
and the tutorial's own H100 numbers, where the stages do not overlap."""

import pytest

from compare import pipeline_model as pm
from compare import records, resnet50
from tests.compare import fixture_records

BATCH = 120
SPLITS = (1, 3, 5, 8, 10, 12, 20, 40, 60)  # the tutorial's sweep
STAGES = [0.3, 0.5]  # seconds per stage, one whole batch
SCALE = 3.0  # num_batches per timed repeat
OVERHEAD = 0.004  # seconds per micro-batch


def synthetic(kind, stages=STAGES, scale=SCALE, overhead=OVERHEAD, noise=None) -> dict:
    """A sweep made by the model of `kind`; noise: split size -> factor."""
    noise = noise or {}
    return {
        s: pm.predict(kind, pm.micro_batches(BATCH, s), len(stages), stages, scale, overhead)
        * noise.get(s, 1.0)
        for s in SPLITS
    }


# +-3% on alternate points: a deterministic stand-in for timing noise
NOISE = {s: (1.03 if i % 2 else 0.97) for i, s in enumerate(SPLITS)}


def test_hand_computed_values():
    assert pm.micro_batches(120, 20) == 6
    assert pm.micro_batches(120, 50) == 3  # 50 + 50 + 20
    assert pm.bubble_fraction(4, 2) == pytest.approx(1 / 5)
    assert pm.bubble_fraction(1, 2) == pytest.approx(1 / 2)
    # pipelined, m = 4, p = 2: (4 + 1) / 4 * 0.5 = 0.625, plus 4 * 0.01
    assert pm.predict(pm.PIPELINED, 4, 2, [0.2, 0.5], 1.0, 0.01) == pytest.approx(0.665)
    # serial: the stages add, 0.2 + 0.5, plus 4 * 0.01, whatever the stage count
    assert pm.predict(pm.SERIAL, 4, 2, [0.2, 0.5], 1.0, 0.01) == pytest.approx(0.74)
    assert pm.predict(pm.SERIAL, 4, 8, [0.2, 0.5], 1.0, 0.01) == pytest.approx(0.74)
    # split 20 of 120: m = 6, (6 + 1) / 6 * 0.5 * 3 + 6 * 0.004
    assert synthetic(pm.PIPELINED)[20] == pytest.approx(7 / 6 * 0.5 * 3 + 0.024, rel=1e-12)
    assert synthetic(pm.SERIAL)[20] == pytest.approx(0.8 * 3 + 0.024, rel=1e-12)


@pytest.mark.parametrize("kind, other", [(pm.SERIAL, pm.PIPELINED), (pm.PIPELINED, pm.SERIAL)])
def test_selection_picks_the_model_that_made_the_sweep(kind, other):
    measured = synthetic(kind)
    sel = pm.select(STAGES, BATCH, measured)
    assert sel.best == sel.chosen == kind
    model = sel.model
    assert model.kind == kind and not model.constrained
    assert model.scale == pytest.approx(SCALE, rel=1e-9)
    assert model.overhead == pytest.approx(OVERHEAD, rel=1e-9)
    assert sel.fits[kind].max_error < 1e-9  # every held-out point predicted exactly
    assert sel.fits[other].mean_error > 0.02  # the other model misses them
    assert set(sel.fits[kind].held_out) == set(SPLITS)


@pytest.mark.parametrize("kind", [pm.SERIAL, pm.PIPELINED])
def test_selection_on_noisy_sweeps(kind):
    overhead = 0.02  # large enough against the work that the noise does not hide it
    sel = pm.select(STAGES, BATCH, synthetic(kind, overhead=overhead, noise=NOISE))
    assert sel.chosen == kind
    assert sel.model.scale == pytest.approx(SCALE, rel=0.01)
    assert sel.model.overhead == pytest.approx(overhead, rel=0.05)
    assert 0.02 < sel.fits[kind].mean_error < 0.06  # about the 3% noise


def test_held_out_error_is_the_error_of_the_fit_made_without_the_point():
    measured = synthetic(pm.SERIAL)
    measured[12] *= 1.05  # one point 5% slow
    fitted = pm.cross_validate(pm.SERIAL, STAGES, BATCH, measured)
    # without split 12 the other points are exact: the model is the true one, 5% under it
    assert fitted.held_out[12] == pytest.approx(1 / 1.05 - 1, rel=1e-9)
    in_sample = pm.errors(fitted.model, measured)[12]
    assert abs(in_sample) < abs(fitted.held_out[12])  # a point in the fit is easier to predict
    assert fitted.max_error == pytest.approx(1 - 1 / 1.05, rel=1e-9)


def test_neither_model_fits_a_sweep_off_both():
    # time falling with more micro-batches: no a, o >= 0 of either model gives that
    measured = {s: 1.0 + 0.05 * s for s in SPLITS}
    sel = pm.select(STAGES, BATCH, measured)
    assert sel.best is not None and sel.fits[sel.best].mean_error > pm.FIT_LIMIT
    assert sel.chosen is None and sel.model is None
    assert all(f.model.constrained for f in sel.fits.values())
    assert all(f.model.scale >= 0 and f.model.overhead >= 0 for f in sel.fits.values())


def test_tutorial_h100_sweep_is_serial():
    """The PyTorch tutorial's own program on one H100, both stages on cuda:0 (so nothing can
    overlap), tutorial sizes (batch 120, 3 batches per train()), mean seconds of 10 train()
    calls, as reported for that run. Its stage times were not measured: the model_parallel time
    (0.19 s for 3 batches) split evenly stands in; the serial model needs only their sum."""
    measured = {
        1: 5.23,
        3: 2.13,
        5: 1.23,
        8: 0.88,
        10: 0.70,
        12: 0.60,
        20: 0.45,
        40: 0.29,
        60: 0.24,
    }
    stages = [0.19 / 3 / 2] * 2
    sel = pm.select(stages, BATCH, measured)
    assert sel.chosen == pm.SERIAL
    assert sel.fits[pm.SERIAL].mean_error < 0.05 < sel.fits[pm.PIPELINED].mean_error
    # the per-micro-batch overhead dominates: ~45 ms per micro-batch and train() of 3 batches
    assert sel.model.overhead == pytest.approx(0.0456, rel=0.02)


def test_best_split_balances_bubble_and_overhead():
    model = pm.fit(pm.PIPELINED, STAGES, BATCH, synthetic(pm.PIPELINED))
    # argmin of 3 * 0.5 * (m + 1) / m + 0.004 m over the sweep's m = 120, 40, 24, 15, 12, 10, ...
    times = synthetic(pm.PIPELINED)
    assert pm.best_split(model, SPLITS) == min(times, key=times.get) == 5
    serial = pm.fit(pm.SERIAL, STAGES, BATCH, synthetic(pm.SERIAL))
    assert pm.best_split(serial, SPLITS) == 60  # no overlap: the fewest micro-batches


def test_projection_keeps_total_work_and_imbalance():
    model = pm.fit(pm.PIPELINED, STAGES, BATCH, synthetic(pm.PIPELINED))
    # 4 stages: the slowest stage is 0.5 / 0.4 * 0.8 / 4 = 0.25 s
    assert pm.stage_time(STAGES, 4) == pytest.approx(0.25)
    assert pm.stage_time(STAGES, 2) == pytest.approx(0.5)  # measured stages: the measured max
    m = pm.micro_batches(BATCH, 10)
    assert model.predict(10, 4) == pytest.approx(SCALE * (m + 3) / m * 0.25 + m * OVERHEAD)
    # one micro-batch cannot overlap anything: more stages do not help
    assert model.predict(BATCH, 8) == pytest.approx(model.predict(BATCH, 2))
    assert model.predict(5, 8) < model.predict(5, 4) < model.predict(5, 2)
    serial = pm.fit(pm.SERIAL, STAGES, BATCH, synthetic(pm.SERIAL))
    assert serial.predict(5, 8) == pytest.approx(serial.predict(5, 2))  # nothing overlaps


def test_fit_needs_two_distinct_micro_batch_counts():
    for kind in pm.KINDS:
        assert pm.fit(kind, STAGES, BATCH, {20: 1.0}) is None
        assert pm.fit(kind, STAGES, BATCH, {70: 1.0, 80: 1.1}) is None  # both 2 micro-batches
        assert pm.fit(kind, [0.5], BATCH, {1: 1.0, 60: 2.0}) is None  # one stage: no pipeline
    assert pm.select(STAGES, BATCH, {20: 1.0}) is None
    two = pm.select(STAGES, BATCH, {1: 2.0, 60: 1.0})  # fitted, but nothing left to test it
    assert two.best is None and two.chosen is None and not two.fits[pm.SERIAL].held_out


def test_busy_fractions_are_one_less_the_bubble_for_balanced_stages():
    for m in (1, 2, 4, 8):
        want = 1 - pm.bubble_fraction(m, 2)
        assert pm.busy_fractions(m, [3.0, 3.0]) == pytest.approx([want, want])


def test_busy_fractions_follow_the_slowest_stage():
    # stage 1 takes 3x stage 0: at m micro-batches the batch spans 1 + 3 + (m - 1) 3 slots
    assert pm.busy_fractions(1, [1.0, 3.0]) == pytest.approx([1 / 4, 3 / 4])
    assert pm.busy_fractions(4, [1.0, 3.0]) == pytest.approx([4 / 13, 12 / 13])


def test_the_bubble_table_sets_each_micro_batch_count_against_both_formulas():
    def run(strategy, split, busy, minute):
        rec = fixture_records.resnet50("torch", strategy, 3.0, minute, split=split)
        rec.extra["stage_busy"] = busy
        return records.Entry(rec, "r.jsonl", minute)

    batch = fixture_records.R50_BATCH
    entries = [run("gpipe", batch, [0.25, 0.75], 1), run("gpipe", batch // 4, [0.3, 0.9], 2)]
    table = resnet50.bubble_table(entries + [run("1f1b", batch // 4, [0.31, 0.92], 3)])
    rows = {(r[0], r[1]): r for r in table.rows}
    assert rows[("gpipe", "1")][3:6] == ["0.25 / 0.75", "0.25 / 0.75", "0.50"]
    assert rows[("gpipe", "4")][3:6] == ["0.30 / 0.90", "0.31 / 0.92", "0.80"]
    assert rows[("1f1b", "4")][4] == "0.31 / 0.92"  # the same work ratio: gpipe's at m = 1
    assert resnet50.bubble_table(entries[:1]) is None  # one count: nothing swept
