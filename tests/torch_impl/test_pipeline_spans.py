"""The pipeline's busy time (torch_impl/pipelining.py, Spans): a stage is busy for the spans in
which the engine's schedule computes its micro-batches, forward and backward, and for nothing
else. One stage on a group of one process (gloo, loopback), so that the schedule runs in the
test's own process: a stage that sleeps inside its forward and its backward is busy for it; a
loss that sleeps (the engine's work between spans) is not; the spans fit in the step, the step
in the wall time, and the warm-up is left out."""

import dataclasses
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

from common import config
from torch_impl import pipelining

SLEEP = 0.05  # seconds each forward and each backward of a micro-batch sleeps
LOSS_SLEEP = 0.1  # seconds the loss of each micro-batch sleeps
MICRO = 2  # micro-batches a step


class Sleep(torch.autograd.Function):
    """The identity, sleeping in its forward and in its backward: computing without a CPU."""

    @staticmethod
    def forward(ctx, x):
        time.sleep(SLEEP)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(SLEEP)
        return grad


class SleepyStage(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x):
        return Sleep.apply(self.linear(x))


def sleepy_loss(output, target):
    time.sleep(LOSS_SLEEP)
    return nn.functional.mse_loss(output, target)


@pytest.fixture
def group_of_one(tmp_path, monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("strategy", ["gpipe", "1f1b"])
def test_a_stage_is_busy_for_its_computation_and_nothing_else(group_of_one, strategy):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    cfg = config.get_config("resnet50", "smoke", batch_size=2 * MICRO)
    cfg = dataclasses.replace(cfg, num_batches=2, repeats=2, warmup=1)
    device, stage_module = torch.device("cpu"), SleepyStage()
    spans = pipelining.Spans(device)
    stage = pipelining.timed_stage(stage_module, 0, 1, device, spans)
    schedule_cls = ScheduleGPipe if strategy == "gpipe" else Schedule1F1B
    schedule = schedule_cls(stage, n_microbatches=MICRO, loss_fn=sleepy_loss)
    data = (torch.randn(cfg.num_batches, cfg.batch_size, 4),)
    data += (torch.randn(cfg.num_batches, cfg.batch_size, 3),)
    timer, losses = pipelining._run(schedule, stage_module, cfg, data, 0, 1, spans)

    got, wall = spans.totals(), sum(timer.times)
    timed = cfg.repeats * cfg.num_batches * MICRO  # micro-batches of the timed repeats
    assert got["micro_batches"] == timed, got  # the warm-up's are left out
    assert len(losses) == (cfg.warmup + cfg.repeats) * cfg.num_batches
    # Sleeping is computing as the schedule sees it (CPU time would not count it) ...
    assert got["forward"] >= timed * SLEEP, got
    assert got["backward"] >= timed * SLEEP, got
    # ... and the loss between the spans is not: the spans leave its sleep out of the step.
    busy = got["forward"] + got["backward"]
    assert busy + timed * LOSS_SLEEP <= got["step"] <= wall, (got, wall)
