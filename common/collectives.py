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
from typing import Any

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


# --- what one training step all-reduces (compare.scaling's step model) -------------------------

DDP_FIRST_BUCKET_BYTES = 2**20  # torch's _DEFAULT_FIRST_BUCKET_BYTES: the first ready gradients
DDP_BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb default, every later bucket


def ddp_buckets(grads: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """DDP's buckets over gradients of (bytes, ready) in the order they are ready (its rebuilt
    buckets, from the second step on): a bucket closes once it holds its limit or more,
    DDP_FIRST_BUCKET_BYTES for the first, DDP_BUCKET_BYTES after; it is ready with its last."""
    buckets, open_bytes = [], 0
    for size, ready in grads:
        open_bytes += size
        if open_bytes >= (DDP_BUCKET_BYTES if buckets else DDP_FIRST_BUCKET_BYTES):
            buckets.append((open_bytes, ready))
            open_bytes = 0
    return buckets + [(open_bytes, grads[-1][1])] if open_bytes else buckets


def step_collectives(framework: str, strategy: str, sync_bn: bool) -> list[tuple] | None:
    """(bytes, ready) of each all-reduce (or kvstore push and pull) one ResNet-18 step makes
    across data-parallel ranks, in the order its backward readies them. ready: the share of the
    backward's FLOPs done when its gradients are all there (1.0: at its end); None: inside the
    compute, which waits for it (a BatchNorm's statistics over the global batch). None for an
    engine this model does not know."""
    shapes = flops.parameter_shapes("resnet18")
    shares = backward_shares()
    grads = [
        (ELEMENT_BYTES * math.prod(shape), shares[_layer(name)])
        for name, shape in reversed(shapes.items())  # the backward readies the last layer first
    ]
    if (framework, strategy) == ("torch", "ddp"):
        return ddp_buckets(grads)
    if (framework, strategy) == ("mxnet", "dist"):
        return grads  # Gluon's Trainer: a key per parameter
    if (framework, strategy) == ("jax", "sharding"):
        # XLA's optimized program (tests/jax_impl/test_collectives.py holds it to it): the
        # gradient in one all-reduce op after the backward, whose every operand XLA:CPU's
        # collectives reduce by itself; a gloo all-reduce each, in turn.
        channels = [s[0] for k, s in shapes.items() if ".bn" in k and k.endswith(".weight")]
        at_end = [(size, 1.0) for size, _ in grads] + [(ELEMENT_BYTES, 1.0)]  # and the loss
        if not sync_bn:  # each BatchNorm's running mean and variance, averaged with them
            return at_end + [(ELEMENT_BYTES * c, 1.0) for c in channels for _ in range(2)]
        forward = [(2 * ELEMENT_BYTES * c, None) for c in channels]  # mean and mean square
        backward = [(ELEMENT_BYTES * c, None) for c in reversed(channels)]  # their gradients
        return [*forward, *backward, *at_end]
    return None


def backward_shares() -> dict[str, float]:
    """Per ResNet-18 layer with weights, the share of the backward's FLOPs done once its
    gradients are: the layers after it and its own (a layer's backward is 2 x its forward)."""
    layers = flops.resnet18_layers()
    total, done, shares = sum(x.flops for x in layers), 0, {}
    for layer in reversed(layers):
        done += layer.flops
        shares[layer.name] = done / total
    return shares


def _layer(parameter: str) -> str:
    """The layer with weights a parameter's gradient comes with: a BatchNorm's, its conv's."""
    layer = parameter.rsplit(".", 1)[0]
    return layer.replace(".bn1", ".conv1").replace(".bn2", ".conv2").replace("stem.bn", "stem.conv")
