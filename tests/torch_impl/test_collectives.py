"""What torch's steps move between devices, counted from the engine and held to the step model
and the lessons' tables (common.collectives.step_ops, lenet_ops, moves): DDP's collectives in a
real step of two gloo ranks, as torch's profiler records gloo's own ops with their tensors (DDP
makes them in C++, out of Python's reach), and LeNet's allreduce as its step calls it."""

import os
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from common import collectives, devices
from tests.fixtures import runs
from torch_impl import guard, launch, lenet
from torch_impl import resnet18 as r18

pytestmark = pytest.mark.multi_device
ELEMENT = {"float": 4, "double": 8, "long int": 8}  # the profiler's names of the tensors' types
# Within a layer the backward readies its gradients in an order of its own (a bias before its
# weight, or after), so a bucket's edge may move by a layer's bias or BatchNorm vector.
BUCKET_EDGE = 2 * 512 * 4


def _profiled_rank(rank, size, port, out):
    """Rank `rank` of a gloo group takes three `ddp` steps of the whole ResNet-18 on two images
    (the second rebuilds DDP's buckets in the order the backward readies the gradients) and
    records the gloo ops of the third: rank 0 saves them, (name, bytes) each."""
    torch.set_num_threads(1)
    os.environ.update(runs.torchrun_env(rank, size, port))
    world = launch.join(devices.DevicePlan(1, "cpu", True))
    net = r18.resnet18()
    _, shard, step, _, _ = r18.ddp(net, r18.make_optimizer(net, 0.1), world)
    x, y = torch.zeros(4, 1, 28, 28), torch.zeros(4, dtype=torch.long)
    parts = list(shard([np.arange(4)] * 3))
    for part in parts[:2]:
        step(x, y, part)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step(x, y, parts[2])
    ops = [
        (
            e.name,
            sum(
                np.prod(s) * ELEMENT[t] for s, t in zip(e.input_shapes, e.input_dtypes, strict=True)
            ),
        )
        for e in prof.events()
        if e.name.startswith("gloo:")
    ]
    if rank == 0:
        Path(out).write_text("\n".join(f"{name} {int(size)}" for name, size in ops))
    del step, shard
    guard.end_process_group()
    guard.exit_worker(0)


def test_ddps_step_makes_the_modelled_broadcasts_and_buckets(tmp_path):
    """Each forward begins with rank 0's BatchNorm buffers broadcast to the other ranks, a
    broadcast per dtype (the running means and variances, the batches seen); the backward
    all-reduces the gradients in three buckets. The step model (compare.scaling) and the lesson's
    table count the same: the broadcasts to the byte, the buckets' bytes to a bucket's edge."""
    out = tmp_path / "ops.txt"
    how = "spawn" if torch.cuda.is_initialized() else "fork"
    torch.multiprocessing.start_processes(
        _profiled_rank, args=(2, runs.free_port(), str(out)), nprocs=2, start_method=how
    )
    seen = [
        (name, int(size)) for name, size in (line.split() for line in out.read_text().split("\n"))
    ]
    modelled = collectives.step_ops("torch", "ddp", sync_bn=False)
    broadcasts = [c.bytes for c in modelled if c.op == collectives.BROADCAST]
    buckets = [c.bytes for c in modelled if c.op == collectives.BUCKET]
    assert sorted(size for name, size in seen if name == "gloo:broadcast") == sorted(broadcasts)
    reduced = [size for name, size in seen if name == "gloo:all_reduce"]
    assert len(reduced) == len(buckets) == 3, (seen, modelled)
    assert np.allclose(reduced, buckets, rtol=0, atol=BUCKET_EDGE), (reduced, buckets)
    assert {name for name, _ in seen} == {"gloo:broadcast", "gloo:all_reduce"}, seen


def test_lenets_step_calls_its_allreduce_as_the_table_counts():
    """LeNet's table (common.collectives.lenet_ops): a call of the lesson's allreduce per
    parameter tensor, each with every device's gradient of it. Virtual devices are one torch
    device: the calls are counted, not the copies."""
    calls = []

    def counted(data):
        calls.append([t.numel() * t.element_size() for t in data])
        return allreduce(data)

    cpus = [torch.device("cpu")] * 2
    params = lenet.init_params(0.01, 0)
    device_params = [lenet.get_params(params, d) for d in cpus]
    X, y = torch.zeros(8, 1, 28, 28), torch.zeros(8, dtype=torch.long)
    allreduce = lenet.allreduce
    with mock.patch.object(lenet, "allreduce", counted):
        lenet.train_batch(X, y, device_params, cpus, 0.1)
    modelled = [[c.bytes] * len(cpus) for c in collectives.lenet_ops("torch")]
    assert sorted(modelled) == sorted(calls)  # in the parameters' order, which is the dict's
