"""An alpha-beta model of the gradient exchange of data-parallel training across n nodes (a rank,
or a worker and a server, per node; G bytes of gradient per step), and two models of a step built
on it. Pure arithmetic: no framework, no records.

Each node's link carries 2 (n - 1) / n x G bytes per step each way:
- ring all-reduce (gloo, NCCL): a reduce-scatter then an all-gather, each n - 1 steps of a chunk
  of G / n to the next rank;
- parameter server with a server per node holding G / n (ps-lite, MXNet's kvstore dist_sync):
  out, the worker's pushes to the n - 1 remote servers and its server's replies to the n - 1
  remote workers' pulls; in, the same. The ring's bytes, without a server.
Time: comm = messages x alpha + bytes / bandwidth, alpha a small message's one-way time, with
2 (n - 1) messages one after another per piece of the gradient (the ring's steps; the server's
pushes and pulls, an upper bound where an engine sends them at once); an engine exchanging the
gradient in pieces (DDP's buckets) pays them per piece. k ranks per node of one flat ring carry
2 (nk - 1) / nk x G instead, which this model does not cover.

A step (t_compute: the same step on one node): serial, t = t_compute + comm; overlapped, the
exchange beside the backward but for a tail that starts only when the backward ends (the first
layers' gradient: DDP's last bucket, or about one layer's share): t = max(t_compute, comm - tail)
+ tail, so a step that is all link costs comm, not comm + tail. Where each collective of the
step is known with its own time (compare/scaling.py), `timeline` places them one by one.
"""

from __future__ import annotations

import math

from common.flops import TRAIN_MULTIPLIER

RING, PS = "ring all-reduce", "parameter server"
ALGORITHMS = (RING, PS)
SERIAL, OVERLAPPED = "serial", "overlapped"
MODELS = (SERIAL, OVERLAPPED)
MODEL_LIMIT = 0.15  # the most |relative error| a model may have and still be said to fit
# Interconnects not lent, for predictions only, as nccl-tests' bus bandwidth (the bytes per
# second of each rank's link: comm = link_bytes / busbw). H100 SXM over NVLink 4: all_reduce_perf
# is reported at 370 to 460-480 GB/s (nccl-tests; docs.alayanew.com's guide for 8 x H100 SXM5);
# the lower is taken, so the prediction errs slow. 100 Gb/s Ethernet or InfiniBand EDR: the line
# rate, above TCP's or RDMA's goodput, so that prediction errs fast. Each all-reduce costs
# NCCL's own latency for a ring in its Simple protocol, the one it picks for buffers of
# megabytes (src/graph/tuning.cc, baseLat and hwLat): 8.4 us, plus per step of the ring's
# 2 (n - 1), 3.4 us over NVLink and 9.6 us over the network (nccl_latency). Measured beside it:
# a small all-reduce of 2 H100s takes about 6 us (a user's nccl-tests run on NCCL's tracker).
NVLINK_H100_BYTES_PER_S = 370e9
NET_100G_BYTES_PER_S = 100e9 / 8
NCCL_BASE_LATENCY_S = 8.4e-6
PREDICTED = (  # (interconnect, bytes per second, seconds per ring step, device counts)
    ("NVLink (H100), GPUs in one node", NVLINK_H100_BYTES_PER_S, 3.4e-6, (2, 8)),
    ("100 Gb/s network, one GPU per node", NET_100G_BYTES_PER_S, 9.6e-6, (2, 8)),
)


def nccl_latency(n: int, step_latency: float) -> float:
    """Seconds of one ring all-reduce of n ranks before its bytes: NCCL's base and its steps."""
    return NCCL_BASE_LATENCY_S + 2 * (n - 1) * step_latency


def link_bytes(algorithm: str, n: int, gradient_bytes: float) -> float:
    """Bytes one node's link carries per step in each direction (the module's docstring)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; one of {', '.join(ALGORITHMS)}")
    if n < 1:
        raise ValueError(f"a cluster has at least one node, got {n}")
    return 2 * (n - 1) / n * gradient_bytes


def messages(algorithm: str, n: int, pieces: int = 1) -> int:
    """Messages one after another per step: 2 (n - 1) per piece of the gradient."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; one of {', '.join(ALGORITHMS)}")
    return 2 * (n - 1) * pieces


def comm_time(
    algorithm: str,
    n: int,
    gradient_bytes: float,
    bytes_per_s: float,
    alpha: float = 0.0,
    pieces: int = 1,
) -> float:
    """Seconds a step's exchange takes: messages x alpha + bytes / bytes_per_s (each way)."""
    if bytes_per_s <= 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bytes_per_s}")
    volume = link_bytes(algorithm, n, gradient_bytes)
    return messages(algorithm, n, pieces) * alpha + volume / bytes_per_s


def serial(t_compute: float, comm: float) -> float:
    """A step whose exchange starts when its compute ends."""
    return t_compute + comm


def overlapped(t_compute: float, comm: float, tail: float) -> float:
    """A step whose exchange runs beside its compute but for `tail` seconds (0 to comm)."""
    tail = min(max(tail, 0.0), comm)
    return max(t_compute, comm - tail) + tail


def timeline(t_compute: float, pieces: list[tuple[float, float | None]]) -> float:
    """A step whose collectives, (seconds, ready) in the order they are made, take the link one
    at a time: each starts once the backward has readied its gradients (ready: the share of the
    backward done) and the one before it has ended. Those with ready None hold the compute up
    instead (it waits for each). The compute is a forward and a backward of twice its FLOPs."""
    held = sum(t for t, ready in pieces if ready is None)
    forward = t_compute / TRAIN_MULTIPLIER + held
    backward, end = t_compute - t_compute / TRAIN_MULTIPLIER, 0.0
    for seconds, ready in pieces:
        if ready is not None:
            end = max(end, forward + ready * backward) + seconds
    return max(forward + backward, end)


def step_time(model: str, t_compute: float, comm: float, tail: float) -> float:
    if model == SERIAL:
        return serial(t_compute, comm)
    if model == OVERLAPPED:
        return overlapped(t_compute, comm, tail)
    raise ValueError(f"unknown model {model!r}; one of {', '.join(MODELS)}")


def pieces(gradient_bytes: float, bucket_bytes: float | None) -> int:
    """How many pieces an engine exchanges the gradient in: buckets of `bucket_bytes`, or one."""
    if bucket_bytes is None or gradient_bytes <= 0:
        return 1
    return max(1, math.ceil(gradient_bytes / bucket_bytes))


def tail_share(gradient_bytes: float, bucket_bytes: float | None, layers: int | None) -> float:
    """The share of the exchange that cannot hide behind the backward: a bucketed engine's last
    bucket, else one layer's share; all of it (nothing hides) when neither is known."""
    if bucket_bytes is not None and gradient_bytes > 0:
        return min(1.0, bucket_bytes / gradient_bytes)
    return 1.0 / layers if layers else 1.0


def relative_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def within(errors: dict[str, float], limit: float = MODEL_LIMIT) -> list[str]:
    """The models (of MODELS, in that order) whose |error| is at most `limit`."""
    return [m for m in MODELS if m in errors and abs(errors[m]) <= limit]


def choose(errors: list[dict[str, float]], limit: float = MODEL_LIMIT) -> str | None:
    """The model with the smaller mean |error| over an engine's cells (model -> relative error),
    if that is at most `limit`; None when neither fits or no model has an error in every cell."""
    means = {}
    for m in MODELS:
        values = [abs(e[m]) for e in errors if m in e]
        if values and len(values) == len(errors):
            means[m] = sum(values) / len(values)
    if not means:
        return None
    best = min(MODELS, key=lambda m: means.get(m, math.inf))
    return best if means[best] <= limit else None
