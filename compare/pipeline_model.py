"""Two timing models for the resnet50 split_size sweep, fitted to it and tested on held-out points.

A timed repeat runs `a` batches of m = ceil(batch_size / split_size) micro-batches through p
stages, each micro-batch at a fixed overhead o (launches, copies, a smaller kernel):
- pipelined (GPipe): the stages overlap, a batch takes m + p - 1 slots of the slowest stage's
  micro-batch: `T = a * (m + p - 1) / m * max_stage + m * o`;
- serial: nothing overlaps (one CPU process on every core, or both stages on one GPU):
  `T = a * sum(stages) + m * o`.
The stage times are measured; `a` and `o` are fitted by least squares on the relative error,
both >= 0. Leaving each split size out in turn tests a model; the one with the smaller mean
held-out error is chosen if that is at most FIT_LIMIT. Projections to more stages keep the total
stage work and its imbalance (max / mean).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PIPELINED, SERIAL = "pipelined", "serial"
KINDS = (PIPELINED, SERIAL)
FIT_LIMIT = 0.10  # the most mean held-out error a model may have and still be said to fit


def micro_batches(batch_size: int, split_size: int) -> int:
    return math.ceil(batch_size / split_size)


def bubble_fraction(m: int, p: int) -> float:
    return (p - 1) / (m + p - 1)


def stage_time(stage_seconds, stages: int) -> float:
    """The slowest stage when the same total work is cut into `stages` stages, keeping the
    measured imbalance."""
    t = np.asarray(stage_seconds, dtype=float)
    return float(t.max() / t.mean() * t.sum() / stages)


def batch_work(kind: str, stage_seconds, m: int, p: int) -> float:
    """Seconds one batch of m micro-batches takes through p stages, before the overheads."""
    if kind == SERIAL:
        return float(np.sum(stage_seconds))  # the same total work whatever the stage count
    return (m + p - 1) / m * stage_time(stage_seconds, p)


def predict(kind: str, m: int, p: int, stage_seconds, scale: float, overhead: float) -> float:
    return scale * batch_work(kind, stage_seconds, m, p) + m * overhead


@dataclass(frozen=True)
class Model:
    kind: str  # PIPELINED or SERIAL
    stage_seconds: tuple[float, ...]  # measured, per whole batch
    batch_size: int
    scale: float  # a
    overhead: float  # seconds per micro-batch and timed repeat
    constrained: bool = False  # the free fit had a negative parameter: one was held at 0

    @property
    def stages(self) -> int:
        return len(self.stage_seconds)

    def predict(self, split_size: int, stages: int | None = None) -> float:
        m = micro_batches(self.batch_size, split_size)
        p = stages or self.stages
        return predict(self.kind, m, p, self.stage_seconds, self.scale, self.overhead)


def fit(kind: str, stage_seconds, batch_size: int, measured: dict[int, float]) -> Model | None:
    """The model of `kind` closest in relative error to `measured` (split size -> seconds); None
    without two micro-batch counts to pin down two parameters, or with one stage."""
    splits = sorted(measured)
    ms = [micro_batches(batch_size, s) for s in splits]
    if len(stage_seconds) < 2 or len(set(ms)) < 2:
        return None
    p = len(stage_seconds)
    y = np.array([measured[s] for s in splits], dtype=float)
    rows = np.array([[batch_work(kind, stage_seconds, m, p), m] for m in ms], dtype=float)
    rows /= y[:, None]  # relative residuals: every point counts alike, fast or slow
    target = np.ones(len(y))
    params = np.linalg.lstsq(rows, target, rcond=None)[0]
    constrained = bool((params < 0).any())
    if constrained:  # the better of the fits with one parameter held at 0
        params, best = np.zeros(2), float(np.sum(target * target))
        for j in (0, 1):
            col, held = rows[:, j], np.zeros(2)
            held[j] = max(0.0, float(col @ target) / float(col @ col))
            if (residual := float(np.sum((rows @ held - target) ** 2))) < best:
                params, best = held, residual
    stages = tuple(float(t) for t in stage_seconds)
    return Model(kind, stages, batch_size, float(params[0]), float(params[1]), constrained)


def errors(model: Model, measured: dict[int, float]) -> dict[int, float]:
    """Relative error of every point, by the model fitted to all of them."""
    return {s: (model.predict(s) - t) / t for s, t in sorted(measured.items())}


@dataclass(frozen=True)
class Fit:
    model: Model  # fitted to every point
    held_out: dict[int, float]  # split size -> relative error of the fit made without it

    @property
    def mean_error(self) -> float | None:
        values = [abs(e) for e in self.held_out.values()]
        return float(np.mean(values)) if values else None

    @property
    def max_error(self) -> float | None:
        return max((abs(e) for e in self.held_out.values()), default=None)


def cross_validate(kind: str, stage_seconds, batch_size: int, measured: dict[int, float]):
    """The fit to every point, and each point's error when it is left out of the fit."""
    model = fit(kind, stage_seconds, batch_size, measured)
    if model is None:
        return None
    held_out = {}
    for split in sorted(measured):
        rest = {s: t for s, t in measured.items() if s != split}
        if (without := fit(kind, stage_seconds, batch_size, rest)) is not None:
            held_out[split] = (without.predict(split) - measured[split]) / measured[split]
    return Fit(model, held_out)


@dataclass(frozen=True)
class Selection:
    fits: dict[str, Fit]  # kind -> fit
    best: str | None  # the kind with the smaller mean held-out error (None: nothing held out)
    limit: float

    @property
    def chosen(self) -> str | None:
        """The best kind if its mean held-out error is within the limit: the model to use."""
        if self.best is None or self.fits[self.best].mean_error > self.limit:
            return None
        return self.best

    @property
    def model(self) -> Model | None:
        return None if self.chosen is None else self.fits[self.chosen].model


def select(stage_seconds, batch_size: int, measured: dict[int, float], limit=FIT_LIMIT):
    """Both models fitted and tested on `measured`; None when neither can be fitted."""
    fits = {k: cross_validate(k, stage_seconds, batch_size, measured) for k in KINDS}
    fits = {k: f for k, f in fits.items() if f is not None}
    if not fits:
        return None
    tested = [k for k in fits if fits[k].held_out]
    return Selection(fits, min(tested, key=lambda k: fits[k].mean_error, default=None), limit)


def best_split(model: Model, split_sizes, stages: int | None = None) -> int:
    return min(sorted(split_sizes), key=lambda s: model.predict(s, stages))


def busy_fractions(m: int, stage_work) -> list[float]:
    """Each stage's busy share of a batch of m micro-batches through stages whose micro-batch
    times are in the ratio of `stage_work`: the batch takes the first micro-batch through every
    stage, then m - 1 slots of the slowest, and stage s works m t_s of it."""
    t = np.asarray(stage_work, dtype=float)
    span = t.sum() + (m - 1) * t.max()
    return [float(m * ts / span) for ts in t]
