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
A scheduler or server is MXNet's KVStoreServer, which `import mxnet` runs with DMLC_ROLE set to
scheduler or server until the workers finish; guard.serve runs it once MXNet's import is whole
(a server of lesson 4's `server` strategy unpickles the workers' optimizer, which needs Gluon).

On several machines, start each process yourself with the same DMLC_PS_ROOT_URI (the
scheduler machine's address, reachable from all), DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER and
DMLC_NUM_WORKER (DMLC_NODE_HOST=<this machine's address> where ps-lite picks the wrong one):

    SERVE="from mxnet_impl import guard; guard.serve()"
    DMLC_ROLE=scheduler python -c "$SERVE"            # once, on the DMLC_PS_ROOT_URI machine
    DMLC_ROLE=server python -c "$SERVE"               # DMLC_NUM_SERVER times
    DMLC_ROLE=worker python -m mxnet_impl --workload resnet18 --strategy dist --gpus N
                                                      # DMLC_NUM_WORKER times, the same N

N counts the contexts of all workers; each worker uses N / DMLC_NUM_WORKER of its own machine's
and waits at most MXNET_DIST_INIT_TIMEOUT seconds (default 60) for the others to join. ps-lite
itself never times out: a worker whose peer dies mid-run waits forever, so here (one machine) the
launcher stops every process as soon as one fails.

A worker's side: `is_worker` (DMLC_ROLE is set), then `join` creates the kvstore and returns
the worker's world (common.world), whose `group` is the kvstore that resnet18's `dist_sync`
strategy hands its Trainer; `dist_fields` are the record's. What keeps the run robust (checked
settings, bounded waits, a clean goodbye, processes that end together) is applied around these
calls by mxnet_impl/guard.py.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from common import cli, cores, devices, supervise, watchdog
from common.nodes import Nodes
from common.world import World
from mxnet_impl import guard

EXIT_WAIT_S = 30  # the scheduler and servers end once every worker has finalised
SUM_KEY = 1 << 20  # world.sum's kvstore keys start here, past any model's parameter indices


def environment(workers: int, servers: int, port: int, host: str = "127.0.0.1") -> dict:
    """ps-lite's variables for every process of the run (DMLC_ROLE is each one's own)."""
    return dict(
        os.environ,
        DMLC_PS_ROOT_URI=host,  # the scheduler's address and port: everyone connects there
        DMLC_PS_ROOT_PORT=str(port),
        DMLC_NUM_SERVER=str(servers),
        DMLC_NUM_WORKER=str(workers),
        DMLC_NODE_HOST=host,  # this process's own address (on one machine, loopback)
    )


def dist_sync(worker_cmd: list[str], n_contexts: int, what: str, args=None) -> None:
    """Run the scheduler, the servers and `worker_cmd` as every worker on 127.0.0.1 (or, with
    `args.nnodes`, this node's share: the scheduler on node 0, a server and a worker of
    `n_contexts` contexts on every node); return when all have finished, else stop them all
    and end with one line (SystemExit)."""
    nodes = Nodes.of(args)
    if nodes:  # a server and a worker on every node, the scheduler on node 0
        env = environment(nodes.count, nodes.count, nodes.host_port[1])
        env = guard.process_environment(env, nodes.count, nodes.count * n_contexts)
        env = guard.node_environment(env, nodes)
        roles, local = (["scheduler"] if nodes.rank == 0 else []) + ["server 0"], 1
    else:
        workers, servers = guard.counts(n_contexts)
        env = environment(workers, servers, guard.port())
        env = guard.process_environment(env, workers, n_contexts)
        roles, local = ["scheduler"] + [f"server {i}" for i in range(servers)], workers
    with supervise.Group(what) as group:
        for role in roles:  # guard.serve with its DMLC_ROLE
            group.start(f"the kvstore {role}", guard.SERVE, {**env, "DMLC_ROLE": role.split()[0]})
        for i in range(local):  # each worker keeps its slice of the cores (cores.narrow)
            mine = {**env, "DMLC_ROLE": "worker", cores.LOCAL_INDEX_ENV: str(i)}
            group.start(f"the kvstore worker {i}", worker_cmd, mine, capture="stderr", first=True)
        try:
            stops = supervise.Stops(group, watchdog.peer_timeout())  # its peers would wait
            group.watch([stops], exit_wait=EXIT_WAIT_S)
        except supervise.Failed as e:  # one line, once for every process
            print(e.line, file=sys.stderr)
            raise SystemExit(e.code) from None


def worker_argv(args, n_contexts: int, strategy: str = "dist") -> list[str]:
    """A worker's command line: the user's, as one worker of every node's contexts (the
    DMLC_* variables say where the others are; --nnodes is the launcher's), running `strategy`
    (each of lesson 4's strategies is a kvstore run)."""
    nodes = getattr(args, "nnodes", None) or 1
    gone = {"nnodes": None, "node_rank": None, "rdzv_endpoint": None, "rdzv_timeout": None}
    gone["peer_timeout"] = None  # the workers' environment has it (PEER_TIMEOUT_ENV)
    return cli.worker_argv(args, strategy=strategy, gpus=n_contexts * nodes, **gone)


def is_worker() -> bool:
    """Whether this process is one of ps-lite's (its environment says so; the guard checks that
    it is a worker's); without DMLC_ROLE it is the launcher."""
    return "DMLC_ROLE" in os.environ


@guard.joining
def join(plan: devices.DevicePlan, args=None) -> World:
    """This process's world: a worker (`is_worker`) joins the kvstore dist_sync, with its share
    of the plan's contexts; any other process is alone on them."""
    import mxnet as mx

    from mxnet_impl import devices as mdev

    if not is_worker():
        return World.single(mdev.get_devices(plan), plan)
    kv = mx.kv.create("dist_sync")  # the DMLC_* variables say where the scheduler is
    local = devices.DevicePlan(plan.count // kv.num_workers, plan.platform, plan.virtual)
    return World(kv.rank, kv.num_workers, mdev.get_devices(local), _push_pull(kv), plan, kv)


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
