"""The all-reduce alone, as nccl-tests times NCCL's (common/collectives.py): a jitted `psum`
over a Mesh of every process's devices, which XLA runs across the processes (gloo between CPU
processes, NCCL between GPUs).

    python -m jax_impl --workload allreduce --gpus 1 --nnodes 2 --node-rank R \
        --rdzv-endpoint HOST:29500                                # a process on each of 2 nodes
    python -m jax_impl --workload allreduce --gpus N              # N devices of one process

The processes join as resnet18's do (jax_impl/launch.py); then every process runs the same
program on the same sizes, and process 0 records the times.
"""

from functools import partial

import jax
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from common import collectives, watchdog
from jax_impl import launch

FRAMEWORK = "jax"
AXIS = "ranks"


def engine(world):
    """The collective timed, as (buffer, reduce, values): one row per device of a global array
    sharded over the Mesh, summed by `psum` into a copy on every device."""
    mesh = Mesh(np.array(world.devices), (AXIS,))
    rows = NamedSharding(mesh, P(AXIS))
    mine = [i for i, d in enumerate(world.devices) if d.process_index == jax.process_index()]

    def buffer(elements, check):
        local = np.zeros((len(mine), elements), np.float32)
        if check:  # device i gives i + 1
            local += np.array(mine, np.float32)[:, None] + 1
        return jax.make_array_from_process_local_data(rows, local)

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=P(AXIS), out_specs=P())
    def psum(x):
        return lax.psum(x, AXIS)  # every device's row, added up

    def reduce(buf):
        return psum(buf).block_until_ready()  # JAX dispatches asynchronously: wait for it

    def values(out):
        return np.asarray(out.addressable_data(0)).reshape(-1)

    return buffer, reduce, values


def collective(world) -> str:
    return f"jit psum ({'NCCL' if world.devices[0].platform == 'gpu' else 'gloo'})"


def main(args, plan, cfg, hooks):
    """Join the world (several JAX processes where there are), then time the all-reduces."""
    collectives.check(args)
    world = launch.join(plan, args)
    buffer, reduce, values = engine(world)
    # Several processes: each ends itself when the run stops moving (common/watchdog.py).
    reduce = watchdog.beating(reduce, watchdog.armed(world.size))
    rows = collectives.time_sizes(buffer, reduce, values, world, cfg)
    rec = collectives.record(hooks, args, plan, cfg, world, rows, collective(world))
    collectives.save(rec, args, world)
