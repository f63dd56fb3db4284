"""MXNET_DIST_INIT_TIMEOUT past a day: Python's timer overflows in a thread of its own (its
traceback) and the worker would wait for the others without a bound; refused in one line,
as the command line's timeouts are (tests/common/test_timeouts.py)."""

import pytest

from tests.fixtures import bad_inputs


@pytest.mark.slow
@pytest.mark.multi_device
def test_an_absurd_join_timeout_is_one_line(tmp_path):
    case = bad_inputs.case(
        "MXNET_DIST_INIT_TIMEOUT=1e10",
        "mxnet resnet18 --gpus 2 --strategy dist",
        2,
        "MXNET_DIST_INIT_TIMEOUT=10000000000: at most 86400 s (a day)",
        imports=True,
        env={"MXNET_DIST_INIT_TIMEOUT": "10000000000"},
    )
    bad_inputs.check(case, tmp_path)
