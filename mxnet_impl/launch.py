"""kvstore dist_sync, MXNet's parameter server (ps-lite), started by this project on one machine
the way torchrun starts DDP: `python -m mxnet_impl --workload resnet18 --strategy dist --gpus N`.

ps-lite runs a scheduler, servers (they sum what the workers push) and workers (they train), each
a process configured by its environment:

    DMLC_ROLE          scheduler | server | worker
    DMLC_PS_ROOT_URI   the scheduler's address, DMLC_PS_ROOT_PORT its port (everyone connects)
    DMLC_NUM_SERVER    how many servers, DMLC_NUM_WORKER how many workers

On one machine (DMLC_ROLE unset) this module starts them all on 127.0.0.1: the scheduler,
DMLC_NUM_SERVER servers (default 1) and DMLC_NUM_WORKER workers (default N: one context each;
N must divide over them), on port DMLC_PS_ROOT_PORT (default: a free one; a busy one is refused).
A scheduler or server is `python -c 'import mxnet'`: importing mxnet with DMLC_ROLE set to
scheduler or server runs that role until the workers finish, then exits.

On several machines, start each process yourself with the same DMLC_PS_ROOT_URI (the
scheduler machine's address, reachable from all), DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER and
DMLC_NUM_WORKER (DMLC_NODE_HOST=<this machine's address> where ps-lite picks the wrong one):

    DMLC_ROLE=scheduler python -c 'import mxnet'      # once, on the DMLC_PS_ROOT_URI machine
    DMLC_ROLE=server python -c 'import mxnet'         # DMLC_NUM_SERVER times
    DMLC_ROLE=worker python -m mxnet_impl --workload resnet18 --strategy dist --gpus N
                                                      # DMLC_NUM_WORKER times, the same N

N counts the contexts of all workers; each worker uses N / DMLC_NUM_WORKER of its own machine's
and waits at most MXNET_DIST_INIT_TIMEOUT seconds (default 60) for the others to join. ps-lite
itself never times out: a worker whose peer dies mid-run waits forever, so here (one machine) the
launcher stops every process as soon as one fails.

A worker's side: `is_worker` (DMLC_ROLE is set), then `join` creates the kvstore and returns
the worker's world (common.world), whose `group` is the kvstore that resnet18's `dist_sync`
strategy hands its Trainer; `dist_fields` are the record's.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import numpy as np

from common import cli, config, cores, devices, processes, signals, supervise
from common.world import World

ROOT = Path(__file__).resolve().parent.parent
# A scheduler or server, by its DMLC_ROLE; it ends with its launcher, even a SIGKILLed one.
SERVE = [sys.executable, "-c", "from common import signals; signals.watch_launcher(); import mxnet"]
POLL_S = 0.2
EXIT_WAIT_S = 30  # the scheduler and servers end once every worker has finalised
SUM_KEY = 1 << 20  # world.sum's kvstore keys start here, past any model's parameter indices


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


def dist_sync(worker_cmd: list[str], n_contexts: int, what: str, args=None) -> None:
    """Run the scheduler, the servers and `worker_cmd` as every worker on 127.0.0.1 (or, with
    `args.nnodes`, this node's share: the scheduler on node 0, a server and a worker of
    `n_contexts` contexts on every node); return when all have finished, else stop them all
    and end with one line (SystemExit)."""
    if getattr(args, "nnodes", None):
        env = _node_environment(args, n_contexts)
        roles = (["scheduler"] if args.node_rank == 0 else []) + ["server 0"]
        local = 1
    else:
        workers, servers = counts(n_contexts)
        env = _environment(workers, servers, _port(), n_contexts)
        roles, local = ["scheduler"] + [f"server {i}" for i in range(servers)], workers
    with supervise.Group(what) as group:
        for role in roles:  # `import mxnet` with its DMLC_ROLE
            group.start(f"the kvstore {role}", SERVE, {**env, "DMLC_ROLE": role.split()[0]})
        for i in range(local):  # each worker keeps its slice of the cores (cores.narrow)
            mine = {**env, "DMLC_ROLE": "worker", cores.LOCAL_INDEX_ENV: str(i)}
            group.start(f"the kvstore worker {i}", worker_cmd, mine, capture="stderr", first=True)
        try:
            group.watch([lambda: supervise.stopped_member(group)], exit_wait=EXIT_WAIT_S)
        except supervise.Failed as e:  # one line, once for every process
            print(e.line, file=sys.stderr)
            raise SystemExit(e.code) from None


def worker_argv(args, n_contexts: int) -> list[str]:
    """A worker's command line: the user's, as one worker of every node's contexts (the
    DMLC_* variables say where the others are; --nnodes is the launcher's)."""
    nodes = getattr(args, "nnodes", None) or 1
    gone = {"nnodes": None, "node_rank": None, "rdzv_endpoint": None, "rdzv_timeout": None}
    return cli.worker_argv(args, strategy="dist", gpus=n_contexts * nodes, **gone)


def _port() -> int:
    """DMLC_PS_ROOT_PORT when set (refused when another program holds it), else a free one."""
    if "DMLC_PS_ROOT_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    port = processes.env_int("DMLC_PS_ROOT_PORT", None, 1)
    if port > 65535:
        raise config.ConfigError(f"DMLC_PS_ROOT_PORT must be a port (1-65535), got {port}")
    processes.check_port_free(port, "DMLC_PS_ROOT_PORT (the kvstore scheduler)")
    return port


def _node_environment(args, n_contexts: int) -> dict:
    """ps-lite's settings on one node of several: node 0's scheduler at --rdzv-endpoint, and
    this node's own address and interface toward it (never its host name, which may resolve
    to loopback)."""
    host, port = args.rdzv_endpoint.rsplit(":", 1)
    if args.node_rank == 0:
        processes.check_port_free(int(port), "--rdzv-endpoint (the kvstore scheduler)")
    env = _environment(args.nnodes, args.nnodes, int(port), args.nnodes * n_contexts)
    address, interface = processes.route_to(host, int(port))
    env.update(DMLC_PS_ROOT_URI=host, DMLC_NODE_HOST=address)
    env[cores.LOCAL_COUNT_ENV] = "1"
    env.setdefault("MXNET_DIST_INIT_TIMEOUT", str(args.rdzv_timeout or cli.RDZV_TIMEOUT_S))
    if interface:
        env["DMLC_INTERFACE"] = interface
    return env


def _environment(workers: int, servers: int, port: int, n_contexts: int) -> dict:
    env = dict(os.environ)
    env.update(
        DMLC_PS_ROOT_URI="127.0.0.1",
        DMLC_PS_ROOT_PORT=str(port),
        DMLC_NUM_SERVER=str(servers),
        DMLC_NUM_WORKER=str(workers),
        DMLC_NODE_HOST="127.0.0.1",  # every process on loopback, whatever the interfaces
    )
    # The workers share this process's threads (every CPU allowed, or the user's count:
    # devices.set_mxnet_threads) instead of each taking them all; with cores per device, each
    # worker computes with those of its contexts (common/cores.py).
    own = os.environ.get(devices.OMP_THREADS_ENV, "")
    budget = int(own) if own.isdigit() else devices.cores_allowed()
    per_device = os.environ.get(cores.PER_DEVICE_ENV)
    threads = int(per_device) * n_contexts // workers if per_device else budget // workers
    env[devices.OMP_THREADS_ENV] = str(max(1, threads))
    env[cores.LOCAL_COUNT_ENV] = str(workers)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env[cli.NOTE_SHOWN_ENV] = "1"  # this process (cli.run) already said the devices are virtual
    # Every process it starts ends with it, even if it was killed before they could look
    # (signals.watch_launcher: the workers' cli.start, the scheduler's and servers' SERVE).
    env[signals.PARENT_ENV] = str(os.getpid())
    return env


def is_worker() -> bool:
    """Whether this process is one of ps-lite's (its environment says so; `join` checks that it
    is a worker's); without DMLC_ROLE it is the launcher."""
    return "DMLC_ROLE" in os.environ


def join(plan: devices.DevicePlan, args=None) -> World:
    """This process's world: a worker (`is_worker`) joins the kvstore dist_sync, with its share
    of the plan's contexts; any other process is alone on them. ps-lite waits for every peer
    without a deadline (a missing one would hang the run): MXNET_DIST_INIT_TIMEOUT bounds the
    wait. `args`: unused (the DMLC_* variables say everything)."""
    import mxnet as mx

    from mxnet_impl import devices as mdev

    if not is_worker():
        return World.single(mdev.get_devices(plan), plan)
    workers, servers = counts(plan.count)
    needed = ("DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT")
    if os.environ.get("DMLC_ROLE") != "worker" or not all(map(os.environ.get, needed)):
        raise config.ConfigError(
            "strategy dist runs as DMLC_ROLE=worker with DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT "
            "set (see mxnet_impl/launch.py), or with none of them set (one machine)"
        )
    where = f"{os.environ['DMLC_PS_ROOT_URI']}:{os.environ['DMLC_PS_ROOT_PORT']}"
    wait = processes.env_int("MXNET_DIST_INIT_TIMEOUT", "60", 1)
    line = (
        f"error: kvstore dist_sync: the scheduler at {where}, {servers} server(s) and {workers} "
        f"worker(s) did not all join within {wait} s (MXNET_DIST_INIT_TIMEOUT); start every one"
    )
    with processes.deadline(wait, line, cli.EXIT_BAD_INPUT):
        kv = mx.kv.create("dist_sync")
    # Every worker waits at exit for the others, at the barrier of its kvstore's free: each
    # frees it itself as it leaves, within a bound, should a peer be gone (`_leave`).
    signals.on_leaving(lambda: _leave(kv), stuck=False)
    local = devices.DevicePlan(plan.count // workers, plan.platform, plan.virtual)
    return World(kv.rank, kv.num_workers, mdev.get_devices(local), _push_pull(kv), plan, kv)


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


def _push_pull(kv):
    """The world's sum: the servers add up what every worker pushes under one key, and each
    worker pulls the total. The key is an integer: Gluon's Trainer keys the parameters by their
    index, and a kvstore refuses to mix integer and string keys. Each size of array gets its
    own key, set up (a barrier in dist_sync) the first time every worker sums one."""
    from mxnet import nd

    made = set()

    def total(x):
        x = np.asarray(x, dtype=np.float64)
        key = SUM_KEY + x.size
        if key not in made:
            kv.init(key, nd.zeros(x.size, dtype="float64"))
            made.add(key)
        sums = nd.array(x.reshape(-1), dtype="float64")
        kv.pushpull(key, sums, out=sums)
        return sums.asnumpy().reshape(x.shape)

    return total


def dist_fields(kv) -> dict:
    """The record's fields of a dist_sync run: the kvstore and its processes."""
    servers = int(os.environ["DMLC_NUM_SERVER"])
    return {
        "kvstore": "dist_sync",
        "workers": kv.num_workers,
        "servers": servers,
        "processes": kv.num_workers + servers + 1,  # and the scheduler
    }
