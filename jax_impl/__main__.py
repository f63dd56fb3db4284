"""`python -m jax_impl --workload lenet --gpus 2`: see common/cli.py for the arguments."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from common import signals

if TYPE_CHECKING:
    from common.devices import DevicePlan


def before_import(plan: DevicePlan) -> None:
    from common import devices

    # XLA reads the host device count once, when JAX starts: set it before any jax import.
    if plan.virtual:
        devices.set_jax_host_devices(plan.count)
    if plan.platform == "cpu":
        # PLATFORM=cpu on a GPU machine: JAX must not start CUDA (nor reserve 75% of the GPU).
        os.environ["JAX_PLATFORMS"] = "cpu"


def load(workload: str):
    """The workload's module and what common needs of JAX (harness.Hooks), imported only now:
    after before_import has set XLA's flags."""
    from common import harness
    from jax_impl import ceiling, devices

    if workload == "lenet":
        from jax_impl import lenet as module
    elif workload == "resnet18":
        from jax_impl import resnet18 as module
    elif workload == "zero":
        from jax_impl import zero as module
    elif workload == "allreduce":
        from jax_impl import allreduce as module
    else:
        from jax_impl import resnet50 as module
    return module, harness.Hooks("jax", devices, ceiling.build)


def run(argv: list[str] | None = None) -> int:
    # Imported here, under signals.main: a stop while numpy and JAX import is one line too.
    from common import cli
    from jax_impl import guard

    if argv is None and guard.wrapped(sys.argv[1:]):  # a process of several: its abort is a line
        return guard.run_wrapped(sys.argv[1:])
    return cli.run("jax", argv, before_import, load)


if __name__ == "__main__":
    sys.exit(signals.main(run))
