"""The all-reduce alone, as nccl-tests times NCCL's (common/collectives.py): torch's
`dist.all_reduce` between one process per device, over gloo on CPUs (NCCL on GPUs).

    python -m torch_impl --workload allreduce --gpus N            # N ranks here (torchrun)
    python -m torch_impl --workload allreduce --gpus 1 --nnodes 2 --node-rank R \
        --rdzv-endpoint HOST:29500                                # a rank on each of 2 nodes

The processes start and join as DDP's do (torch_impl/launch.py); then every rank calls the
same all-reduces of the same sizes, and rank 0 records the times.
"""

import torch
import torch.distributed as dist

from common import cli, collectives, watchdog
from torch_impl import launch

FRAMEWORK = "torch"


def engine(world):
    """The collective timed, as (buffer, reduce, values): a tensor on the rank's device,
    summed in place over every rank."""
    device = world.devices[0]

    def buffer(elements, check):
        value = world.rank + 1.0 if check else 0.0
        return torch.full((elements,), value, dtype=torch.float32, device=device)

    def reduce(buf):
        dist.all_reduce(buf)  # blocks until the sum is in `buf` (gloo; NCCL: queued on a stream)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return buf

    def values(buf):
        return buf.cpu().numpy()

    return buffer, reduce, values


def collective(world) -> str:
    return f"dist.all_reduce ({dist.get_backend()})"


def main(args, plan, cfg, hooks):
    """Start a rank per device with torchrun, or, as a rank, join and time the all-reduces."""
    collectives.check(args)
    if not launch.is_worker():  # the launcher: a rank per device, on every node
        nodes = launch.Nodes.of(args)
        launch.torchrun(cli.worker_argv(args, strategy="ddp"), plan.count, "all-reduce", nodes)
        return
    world = launch.join(plan, args)
    buffer, reduce, values = engine(world)
    # Several processes: each ends itself when the run stops moving (common/watchdog.py).
    reduce = watchdog.beating(reduce, watchdog.armed(world.size))
    rows = collectives.time_sizes(buffer, reduce, values, world, cfg)
    rec = collectives.record(hooks, args, plan, cfg, world, rows, collective(world))
    collectives.save(rec, args, world)
