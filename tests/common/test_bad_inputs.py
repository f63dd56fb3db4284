"""The bad-input matrix (tests/fixtures/bad_inputs.py), part 1: the cases refused before any
framework is imported, and the report's. Each framework's suite runs the cases that import it
(tests/<framework>_impl/test_bad_inputs.py)."""

import pytest

from tests.fixtures import bad_inputs


@pytest.mark.parametrize("case", bad_inputs.for_suite(None))
def test_bad_input_ends_in_one_line_and_writes_nothing(case, tmp_path):
    bad_inputs.check(case, tmp_path)
