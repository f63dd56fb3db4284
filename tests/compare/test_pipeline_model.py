"""The GPipe model: hand-computed values, and a synthetic sweep from known stage times that the
fit must reproduce (recovering the overhead and the scale)."""

import pytest

from compare import pipeline_model as pm

BATCH = 120
SPLITS = (1, 3, 5, 8, 10, 12, 20, 40, 60)  # the tutorial's sweep
STAGES = [0.3, 0.5]  # seconds per stage, one whole batch
SCALE = 3.0  # num_batches per timed repeat
OVERHEAD = 0.004  # seconds per micro-batch


def synthetic(stages=STAGES, scale=SCALE, overhead=OVERHEAD) -> dict[int, float]:
    p, t = len(stages), max(stages)
    return {s: pm.predict(pm.micro_batches(BATCH, s), p, t, scale, overhead) for s in SPLITS}


def test_hand_computed_values():
    assert pm.micro_batches(120, 20) == 6
    assert pm.micro_batches(120, 50) == 3  # 50 + 50 + 20
    assert pm.bubble_fraction(4, 2) == pytest.approx(1 / 5)
    assert pm.bubble_fraction(1, 2) == pytest.approx(1 / 2)
    # m = 4, p = 2: (4 + 1) / 4 * 0.5 = 0.625, plus 4 * 0.01
    assert pm.predict(4, 2, 0.5, 1.0, 0.01) == pytest.approx(0.665, rel=1e-12)
    # split 20 of 120: m = 6, (6 + 1) / 6 * 0.5 * 3 + 6 * 0.004
    assert synthetic()[20] == pytest.approx(7 / 6 * 0.5 * 3 + 0.024, rel=1e-12)


def test_fit_reproduces_a_synthetic_sweep():
    measured = synthetic()
    model = pm.fit(STAGES, BATCH, measured)
    assert model.fit_splits == (1, 60)  # the most and the fewest micro-batches
    assert model.overhead == pytest.approx(OVERHEAD, rel=1e-9)
    assert model.scale == pytest.approx(SCALE, rel=1e-9)
    for split, seconds in measured.items():
        assert model.predict(split) == pytest.approx(seconds, rel=1e-9)
    mean, worst = pm.held_out_error(model, measured)
    assert worst < 1e-9


def test_fit_on_disturbed_points_reports_their_error():
    measured = synthetic()
    measured[12] *= 1.05  # a held-out point 5% slow
    model = pm.fit(STAGES, BATCH, measured)
    assert model.overhead == pytest.approx(OVERHEAD, rel=1e-9)  # the two fit points are exact
    errors = pm.errors(model, measured)
    assert errors[12] == pytest.approx(1 / 1.05 - 1, rel=1e-9)
    mean, worst = pm.held_out_error(model, measured)
    assert worst == pytest.approx(1 - 1 / 1.05, rel=1e-9)
    assert mean == pytest.approx((1 - 1 / 1.05) / 7, rel=1e-9)  # 7 held-out points


def test_best_split_balances_bubble_and_overhead():
    model = pm.fit(STAGES, BATCH, synthetic())
    # argmin of 3 * 0.5 * (m + 1) / m + 0.004 m over the sweep's m = 120, 40, 24, 15, 12, 10, ...
    times = {s: synthetic()[s] for s in SPLITS}
    assert pm.best_split(model, SPLITS) == min(times, key=times.get) == 5


def test_projection_keeps_total_work_and_imbalance():
    model = pm.fit(STAGES, BATCH, synthetic())
    # 4 stages: the slowest stage is 0.5 / 0.4 * 0.8 / 4 = 0.25 s
    assert pm.stage_time(STAGES, 4) == pytest.approx(0.25)
    assert pm.stage_time(STAGES, 2) == pytest.approx(0.5)  # measured stages: the measured max
    m = pm.micro_batches(BATCH, 10)
    assert model.predict(10, 4) == pytest.approx(SCALE * (m + 3) / m * 0.25 + m * OVERHEAD)
    # one micro-batch cannot overlap anything: more stages do not help
    assert model.predict(BATCH, 8) == pytest.approx(model.predict(BATCH, 2))
    assert model.predict(5, 8) < model.predict(5, 4) < model.predict(5, 2)


def test_fit_needs_two_distinct_micro_batch_counts():
    assert pm.fit(STAGES, BATCH, {20: 1.0}) is None
    assert pm.fit(STAGES, BATCH, {70: 1.0, 80: 1.1}) is None  # both 2 micro-batches
    assert pm.fit([0.5], BATCH, {1: 1.0, 60: 2.0}) is None  # one stage is not a pipeline


def test_points_off_the_model_give_a_nonnegative_fit():
    # more micro-batches much slower than the bubble allows: the exact fit has a < 0
    measured = {1: 20.0, 2: 1.7, 4: 1.0}
    model = pm.fit([0.13, 0.45], 4, measured)
    assert model.constrained
    assert model.scale >= 0 and model.overhead >= 0
    assert model.scale == 0.0 and model.overhead == pytest.approx((4 * 20 + 1) / 17)
    assert not pm.fit(STAGES, BATCH, synthetic()).constrained
