"""The operations layer around mxnet_impl/launch.py: what keeps a kvstore dist_sync run robust,
applied around the lesson's calls, not inside them (docs/design.md, "Traps").

- Settings: ps-lite's variables checked, one line for each bad value; a busy scheduler port
  refused; the workers share the cores (OMP_NUM_THREADS) instead of each taking them all; on
  several machines each process is given this node's own address toward node 0 (never its host
  name, which may resolve to loopback).
- A bound (`joining`): ps-lite waits for every peer without a deadline, and a missing one would
  hang the run: MXNET_DIST_INIT_TIMEOUT (default 60 s) ends the wait in one line.
- A goodbye: every worker waits at exit for the others at the barrier of its kvstore's free:
  each frees it itself as it leaves, within a bound (`_leave`), should a peer be gone.
- Every process a launcher starts ends with it, even a SIGKILLed one (signals.PARENT_ENV).
"""

from __future__ import annotations

import functools
import os
import socket
import sys
from pathlib import Path

from common import checks, cli, config, cores, devices, processes, signals

ROOT = Path(__file__).resolve().parent.parent
# A scheduler or server, by its DMLC_ROLE (`serve`), ending with its launcher, even a SIGKILLed one.
SERVE = [sys.executable, "-c", "from mxnet_impl import guard; guard.serve()"]


def serve() -> None:
    """Run this process's kvstore role (DMLC_ROLE: scheduler or server) as `import mxnet` runs
    it, but after MXNet's import is complete: MXNet's own start runs the role halfway through its
    import, before Gluon, and a server there cannot unpickle an optimizer whose module imports
    Gluon (lesson 4's AdamW, sent by update_on_kvstore)."""
    signals.watch_launcher()
    role = os.environ.pop("DMLC_ROLE")  # imported as a worker would: nothing starts
    import mxnet as mx
    from mxnet.kvstore.kvstore_server import KVStoreServer

    os.environ["DMLC_ROLE"] = role  # ps-lite reads it when the kvstore is made
    kv = mx.kv.create("dist")
    kv.set_optimizer = lambda optimizer: kv._set_updater(_summing(optimizer))
    KVStoreServer(kv).run()


def _summing(optimizer):
    """A server's updater for `optimizer` (what KVStore.set_optimizer installs) that leaves the
    world's sums (launch.SUM_KEY and above) the sums a server without an optimizer keeps: its
    updater sees every key, and would update them as weights. It returns once the workers'
    pushes are summed: the server frees each pushed message when its handler returns, while
    MXNet's engine may still be adding it into `merged`, which an update that reads nothing (a
    frozen optimizer's) would leave reading freed memory (a server's SIGSEGV)."""
    import mxnet as mx

    from mxnet_impl import launch

    update = mx.optimizer.get_updater(optimizer)

    def updater(key, merged, stored):
        if key >= launch.SUM_KEY:
            stored[:] = merged
        else:
            update(key, merged, stored)
        merged.wait_to_read()

    return updater


def counts(n_contexts: int) -> tuple[int, int]:
    """(workers, servers) from DMLC_NUM_WORKER (default: one per context) and DMLC_NUM_SERVER."""
    workers = processes.env_int("DMLC_NUM_WORKER", str(n_contexts), 1)
    servers = processes.env_int("DMLC_NUM_SERVER", "1", 1)
    if n_contexts % workers:
        raise config.ConfigError(
            f"--gpus {n_contexts} does not divide over DMLC_NUM_WORKER={workers} workers; "
            "every worker gets the same number of contexts"
        )
    return workers, servers


def port() -> int:
    """DMLC_PS_ROOT_PORT when set (refused when another program holds it), else a free one."""
    if "DMLC_PS_ROOT_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    number = processes.env_int("DMLC_PS_ROOT_PORT", None, 1)
    if number > 65535:
        raise config.ConfigError(f"DMLC_PS_ROOT_PORT must be a port (1-65535), got {number}")
    processes.check_port_free(number, "DMLC_PS_ROOT_PORT (the kvstore scheduler)")
    return number


def node_environment(env: dict, nodes) -> dict:
    """`env` (launch.environment's) for one node of several: node 0's scheduler at the
    endpoint (its port checked there), and this node's own address and interface toward it."""
    host, number = nodes.host_port
    if nodes.rank == 0:  # before the port's check: a second node 0 here is named as that
        nodes.claim("kvstore scheduler")
    nodes.check("kvstore scheduler")
    address, interface = processes.route_to(host, number)
    env.update(DMLC_PS_ROOT_URI=host, DMLC_NODE_HOST=address)
    env[cores.LOCAL_COUNT_ENV] = "1"
    env.setdefault("MXNET_DIST_INIT_TIMEOUT", str(nodes.timeout))
    if interface:
        env["DMLC_INTERFACE"] = interface
    return env


def process_environment(env: dict, workers: int, n_contexts: int) -> dict:
    """What every process of the run gets besides ps-lite's variables: the workers share this
    process's threads (every CPU allowed, or the user's count: devices.set_mxnet_threads)
    instead of each taking them all, and with cores per device each computes with those of its
    contexts (common/cores.py); the project on the path; the launcher to end with."""
    own = os.environ.get(devices.OMP_THREADS_ENV, "")
    budget = int(own) if own.isdigit() else devices.cores_allowed()
    per_device = os.environ.get(cores.PER_DEVICE_ENV)
    threads = int(per_device) * n_contexts // workers if per_device else budget // workers
    env[devices.OMP_THREADS_ENV] = str(max(1, threads))
    env[cores.LOCAL_COUNT_ENV] = str(workers)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env[cli.NOTE_SHOWN_ENV] = "1"  # this process (cli.run) already said the devices are virtual
    env[signals.PARENT_ENV] = str(os.getpid())
    return env


def joining(join):
    """`launch.join` for a dist worker: its settings checked before, the kvstore's creation
    bounded (MXNET_DIST_INIT_TIMEOUT), and its goodbye registered after."""

    @functools.wraps(join)
    def joined(plan, args=None):
        if "DMLC_ROLE" not in os.environ:
            return join(plan, args)
        workers, servers = counts(plan.count)
        needed = ("DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT")
        if os.environ["DMLC_ROLE"] != "worker" or not all(map(os.environ.get, needed)):
            raise config.ConfigError(
                "strategy dist runs as DMLC_ROLE=worker with DMLC_PS_ROOT_URI and "
                "DMLC_PS_ROOT_PORT set (see mxnet_impl/launch.py), or with none of them set "
                "(one machine)"
            )
        where = f"{os.environ['DMLC_PS_ROOT_URI']}:{os.environ['DMLC_PS_ROOT_PORT']}"
        wait = processes.env_int("MXNET_DIST_INIT_TIMEOUT", "60", 1)
        if wait > checks.MAX_TIMEOUT_S:  # past it Python's timer overflows: no bound at all
            raise config.ConfigError(
                f"MXNET_DIST_INIT_TIMEOUT={wait}: at most {checks.MAX_TIMEOUT_S} s (a day)"
            )
        line = (
            f"error: kvstore dist_sync: the scheduler at {where}, {servers} server(s) and "
            f"{workers} worker(s) did not all join within {wait} s (MXNET_DIST_INIT_TIMEOUT); "
            "start every one"
        )
        with processes.deadline(wait, line, cli.EXIT_BAD_INPUT):
            world = join(plan, args)
        signals.on_leaving(lambda: _leave(world.group), stuck=False)
        return world

    return joined


def _leave(kv) -> None:
    """The worker's goodbye: freeing its kvstore waits for its pending pushes and pulls, then
    for every worker at a barrier (and rank 0 stops the servers). Left to the interpreter, that
    free would come whenever the last reference goes, up to its final collection, when Python's
    threads, every watchdog among them, are gone: a worker stopped, or one whose launcher was
    killed (the scheduler with it), would wait there forever. Here it is bounded as the
    process leaves (signals.on_leaving), and the kvstore object's own free finds nothing left.
    Not from the watchdog: a main thread stuck in a pull has a pull this free would wait for."""
    from mxnet.base import _LIB, check_call

    handle, kv.handle = kv.handle, None  # MXKVStoreFree(NULL) frees nothing
    check_call(_LIB.MXKVStoreFree(handle))


# --- Gluon's private parts, which the lesson files reach through these --------------------------


def structural_params(net) -> dict:
    """{`layer1.0.bn1.gamma`: Parameter}: the structural names Gluon's own save_parameters
    writes (the attributes' names, torch's). Gluon 1.x gives them only through a private helper:
    its public collect_params names each parameter by prefix (`hybridsequential0_conv0_weight`)."""
    return net._collect_params_with_prefix()


def use_global_stats(batch_norm, on: bool) -> None:
    """Switch a built Gluon BatchNorm to its running statistics (`on`) or back: Gluon 1.x keeps
    the constructor's use_global_stats among the operator's private keywords, with no setter."""
    batch_norm._kwargs["use_global_stats"] = on
