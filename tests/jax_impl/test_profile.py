"""--profile in jax (jax_impl/devices.profiler): tests/fixtures/profile_checks.py."""

import pytest

from tests.fixtures import profile_checks


def test_a_profiled_lenet_run_traces_its_first_timed_epoch_and_ceiling_repeat(tmp_path):
    profile_checks.check_run("jax", tmp_path)


def test_a_profiled_ceiling_traces_its_first_timed_repeat(tmp_path):
    profile_checks.check_ceiling("jax", tmp_path)


@pytest.mark.slow
def test_a_profiled_resnet50_pipeline_traces_one_timed_repeat(tmp_path):
    profile_checks.check_resnet50("jax", tmp_path)


@pytest.mark.gpu
def test_a_profiled_gpu_run_traces_the_gpu_kernels(tmp_path):
    profile_checks.check_gpu("jax", tmp_path, ())
