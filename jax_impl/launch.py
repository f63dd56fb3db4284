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

JAX_INIT_TIMEOUT (seconds, default 60) bounds the wait for the others. The coordinator listens on
the address given, and nothing authenticates the processes: on several machines, a trusted
network only.
"""

import os
from dataclasses import replace

import jax
import numpy as np

from common import cli, config, devices, processes, signals
from common.world import World


def join(plan: devices.DevicePlan, args=None) -> World:
    """This process's world. With JAX_NUM_PROCESSES > 1 (or --nnodes in `args`: one process per
    node) it joins the others (`jax.distributed.initialize`) and spans every process's devices:
    one program runs over all of them. Otherwise it is alone on the plan's devices. Runs before
    anything touches a JAX backend. Bad JAX_* values are config errors, as is a strategy other
    than sharding (`args`) in several processes; the wait ends after JAX_INIT_TIMEOUT s."""
    from jax_impl import devices as jdev

    count = _processes(args)
    if count < 2:
        return World.single(jdev.get_devices(plan), plan)
    if getattr(args, "strategy", None) not in (None, "sharding"):
        raise config.ConfigError(
            f"several JAX processes need --strategy sharding, not {args.strategy}"
        )
    rank, address, timeout = _settings(count)
    if plan.platform == "cpu":
        _gloo_towards(address)
    # jax's own deadline aborts with a C++ stack dump: this one ends the wait first, in one line
    line = _not_joined(rank, count, address, timeout)
    with processes.deadline(timeout, line, cli.EXIT_BAD_INPUT):
        # The coordinator listens on the address it is given, not every interface (127.0.0.1:
        # this machine only): the processes authenticate nobody. No preemption service: it
        # takes SIGTERM for itself, where a SIGTERM stops this run as a Ctrl-C does.
        jax.config.update("jax_enable_preemption_service", False)
        jax.distributed.initialize(
            address,
            count,
            rank,
            initialization_timeout=timeout + 60,
            coordinator_bind_address=address,
        )
    # Every process waits at exit for the others' goodbye: each says it once, also one ended
    # by a stop its main thread could not take up (inside a collective), or the others abort.
    signals.on_leaving(jax.distributed.shutdown)
    devs = jax.devices("gpu" if plan.platform == "gpu" else "cpu")  # every process's devices
    return World(rank, count, devs, _sum_over_processes, replace(plan, count=len(devs)))


def _sum_over_processes(x):
    """The world's sum: every process's `x` gathered (jax's multihost utilities) and added up.
    A jitted program's sums over the devices are global already: this is for what each process
    holds alone."""
    from jax.experimental import multihost_utils

    return np.sum(multihost_utils.process_allgather(np.asarray(x)), axis=0)


def _processes(args) -> int:
    """How many processes the run has: JAX_NUM_PROCESSES, which --nnodes sets with the rest of
    jax.distributed's settings (one process per node)."""
    if getattr(args, "nnodes", None):
        os.environ.update(
            JAX_COORDINATOR_ADDRESS=args.rdzv_endpoint,
            JAX_NUM_PROCESSES=str(args.nnodes),
            JAX_PROCESS_ID=str(args.node_rank),
            JAX_INIT_TIMEOUT=str(args.rdzv_timeout or cli.RDZV_TIMEOUT_S),
        )
    return processes.env_int("JAX_NUM_PROCESSES", "1", 1)


def _settings(count: int) -> tuple[int, str, int]:
    """(this process's id, the coordinator's address, the seconds to wait for the others),
    checked: one line for each bad value."""
    if "JAX_COORDINATOR_ADDRESS" not in os.environ or "JAX_PROCESS_ID" not in os.environ:
        raise config.ConfigError(
            "JAX_NUM_PROCESSES is set: also set JAX_COORDINATOR_ADDRESS and JAX_PROCESS_ID"
        )
    rank = processes.env_int("JAX_PROCESS_ID", None, 0)
    if rank >= count:
        raise config.ConfigError(
            f"JAX_PROCESS_ID={rank} of {count} processes: use 0 to {count - 1}"
        )
    address = os.environ["JAX_COORDINATOR_ADDRESS"]
    port = processes.port_of(address, "JAX_COORDINATOR_ADDRESS")
    if rank == 0:  # jax segfaults when its coordinator cannot bind the port
        processes.check_port_free(port, "JAX_COORDINATOR_ADDRESS")
    return rank, address, processes.env_int("JAX_INIT_TIMEOUT", "60", 1)


def _not_joined(rank, count, address, timeout):
    """What to do when the processes did not all meet in time, as seen from process `rank`."""
    if rank == 0:
        ids = "1" if count == 2 else f"1 to {count - 1}"
        what = f"process {ids} of {count} did not join within {timeout} s; start it"
    else:
        ids = f"0 (the coordinator) to {count - 1}"
        what = f"process {rank} of {count} waited {timeout} s for the others; start them"
    return (
        f"error: {what} with JAX_PROCESS_ID={ids}, JAX_NUM_PROCESSES={count} and "
        f"JAX_COORDINATOR_ADDRESS={address} (or raise JAX_INIT_TIMEOUT)"
    )


def _gloo_towards(address: str) -> None:
    """Bind the CPU collectives (gloo) to this machine's interface toward the coordinator: by
    default gloo listens on, and advertises, the address the host name resolves to, which can
    be loopback (peers on other machines then reach themselves) or another network than the
    one the run was given. jax has no public setting for gloo's interface: its CPU backend
    factory is registered again with one (jax._src, before any backend starts)."""
    from jax._src import distributed, xla_bridge
    from jaxlib import _jax

    _, interface = processes.route_to(*address.rsplit(":", 1))

    def cpu_client():
        client = distributed.global_state.client
        gloo = _jax.make_gloo_tcp_collectives(distributed_client=client, interface=interface)
        return xla_bridge.make_cpu_client(collectives=gloo)

    xla_bridge.register_backend_factory("cpu", cpu_client, priority=0, fail_quietly=False)
