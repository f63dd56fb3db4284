"""The bad-input matrix (tests/fixtures/bad_inputs.py): the cases that import torch."""

import pytest

from tests.fixtures import bad_inputs


@pytest.mark.parametrize("case", bad_inputs.for_suite("torch"))
def test_bad_input_ends_in_one_line_and_writes_nothing(case, tmp_path):
    bad_inputs.check(case, tmp_path)
