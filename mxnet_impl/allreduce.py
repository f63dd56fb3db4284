"""The all-reduce alone, as nccl-tests times NCCL's (common/collectives.py): the kvstore's
`pushpull` under dist_sync, MXNet's parameter server: every worker pushes its buffer, the
servers add them up, and every worker pulls the sum.

    python -m mxnet_impl --workload allreduce --gpus N            # N workers here
    python -m mxnet_impl --workload allreduce --gpus 1 --nnodes 2 --node-rank R \
        --rdzv-endpoint HOST:29500                                # a worker on each of 2 nodes

The scheduler, servers and workers start as resnet18's dist does (mxnet_impl/launch.py); then
every worker pushes and pulls the same sizes, and worker 0 records the times.
"""

import sys

from common import collectives, config, watchdog
from mxnet_impl import launch

FRAMEWORK = "mxnet"


def engine(world):
    """The collective timed, as (buffer, reduce, values): an NDArray on the worker's context,
    one kvstore key per size, summed by the servers and pulled back in place."""
    from mxnet import nd

    kv, ctx = world.group, world.devices[0]

    def buffer(elements, check):
        if elements not in keys:  # a key per size; its init is a barrier of every worker
            kv.init(elements, nd.zeros(elements, ctx=ctx))
            keys.add(elements)
        value = world.rank + 1.0 if check else 0.0
        return nd.full(elements, value, ctx=ctx, dtype="float32")

    def reduce(buf):
        kv.pushpull(buf.shape[0], buf, out=buf)  # the key: the size
        buf.wait_to_read()  # the engine runs asynchronously: wait for the sum
        return buf

    def values(buf):
        return buf.asnumpy()

    keys = set()
    return buffer, reduce, values


def collective(world) -> str:
    return "kvstore pushpull (dist_sync)"


def main(args, plan, cfg, hooks):
    """Start the kvstore's processes, or, as a worker, join and time the all-reduces."""
    collectives.check(args)
    if not launch.is_worker():  # the launcher: scheduler, servers and workers
        cmd = [sys.executable, "-m", "mxnet_impl", *launch.worker_argv(args, plan.count)]
        launch.dist_sync(cmd, plan.count, "MXNet dist_sync all-reduce", args)
        return
    world = launch.join(plan, args)
    if len(world.devices) != 1:
        raise config.ConfigError("the allreduce benchmark runs one context per worker")
    buffer, reduce, values = engine(world)
    # Several processes: each ends itself when the run stops moving (common/watchdog.py).
    reduce = watchdog.beating(reduce, watchdog.armed(world.size))
    rows = collectives.time_sizes(buffer, reduce, values, world, cfg)
    rec = collectives.record(hooks, args, plan, cfg, world, rows, collective(world))
    collectives.save(rec, args, world)
