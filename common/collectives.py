"""Each engine's all-reduce alone, measured the way nccl-tests measures NCCL's
(all_reduce_perf): a float32 buffer of every size from 4 B to 64 MiB in powers of 4, summed over
every rank. Per size it reports the time of one all-reduce, averaged over a run of them and over
the ranks; the algorithm bandwidth, algbw = bytes / time; and the bus bandwidth,
busbw = algbw x 2(n - 1)/n. A ring all-reduce sends and receives 2(n - 1)/n of the buffer on
every rank's link, so busbw is what each link carried, comparable across rank counts and with
the link's own rate.

Before the timed run of each size, one all-reduce is checked: rank r gives r + 1 in every
element, and every rank must get n(n + 1)/2 back (n: the world's devices, a buffer each). How
many to time is agreed from that warm-up: about `budget_s` of them, the same count on every
rank (a collective that one rank calls more often than the others would wait forever).

Framework-free: each framework's allreduce module hands in its engine's collective as three
functions: `buffer(elements, check)` makes this rank's buffer (of rank + 1 with `check`, else
zeros), `reduce(buf)` sums it over the ranks and waits for the result (returning it, in place or
new), `values(result)` reads this rank's copy back as numpy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from common import config, flops, results

ELEMENT_BYTES = 4  # float32
MIN_ITERS, MAX_ITERS = 2, 100


def sizes(max_bytes: int) -> list[int]:
    """The buffer sizes in bytes: 4, 16, 64, ... up to `max_bytes`."""
    return [4**k for k in range(1, 40) if 4**k <= max_bytes]


def bus_factor(ranks: int) -> float:
    """busbw / algbw: the share of the buffer each rank's link carries each way in a ring."""
    return 2 * (ranks - 1) / ranks


def check(args) -> None:
    """Training's options mean nothing to a collective: one line instead of silence."""
    for flag in ("compile", "amp", "ceiling", "profile", "sync_bn"):
        if getattr(args, flag, None) not in (None, False, "off", "float32"):
            raise config.ConfigError(
                f"--{flag.replace('_', '-')} applies to training, not to the allreduce "
                "benchmark; drop it"
            )


def time_sizes(buffer: Callable, reduce: Callable, values: Callable, world, cfg) -> list[dict]:
    """One row per size of `sizes(cfg.max_bytes)`: the checked warm-up, then the timed run."""
    rows, ranks = [], world.plan.count
    for nbytes in sizes(cfg.max_bytes):
        elements = nbytes // ELEMENT_BYTES
        buf = buffer(elements, True)
        start = time.perf_counter()
        got = values(reduce(buf))
        warm = time.perf_counter() - start
        _check_sum(got, ranks, nbytes)
        iters = _agreed_iters(warm, cfg.budget_s, world)
        buf = buffer(elements, False)  # zeros: in place, repeated sums stay finite
        start = time.perf_counter()
        for _ in range(iters):
            out = reduce(buf)
        values(out)
        mine = (time.perf_counter() - start) / iters
        seconds = float(np.asarray(world.sum(np.array([mine]))).reshape(-1)[0]) / world.size
        rows.append(row(nbytes, iters, seconds, ranks))
    return rows


def row(nbytes: int, iters: int, seconds: float, ranks: int) -> dict:
    algbw = nbytes / seconds
    return {
        "bytes": nbytes,
        "iters": iters,
        "time_s": seconds,
        "algbw_Bps": algbw,
        "busbw_Bps": algbw * bus_factor(ranks),
    }


def _check_sum(got: np.ndarray, ranks: int, nbytes: int) -> None:
    want = ranks * (ranks + 1) / 2
    wrong = np.flatnonzero(np.asarray(got) != want)
    if wrong.size or np.asarray(got).size != nbytes // ELEMENT_BYTES:
        where = f"element {wrong[0]}: {np.asarray(got).reshape(-1)[wrong[0]]}" if wrong.size else ""
        raise RuntimeError(
            f"the all-reduce of {nbytes} B summed wrong ({where or 'wrong length'}; want {want})"
        )


def _agreed_iters(warm_s: float, budget_s: float, world) -> int:
    """About `budget_s` of all-reduces at the ranks' mean warm-up time: one count for all."""
    mean = float(np.asarray(world.sum(np.array([warm_s]))).reshape(-1)[0]) / world.size
    return int(min(MAX_ITERS, max(MIN_ITERS, round(budget_s / max(mean, 1e-9)))))


def record(hooks, args, plan, cfg, world, rows: list[dict], collective: str) -> dict:
    """The run's record: its rows, what ran them, and on what (like a training record's)."""
    versions, hardware = results.environment(hooks.versions())
    return {
        "workload": "allreduce",
        "framework": hooks.framework,
        "collective": collective,
        "ranks": world.plan.count,
        "platform": plan.platform,
        "preset": cfg.preset,
        "rows": rows,
        "extra": {"threads": hooks.threads()},
        "versions": versions,
        "hardware": hardware,
        "git_commit": results.git_commit(),
        "timestamp": results.utc_now(),
    }


def save(rec: dict[str, Any], args, world) -> None:
    """Rank 0 appends the record and prints its table, the way nccl-tests prints its own."""
    if world.rank:
        return
    results.append_line(rec, args.results)
    print(f"{rec['framework']} {rec['collective']}, {rec['ranks']} ranks", flush=True)
    print(f"{'bytes':>10} {'iters':>5} {'time (us)':>11} {'algbw GB/s':>10} {'busbw GB/s':>10}")
    for r in rec["rows"]:
        print(
            f"{r['bytes']:>10} {r['iters']:>5} {r['time_s'] * 1e6:>11.1f} "
            f"{r['algbw_Bps'] / 1e9:>10.4f} {r['busbw_Bps'] / 1e9:>10.4f}",
            flush=True,
        )


# --- what one training step moves between devices (compare.scaling's step model; the lessons) ---

DDP_FIRST_BUCKET_BYTES = 2**20  # torch's _DEFAULT_FIRST_BUCKET_BYTES: the first ready gradients
DDP_BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb default, every later bucket
COUNT_BYTES = 8  # a BatchNorm's batches seen (torch's num_batches_tracked): one int64
# What a collective carries: gradients, the loss, and BatchNorm's own (its running statistics,
# or --sync-bn's batch statistics and their gradients), which the lessons' tables set apart.
GRADIENTS, LOSS = "gradients", "the loss"
BN_BUFFERS = "BatchNorm's buffers (running mean and variance, batches seen)"
BN_RUNNING = "BatchNorm's running statistics"
BN_BATCH = "BatchNorm's batch statistics (mean, mean of squares)"
BN_BATCH_GRADS = "their gradients"
# The ops, as each engine makes them.
BROADCAST = "broadcast from rank 0, before the forward"
BUCKET = "all-reduce, a bucket at a time in the backward"
OPERAND = "all-reduce operand (XLA)"
PUSHPULL = "kvstore push and pull, a key per parameter"


class Collective(NamedTuple):
    """One collective of a step: its `bytes` (one device's buffer), `ready` (the share of the
    backward's FLOPs done when its data is all there, 1.0 at its end; None: inside the compute,
    which waits for it), the engine's `op`, `what` it carries, and `batchnorm`, the bytes of it
    that are BatchNorm's (its buffers or statistics, its weight's and bias's gradients)."""

    bytes: int
    ready: float | None
    op: str
    what: str
    batchnorm: int = 0


def ddp_buckets(grads: list[tuple]) -> list[tuple]:
    """DDP's buckets over gradients of (bytes, ready, ...) in the order they are ready (its
    rebuilt buckets, from the second step on): a bucket closes once it holds its limit or more,
    DDP_FIRST_BUCKET_BYTES for the first, DDP_BUCKET_BYTES after; it is ready with its last.
    Each bucket is (bytes, ready, the bytes of its gradients that are BatchNorm's)."""
    buckets, open_bytes, open_bn = [], 0, 0
    for size, ready, *bn in grads:
        open_bytes, open_bn = open_bytes + size, open_bn + (bn[0] if bn else 0)
        if open_bytes >= (DDP_BUCKET_BYTES if buckets else DDP_FIRST_BUCKET_BYTES):
            buckets.append((open_bytes, ready, open_bn))
            open_bytes, open_bn = 0, 0
    return buckets + [(open_bytes, grads[-1][1], open_bn)] if open_bytes else buckets


def step_ops(
    framework: str, strategy: str, sync_bn: bool, bucketed: bool = True
) -> list[Collective] | None:
    """Each collective one ResNet-18 step makes across data-parallel devices, in the order its
    step makes them (the backward readies the last layer's gradients first); None for an engine
    this model does not know. Each framework's suite counts its engine's own and holds this list
    to it (torch: a 2-rank gloo step's profiled collectives; JAX: the optimized program's
    all-reduce operands; MXNet: the Trainer's kvstore calls). `bucketed`: JAX's shard_map and
    pmap pack the gradients and the loss into one buffer (False: --unbucketed)."""
    shapes = flops.parameter_shapes("resnet18")
    shares = backward_shares()
    grads = [
        (size := ELEMENT_BYTES * math.prod(shape), shares[_layer(name)], size * _is_bn(name), name)
        for name, shape in reversed(shapes.items())
    ]
    channels = [s[0] for k, s in shapes.items() if _is_bn(k) and k.endswith(".weight")]
    if (framework, strategy) == ("torch", "ddp"):
        # rank 0's buffers before every forward, flattened into one broadcast per dtype
        stats, counts = 2 * ELEMENT_BYTES * sum(channels), COUNT_BYTES * len(channels)
        buffers = [Collective(b, None, BROADCAST, BN_BUFFERS, b) for b in (stats, counts)]
        return buffers + [
            Collective(b, r, BUCKET, GRADIENTS, bn) for b, r, bn in ddp_buckets(grads)
        ]
    if framework == "mxnet" and strategy in ("gluon", "dist"):
        return [Collective(b, r, PUSHPULL, GRADIENTS, bn) for b, r, bn, _ in grads]
    if framework != "jax" or strategy not in ("sharding", "shard_map", "pmap"):
        return None
    # XLA's optimized program: the gradient in one all-reduce op after the backward, whose
    # every operand XLA:CPU's collectives reduce by itself (a gloo all-reduce each, in turn).
    # Under shard_map's and pmap's pmean XLA reduces a value once where two gradients are the
    # same sum: a shortcut conv's bias and its block's second BatchNorm's bias.
    once = strategy != "sharding"
    if once and bucketed:  # shard_map's and pmap's bucket: every gradient and the loss, whole
        size, bn = sum(g[0] for g in grads) + ELEMENT_BYTES, sum(g[2] for g in grads)
        at_end = [Collective(size, 1.0, OPERAND, f"{GRADIENTS} and {LOSS}, one buffer", bn)]
    else:
        at_end = [
            Collective(b, 1.0, OPERAND, GRADIENTS, bn)
            for b, _, bn, name in grads
            if not (once and name.endswith(".shortcut.bias"))
        ] + [Collective(ELEMENT_BYTES, 1.0, OPERAND, LOSS)]
    if not sync_bn:  # each device keeps its own running statistics: none move
        return at_end
    forward = [
        Collective(2 * ELEMENT_BYTES * c, None, OPERAND, BN_BATCH, 2 * ELEMENT_BYTES * c)
        for c in channels
    ]
    backward = [
        Collective(ELEMENT_BYTES * c, None, OPERAND, BN_BATCH_GRADS, ELEMENT_BYTES * c)
        for c in reversed(channels)
    ]
    return [*forward, *backward, *at_end]


def step_collectives(
    framework: str, strategy: str, sync_bn: bool, bucketed: bool = True
) -> list[tuple] | None:
    """(bytes, ready) of each collective one ResNet-18 step makes (`step_ops`), the step model's
    pieces (compare.scaling), each timed at the engine's all-reduce fit; None for an engine this
    model does not know."""
    ops = step_ops(framework, strategy, sync_bn, bucketed)
    return None if ops is None else [(c.bytes, c.ready) for c in ops]


# d2l 13.5's LeNet (torch_impl/lenet.py's SHAPES): each layer's weight and bias, in elements
LENET_TENSORS = [20 * 1 * 3 * 3, 20, 50 * 20 * 5 * 5, 50, 128 * 800, 128, 10 * 128, 10]
BY_HAND = "allreduce by hand: summed on device 0, copied back"
# The engines of each lesson's table, (framework, strategy, --sync-bn), in its order.
ENGINES = {
    "lenet": [("torch", "scratch", False), ("jax", "scratch", False), ("mxnet", "scratch", False)],
    "resnet18": [
        ("torch", "ddp", False),
        *(("jax", s, False) for s in ("sharding", "shard_map", "pmap")),
        ("jax", "sharding", True),
        ("mxnet", "gluon", False),
        ("mxnet", "dist", False),
    ],
}


def lenet_ops(framework: str) -> list[Collective]:
    """LeNet's hand-written allreduce in one step (each framework's lenet.py): torch and MXNet
    call it once per parameter tensor, JAX once with every gradient and the loss."""
    sizes = [ELEMENT_BYTES * n for n in LENET_TENSORS]
    if framework == "jax":
        return [Collective(sum(sizes) + ELEMENT_BYTES, 1.0, BY_HAND, f"{GRADIENTS} and {LOSS}")]
    return [Collective(size, 1.0, BY_HAND, f"{GRADIENTS}, a tensor a call") for size in sizes]


class Move(NamedTuple):
    """A row of a lesson's "what moves" table: an engine's `op` carrying `what`, `count` times a
    step, `bytes` in all (one device's buffers), of which `batchnorm_count` ops and
    `batchnorm_bytes` bytes are BatchNorm's."""

    engine: str
    op: str
    what: str
    count: int
    bytes: int
    batchnorm_count: int
    batchnorm_bytes: int


def moves(workload: str) -> list[Move]:
    """What each engine of `workload`'s lesson moves between devices in one step (`step_ops`,
    `lenet_ops`), a row per kind of collective; engines that make the same ones share their rows
    (their strategies joined), and one whose BatchNorm keeps its running statistics on each
    device says so in a row of none."""
    if workload not in ENGINES:
        raise LookupError(f"no table of what moves for {workload!r}; {', '.join(ENGINES)} have one")
    engines: dict[tuple, list[str]] = {}
    for framework, strategy, sync_bn in ENGINES[workload]:
        ops = (
            lenet_ops(framework) if workload == "lenet" else step_ops(framework, strategy, sync_bn)
        )
        label = f"{strategy}+sync-bn" if sync_bn else strategy
        engines.setdefault((framework, tuple(ops)), []).append(label)
    rows = []
    for (framework, ops), labels in engines.items():
        engine = f"{framework} {', '.join(labels)}" if workload != "lenet" else framework
        kinds: dict[tuple, list[Collective]] = {}
        for c in ops:
            kinds.setdefault((c.op, c.what), []).append(c)
        for (op, what), cs in kinds.items():
            bn = [c for c in cs if c.batchnorm == c.bytes]
            rows.append(
                Move(
                    engine,
                    op,
                    what,
                    len(cs),
                    sum(c.bytes for c in cs),
                    len(bn),
                    sum(c.batchnorm for c in cs),
                )
            )
        if workload == "resnet18" and not any(c.what == BN_BUFFERS for c in ops):
            rows.append(Move(engine, "none: each device keeps its own", BN_RUNNING, 0, 0, 0, 0))
    return rows


def backward_shares() -> dict[str, float]:
    """Per ResNet-18 layer with weights, the share of the backward's FLOPs done once its
    gradients are: the layers after it and its own (a layer's backward is 2 x its forward)."""
    layers = flops.resnet18_layers()
    total, done, shares = sum(x.flops for x in layers), 0, {}
    for layer in reversed(layers):
        done += layer.flops
        shares[layer.name] = done / total
    return shares


def _is_bn(parameter: str) -> bool:
    return ".bn" in parameter


def _layer(parameter: str) -> str:
    """The layer with weights a parameter's gradient comes with: a BatchNorm's, its conv's."""
    layer = parameter.rsplit(".", 1)[0]
    return layer.replace(".bn1", ".conv1").replace(".bn2", ".conv2").replace("stem.bn", "stem.conv")
