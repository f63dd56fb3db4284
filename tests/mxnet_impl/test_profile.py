"""--profile in mxnet (mxnet_impl/devices.profiler): tests/fixtures/profile_checks.py."""

from tests.fixtures import profile_checks


def test_a_profiled_lenet_run_traces_its_first_timed_epoch(tmp_path):
    profile_checks.check_run("mxnet", tmp_path, with_ceiling=False)


def test_a_profiled_ceiling_traces_its_first_timed_repeat(tmp_path):
    profile_checks.check_ceiling("mxnet", tmp_path)


def test_a_profiled_resnet50_pipeline_traces_one_timed_repeat(tmp_path):
    profile_checks.check_resnet50("mxnet", tmp_path)
