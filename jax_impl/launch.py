"""Several JAX processes (hosts, or one process per GPU), the way resnet18's `sharding` runs one
program over every process's devices: `jax.distributed.initialize` joins them, after which
`jax.devices()` lists every process's devices and each process computes on its own. The global
batch is the one a single process would take; process 0 writes the record. `join` makes the
process's world (common.world), which the strategies take.

Each process is started by hand with the same command and three variables: the coordinator's
address (host:port of process 0), the number of processes and this one's id. Two processes on
one machine, one CPU device each:

  JAX_COORDINATOR_ADDRESS=127.0.0.1:29600 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=R \
      python -m jax_impl --workload resnet18 --gpus 1 --platform cpu   # R = 0 and 1

On several machines, `--nnodes`, `--node-rank` and `--rdzv-endpoint` set these three (one
process per node). JAX_INIT_TIMEOUT (seconds, default 60) bounds the wait for the others. The
coordinator listens on the address given, and nothing authenticates the processes: on several
machines, a trusted network only. What keeps the run robust (checked settings, the bound, a
clean goodbye) is applied around `join` by jax_impl/guard.py.
"""

import os
from dataclasses import replace

import jax
import numpy as np

from common.world import World
from jax_impl import guard


@guard.joining
def join(plan, args=None) -> World:
    """This process's world. With JAX_NUM_PROCESSES > 1 it joins the others, after which
    `jax.devices()` lists every process's devices: one program runs over all of them.
    Otherwise it is alone on the plan's devices. Runs before anything touches a JAX backend."""
    from jax_impl import devices as jdev

    count = int(os.environ.get("JAX_NUM_PROCESSES", "1"))
    if count < 2:
        return World.single(jdev.get_devices(plan), plan)
    rank = int(os.environ["JAX_PROCESS_ID"])
    jax.distributed.initialize(
        os.environ["JAX_COORDINATOR_ADDRESS"],  # process 0's host:port, where it listens
        num_processes=count,
        process_id=rank,
        initialization_timeout=guard.ABORT_AFTER_S,  # the guard's deadline ends the wait first
    )
    devs = jax.devices("gpu" if plan.platform == "gpu" else "cpu")  # every process's devices
    return World(rank, count, devs, _sum_over_processes, replace(plan, count=len(devs)))


def _sum_over_processes(x):
    """The world's sum: every process's `x` gathered (jax's multihost utilities) and added up.
    A jitted program's sums over the devices are global already: this is for what each process
    holds alone."""
    from jax.experimental import multihost_utils

    return np.sum(multihost_utils.process_allgather(np.asarray(x)), axis=0)
