"""`python -m mxnet_impl --workload lenet --gpus 2`: see common/cli.py for the arguments."""

import sys

from common import cli, devices


def before_import(plan: devices.DevicePlan) -> None:
    # MXNet fixes its OpenMP threads when it loads: every CPU allowed, not its default half.
    devices.set_mxnet_threads()


if __name__ == "__main__":
    sys.exit(cli.run("mxnet", before_import=before_import))
