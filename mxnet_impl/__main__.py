"""`python -m mxnet_impl --workload lenet --gpus 2`: see common/cli.py for the arguments.

The same command is each kvstore dist_sync worker that mxnet_impl/launch.py starts (or a user
starts by hand): DMLC_ROLE=worker in its environment makes it one.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from common import signals

if TYPE_CHECKING:
    from common.devices import DevicePlan


def before_import(plan: DevicePlan) -> None:
    from common import devices

    # MXNet fixes its OpenMP threads when it loads: every CPU allowed, not its default half.
    devices.set_mxnet_threads()


def load(workload: str):
    """The workload's module and what common needs of MXNet (harness.Hooks)."""
    from common import harness
    from mxnet_impl import ceiling, devices

    if workload == "lenet":
        from mxnet_impl import lenet as module
    elif workload == "resnet18":
        from mxnet_impl import resnet18 as module
    elif workload == "zero":
        from mxnet_impl import zero as module
    elif workload == "allreduce":
        from mxnet_impl import allreduce as module
    else:
        from mxnet_impl import resnet50 as module
    return module, harness.Hooks("mxnet", devices, ceiling.build)


def run(argv: list[str] | None = None) -> int:
    # Imported here, under signals.main: a stop while numpy and MXNet import is one line too.
    from common import cli

    return cli.run("mxnet", argv, before_import, load)


if __name__ == "__main__":
    sys.exit(signals.main(run))
