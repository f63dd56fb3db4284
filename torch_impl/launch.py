"""One process per device, the way torch runs DDP (resnet18) and its pipeline schedules
(resnet50's gpipe and 1f1b): torchrun starts the processes, and each joins the process group.

torchrun starts N copies of a command and tells each where it stands (RANK, WORLD_SIZE,
LOCAL_RANK and where to meet, in its environment); `torchrun_command` is that command:

  python -m torch.distributed.run --nproc-per-node=N -m torch_impl --workload resnet18 ...

Each copy is the user's command again (`cli.worker_argv`), which knows itself a worker by that
environment (`is_worker`) and `join`s the group: gloo between CPU processes, NCCL between GPUs.

Several machines (resnet18 ddp): the same command on every node, with `--gpus` per node:

  python -m torch_impl --workload resnet18 --gpus G --nnodes 2 --node-rank R \
      --rdzv-endpoint HOST:29500 [--rdzv-timeout 300] [--preset ...] [--results ...]

R = 0 on HOST, which hosts the rendezvous on port 29500, and 1 on the other; the world size is
nnodes x G and the batch and lr scale with it. Each node runs torchrun with a c10d rendezvous:

  python -m torch.distributed.run --nproc-per-node=G --nnodes=2 --rdzv-backend=c10d \
      --rdzv-endpoint=HOST:29500 --rdzv-id=multidevice -m torch_impl ...

What keeps such a run robust is applied around these calls by torch_impl/guard.py: on one
machine every socket on 127.0.0.1, torchrun supervised from outside, bounded waits, a clean
stop, one line for an error. So `ps` shows torchrun as `python -m torch_impl.guard` (torchrun's
own main, quiet), with the options that put its rendezvous on the launcher's loopback store.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import torch
import torch.distributed as dist

from common.nodes import Nodes
from common.world import World, alone
from torch_impl import devices as tdev
from torch_impl import guard
from torch_impl.guard import is_worker  # torchrun's environment says so

RDZV_ID = "multidevice"  # the same on every node: the nodes of one command meet under it


def torchrun_command(argv: list[str], nproc: int, nodes: Nodes | None = None) -> list[str]:
    """torchrun running `python -m torch_impl ARGV` in `nproc` processes on this machine, and
    with `nodes` as one node of several, meeting at node 0's c10d rendezvous."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if nodes:
        cmd += [f"--nnodes={nodes.count}", "--rdzv-backend=c10d"]
        cmd += [f"--rdzv-endpoint={nodes.endpoint}", f"--rdzv-id={RDZV_ID}"]
    return [*cmd, "-m", "torch_impl", *argv]


def torchrun(argv: list[str], nproc: int, what: str, nodes: Nodes | None = None, env=None):
    """Run `torchrun_command` to its end, `env` added to the workers'; a worker's failure ends
    the run in one line (guard.run_torchrun, which supervises it)."""
    guard.run_torchrun(torchrun_command(argv, nproc, nodes), nproc, what, nodes, env)


@guard.joining
def join(plan, args=None) -> World:
    """This process's world: a worker of torchrun's joins the process group its environment
    describes, on its one device; any other process is alone on the plan's devices."""
    if not is_worker():
        return World.single(tdev.get_devices(plan), plan)
    gpu = plan.platform == "gpu"
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    # NCCL between GPUs, given the rank's own (unguessed); gloo between CPU processes.
    backend, device_id = ("nccl", device) if gpu else ("gloo", None)
    dist.init_process_group(backend, device_id=device_id, **guard.group_options())
    size = dist.get_world_size()  # one device per rank
    total = _summed_over_ranks(device) if size > 1 else alone
    return World(
        dist.get_rank(), size, [device], total, replace(plan, count=size), dist.group.WORLD
    )


def _summed_over_ranks(device):
    """The world's sum: an all-reduce in float64, on the rank's device (NCCL reduces CUDA
    tensors only)."""

    def total(x):
        t = torch.tensor(x, dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return t.cpu().numpy()

    return total
