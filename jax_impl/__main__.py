"""`python -m jax_impl --workload lenet --gpus 2`: see common/cli.py for the arguments."""

import os
import sys

from common import cli, devices


def before_import(plan: devices.DevicePlan) -> None:
    # XLA reads the host device count once, when JAX starts: set it before any jax import.
    if plan.virtual:
        devices.set_jax_host_devices(plan.count)
    if plan.platform == "cpu":
        # PLATFORM=cpu on a GPU machine: JAX must not start CUDA (nor reserve 75% of the GPU).
        os.environ["JAX_PLATFORMS"] = "cpu"


if __name__ == "__main__":
    sys.exit(cli.run("jax", before_import=before_import))
