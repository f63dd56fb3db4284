"""Every wait ends by itself: a timeout of the command line past a day is refused in one line
before anything starts (far past it, Python's and the engines' clocks overflow: a thread's
traceback, and a join without its bound), and so is --peer-timeout where no peer can be lost.
MXNet's own MXNET_DIST_INIT_TIMEOUT: tests/mxnet_impl/test_timeouts.py."""

import pytest

from tests.fixtures import bad_inputs

NODE1 = "resnet18 --nnodes 2 --node-rank 1 --rdzv-endpoint 127.0.0.1:29872"
HUGE = "10000000000"
ONE_PROCESS = "--peer-timeout bounds a run of several processes (torch ddp or MXNet dist on 2 "
CASES = [
    bad_inputs.case(
        "MXNet --rdzv-timeout 1e10",
        f"mxnet {NODE1} --rdzv-timeout {HUGE}",
        2,
        f"--rdzv-timeout must be at most 86400 s (a day), got {HUGE}",
    ),
    bad_inputs.case(
        "torch --rdzv-timeout 1e10",
        f"torch {NODE1} --rdzv-timeout {HUGE}",
        2,
        f"--rdzv-timeout must be at most 86400 s (a day), got {HUGE}",
    ),
    bad_inputs.case(
        "torch --peer-timeout 1e10",
        f"torch {NODE1} --peer-timeout {HUGE}",
        2,
        f"--peer-timeout must be at most 86400 s (a day), got {HUGE}",
    ),
    bad_inputs.case(
        "JAX --rdzv-timeout 99999",
        f"jax {NODE1} --rdzv-timeout 99999",
        2,
        "--rdzv-timeout must be at most 86400 s (a day), got 99999",
    ),
    bad_inputs.case(
        "--peer-timeout 0, one machine",
        "torch resnet18 --gpus 2 --peer-timeout 0",
        2,
        "--peer-timeout must be at least 1 s, got 0",
    ),
    bad_inputs.case(
        "--peer-timeout, one process",
        "torch resnet18 --gpus 1 --peer-timeout 60",
        2,
        f"{ONE_PROCESS}or more devices, JAX_NUM_PROCESSES, --nnodes); this run has one: drop it",
    ),
    bad_inputs.case(
        "--peer-timeout, lenet", "mxnet lenet --gpus 2 --peer-timeout 60", 2, ONE_PROCESS
    ),
    bad_inputs.case(
        "--peer-timeout, JAX", "jax resnet18 --gpus 2 --peer-timeout 60", 2, ONE_PROCESS
    ),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_an_absurd_timeout_is_one_line_before_anything_starts(case, tmp_path):
    bad_inputs.check(case, tmp_path)
