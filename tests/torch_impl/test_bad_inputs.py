"""The bad-input matrix (tests/fixtures/bad_inputs.py): the cases that import torch."""

import pytest

from tests.fixtures import bad_inputs, interrupt


@pytest.mark.parametrize("case", bad_inputs.for_suite("torch"))
def test_bad_input_ends_in_one_line_and_writes_nothing(case, tmp_path):
    bad_inputs.check(case, tmp_path)


def test_ctrl_c_while_training_is_one_line_and_leaves_nothing(tmp_path):
    interrupt.check("torch_impl --workload lenet", tmp_path)


@pytest.mark.slow
@pytest.mark.multi_device
def test_ctrl_c_on_two_devices_is_one_line_and_leaves_nothing(tmp_path):
    """DDP: the launcher, torchrun and its workers."""
    interrupt.check("torch_impl --workload resnet18 --gpus 2", tmp_path)
