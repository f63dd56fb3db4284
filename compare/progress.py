"""How much of `make compare`'s plan is left (compare/run.py prints it at every step).

Each step of the plan has a prior: rough seconds of one run by workload, preset and devices.
Before any run the estimate is the sum of the priors of the steps left; after, that sum is
scaled by how long the finished runs took against their own priors, so a machine twice as slow
as the one the priors describe shows twice the estimate once its first run is done.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compare.plan import Step

# (workload, preset) -> rough seconds of one run: (on 1 device, on 2 devices, a resnet50 split
# size sweep). The cpu and full values follow the gaps between consecutive records of one
# reference file each (a record is written when its run ends): results/cpu-avx2-2core.jsonl
# and results/gpu-h200.jsonl, the sweep on a GPU results/gpu-h100.jsonl. A smoke run is a
# framework's start and a few steps. They are a starting point only: the finished runs rescale
# them.
PRIORS: dict[tuple[str, str], tuple[float, float, float]] = {
    ("lenet", "smoke"): (10, 10, 10),
    ("lenet", "cpu"): (250, 200, 200),
    ("lenet", "full"): (25, 25, 25),
    ("resnet18", "smoke"): (15, 15, 15),
    ("resnet18", "cpu"): (200, 180, 180),
    ("resnet18", "full"): (60, 60, 60),
    ("resnet50", "smoke"): (15, 15, 20),
    ("resnet50", "cpu"): (60, 60, 140),
    ("resnet50", "full"): (20, 40, 200),
}
# A CPU's scaling runs (a core per device, fewer steps: compare/plan.py PINNED_FLAGS), on 1 and
# 2 devices, following the records of results/cpu-avx512-2core-cores.jsonl; resnet50's are its
# 2-device runs above.
PINNED_PRIORS: dict[tuple[str, str], tuple[float, float]] = {
    ("lenet", "smoke"): (10, 10),
    ("lenet", "cpu"): (110, 80),
    ("resnet18", "smoke"): (15, 15),
    ("resnet18", "cpu"): (85, 75),
}
UNKNOWN_PRIOR = 60.0  # a workload or preset the table does not know yet


def prior(step: Step, preset: str) -> float:
    """The prior seconds of one step of the plan at `preset`."""
    one, two, sweep = PRIORS.get((step.workload, preset), (UNKNOWN_PRIOR,) * 3)
    if "--sweep" in step.flags:
        return float(sweep)
    if step.cores and (step.workload, preset) in PINNED_PRIORS:
        one, two = PINNED_PRIORS[step.workload, preset]
    return float(one if step.gpus == 1 else two)


def about(seconds: float) -> str:
    """`about 12 min`, rounded up, so the figure reaches 0 only when nothing is left."""
    return f"about {math.ceil(seconds / 60)} min" if seconds > 0 else "under a minute"


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


@dataclass
class Progress:
    """The steps done and the time they took; `line()` says what is left."""

    priors: list[float]
    done: int = 0
    elapsed: float = 0.0  # seconds of every finished step
    measured: float = 0.0  # seconds of the finished runs that succeeded
    expected: float = 0.0  # the priors of those runs

    @classmethod
    def of(cls, steps, preset: str) -> Progress:
        return cls([prior(s, preset) for s in steps])

    def finish(self, seconds: float, ok: bool) -> None:
        """One more step done. Only a run that succeeded rescales the priors: a failed run
        stops early, a skipped one does not start, and neither says how fast this machine is."""
        if ok:
            self.measured += seconds
            self.expected += self.priors[self.done]
        self.done += 1
        self.elapsed += seconds

    @property
    def scale(self) -> float:
        """Finished runs' seconds over their priors; 1 before any run succeeded."""
        return self.measured / self.expected if self.measured > 0 and self.expected > 0 else 1.0

    def left(self) -> float:
        """Estimated seconds of the steps not yet done; 0 when all are."""
        return self.scale * sum(self.priors[self.done :])

    def line(self) -> str:
        """`plan: 3 of 24 run(s) done in 12 min; about 58 min left (estimated ...)`."""
        total = len(self.priors)
        head = f"plan: {self.done} of {total} run(s) done in {duration(self.elapsed)}"
        if self.done >= total:
            return f"{head}; done"
        basis = (
            f"the priors scaled by the finished runs, x{self.scale:.2f}"
            if self.expected
            else "the preset's priors, before any run"
        )
        return f"{head}; {about(self.left())} left (estimated from {basis})"
