"""How much of `make compare`'s plan is left: the priors (rough seconds of a run by workload,
preset and devices) of the steps left, scaled by how long the finished runs took against theirs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compare.plan import Step

# (workload, preset) -> seconds of a run on 1 device, on 2, and of a resnet50 sweep: the gaps
# between records of results/cpu-avx2-2core.jsonl, results/gpu-h200.jsonl and (the sweep on a
# GPU) results/gpu-h100.jsonl; a smoke run is a framework's start and a few steps.
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
# A CPU's scaling runs (a core per device, fewer steps: plan.PINNED_FLAGS) on 1 and 2 devices,
# from results/cpu-avx512-2core-cores.jsonl; resnet50's are its 2-device runs above.
PINNED_PRIORS: dict[tuple[str, str], tuple[float, float]] = {
    ("lenet", "smoke"): (10, 10),
    ("lenet", "cpu"): (110, 80),
    ("resnet18", "smoke"): (15, 15),
    ("resnet18", "cpu"): (85, 75),
}
UNKNOWN_PRIOR = 60.0  # a workload or preset the table does not know yet


def prior(step: Step, preset: str) -> float:
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
        """One more step done. Only a run that succeeded rescales the priors: a failed or
        skipped one says nothing of how fast this machine is."""
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
