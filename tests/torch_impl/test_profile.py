"""--profile in torch (torch_impl/devices.profiler): tests/fixtures/profile_checks.py."""

import argparse

import pytest
import torch

from common import harness, profiling
from tests.fixtures import profile_checks
from torch_impl import devices as tdev


def test_a_profiled_lenet_run_traces_its_first_timed_epoch_and_ceiling_repeat(tmp_path):
    profile_checks.check_run("torch", tmp_path)


def test_a_profiled_ceiling_traces_its_first_timed_repeat(tmp_path):
    profile_checks.check_ceiling("torch", tmp_path)


def test_a_profiled_resnet50_pipeline_traces_one_timed_repeat(tmp_path):
    profile_checks.check_resnet50("torch", tmp_path)


@pytest.mark.slow
def test_a_profiled_gpipe_run_traces_one_timed_repeat_per_stage(tmp_path):
    profile_checks.check_resnet50("torch", tmp_path, "gpipe")


def test_a_sweep_traces_each_split_size_to_a_file_of_its_own(tmp_path):
    args = argparse.Namespace(workload="resnet50", profile=str(tmp_path / "p"))
    hooks = harness.Hooks("torch", tdev)
    traces = profiling.resnet50_traces(hooks, args, "pipeline", (1, 2), sweep=True)
    for trace in traces.values():
        with trace():
            torch.ones(2).sum()
    names = sorted(p.name for p in (tmp_path / "p").iterdir())
    assert names == [
        f"torch-resnet50-pipeline-split{s}.{e}" for s in (1, 2) for e in ("json", "txt")
    ]
    none = argparse.Namespace(profile=None)
    assert profiling.resnet50_traces(hooks, none, "single", (None,), False) == {None: None}


@pytest.mark.gpu
def test_a_profiled_gpu_run_traces_the_gpu_kernels(tmp_path):
    profile_checks.check_gpu("torch", tmp_path, ("--compile",))
