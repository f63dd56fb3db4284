"""Where a process trains: its place among the processes of one run, the same small object in
every framework. Each framework's `launch.join(plan, args)` makes it (torch's process group,
`jax.distributed`, MXNet's kvstore dist_sync) or, in a process that joins none, `World.single`.
A strategy (common/training.py) takes it and reaches for nothing global. Framework-free: the
frameworks hand in their devices and their collective."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.devices import DevicePlan


def alone(x):
    """The sum over a world of one process: `x` itself."""
    return x


@dataclass(frozen=True)
class World:
    """This process is `rank` of `size`. `devices`: those its strategy spreads over (its own;
    in JAX, whose one program spans every process, every process's). `sum(x)`: a number or
    numpy array summed element-wise over every process, as numpy (`alone` for one process).
    `plan`: the run's devices, every process's counted. `group`: the joined processes' own
    object where a strategy needs it (MXNet's kvstore, which its Trainer takes; torch's default
    process group), None where none was joined or the engine has none (JAX)."""

    rank: int
    size: int
    devices: list
    sum: Callable[[Any], Any]
    plan: DevicePlan
    group: Any = None

    @classmethod
    def single(cls, devices, plan: DevicePlan) -> World:
        """A process alone, on `devices` (`plan`'s)."""
        return cls(0, 1, list(devices), alone, plan)
