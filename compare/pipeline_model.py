"""A GPipe timing model beside the measured split_size sweep.

With p stages and m micro-batches, a pipelined batch takes about (m + p - 1) slots of the slowest
stage's micro-batch time, max_stage / m, so the bubble is (p - 1) / (m + p - 1) of it; every
micro-batch also costs a fixed overhead (launches, copies, a smaller and less efficient kernel).
For one timed repeat:

    T(m) = a * (m + p - 1) / m * max_stage + m * overhead

`max_stage` comes from the measured per-stage times (one whole batch, forward and backward, each
stage alone); `a` (ideally the number of batches in one timed repeat: a far from it says the stages
timed alone do not represent the pipeline) and `overhead` are fitted from two measured sweep
points, the fewest and the most micro-batches, and the other points test the model.
Projections to more stages keep the total stage work and its imbalance (max / mean).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def micro_batches(batch_size: int, split_size: int) -> int:
    """Micro-batches of `split_size`; the last one may be smaller."""
    return math.ceil(batch_size / split_size)


def bubble_fraction(m: int, p: int) -> float:
    return (p - 1) / (m + p - 1)


def stage_time(stage_seconds: list[float], stages: int) -> float:
    """The slowest stage when the same total work is cut into `stages` stages, keeping the
    measured imbalance; for the measured number of stages it is the measured maximum."""
    t = np.asarray(stage_seconds, dtype=float)
    return float(t.max() / t.mean() * t.sum() / stages)


@dataclass(frozen=True)
class Model:
    stage_seconds: tuple[float, ...]  # measured, per whole batch
    batch_size: int
    scale: float  # a
    overhead: float  # seconds per micro-batch and timed repeat
    fit_splits: tuple[int, int]  # the two split sizes the fit used
    constrained: bool = False  # the exact fit had a negative parameter: one was held at 0

    @property
    def stages(self) -> int:
        return len(self.stage_seconds)

    def predict(self, split_size: int, stages: int | None = None) -> float:
        p = stages or self.stages
        m = micro_batches(self.batch_size, split_size)
        return predict(m, p, stage_time(self.stage_seconds, p), self.scale, self.overhead)


def predict(m: int, p: int, max_stage: float, scale: float, overhead: float) -> float:
    return scale * (m + p - 1) / m * max_stage + m * overhead


def fit(stage_seconds: list[float], batch_size: int, measured: dict[int, float]) -> Model | None:
    """Fit `a` and `overhead` to the two sweep points with the fewest and the most micro-batches
    (`measured`: split size -> seconds). None when they do not pin the two down."""
    if len(stage_seconds) < 2 or len(measured) < 2:
        return None
    by_m = sorted(measured, key=lambda s: (micro_batches(batch_size, s), -s))
    lo, hi = by_m[0], by_m[-1]
    m_lo, m_hi = micro_batches(batch_size, lo), micro_batches(batch_size, hi)
    if m_lo == m_hi:
        return None
    p = len(stage_seconds)
    t = stage_time(stage_seconds, p)
    rows = np.array([[(m + p - 1) / m * t, m] for m in (m_lo, m_hi)], dtype=float)
    y = np.array([measured[lo], measured[hi]], dtype=float)
    params = np.linalg.solve(rows, y)
    constrained = bool((params < 0).any())
    if constrained:
        params = nonnegative_fit(rows, y)
    return Model(
        tuple(float(x) for x in stage_seconds),
        batch_size,
        float(params[0]),
        float(params[1]),
        (hi, lo),
        constrained,
    )


def nonnegative_fit(rows: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with both parameters >= 0 when the exact solution has a negative one
    (noisy points): the better of the fits with one parameter held at 0."""
    best, best_residual = np.zeros(2), float(np.sum(y * y))
    for j in (0, 1):
        col = rows[:, j]
        params = np.zeros(2)
        params[j] = max(0.0, float(col @ y) / float(col @ col))
        residual = float(np.sum((rows @ params - y) ** 2))
        if residual < best_residual:
            best, best_residual = params, residual
    return best


def errors(model: Model, measured: dict[int, float]) -> dict[int, float]:
    """Relative error (predicted - measured) / measured of every sweep point."""
    return {s: (model.predict(s) - t) / t for s, t in sorted(measured.items())}


def held_out_error(model: Model, measured: dict[int, float]) -> tuple[float, float] | None:
    """(mean, max) absolute relative error over the points the fit did not use."""
    errs = [abs(e) for s, e in errors(model, measured).items() if s not in model.fit_splits]
    if not errs:
        return None
    return float(np.mean(errs)), float(np.max(errs))


def best_split(model: Model, split_sizes, stages: int | None = None) -> int:
    return min(sorted(split_sizes), key=lambda s: model.predict(s, stages))
