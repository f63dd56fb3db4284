"""An alpha-beta model of the gradient exchange of data-parallel training across nodes, and two
models of a step's time built on it. Pure arithmetic: no framework, no records.

n nodes, one rank (or one worker and one server) per node; G bytes of gradient per step (the
float32 gradient, parameters x 4), combined every step.

Bytes each node's link carries per step, in each direction:

- ring all-reduce (gloo, NCCL): a reduce-scatter then an all-gather, each n - 1 steps in which
  every rank sends one chunk of G / n to the next rank and receives one from the previous:
  2 (n - 1) / n x G out and the same in.
- parameter server with one server per node (ps-lite under MXNet's kvstore dist_sync), the keys
  spread evenly, so each server holds G / n of the gradient. A worker pushes its gradient, G / n
  to every server, and pulls the sum, G / n from every server. Of a node's traffic only the
  remote parts cross its link:
  out: its worker's push to the n - 1 remote servers, (n - 1) / n x G, plus its server's
  replies to the n - 1 remote workers' pulls, (n - 1) x G / n: 2 (n - 1) / n x G;
  in: the n - 1 remote workers' pushes to its server, (n - 1) x G / n, plus its worker's pull
  from the n - 1 remote servers, (n - 1) / n x G: 2 (n - 1) / n x G.
  The same bytes as the ring, though the ring needs no server.

Time: comm = messages x alpha + bytes / bandwidth, alpha the one-way time of a small message.
Messages in a step's critical path, per exchange: the ring's 2 (n - 1) steps, each one message
after the previous one arrived; the parameter server's push to and pull from each of the n - 1
remote servers (2 (n - 1)), counted one after another: an upper bound on their latency, where
an engine that sends them at once pays about two. An engine that exchanges the gradient in
several pieces (DDP's buckets) pays the messages once per piece; the bytes stay G.

One rank per node: where a node holds k ranks of one flat ring, its link carries
2 (nk - 1) / nk x G instead, which this model does not cover.

A step (t_compute: the same step on one node, no link):

- serial: nothing overlaps: t = t_compute + comm.
- overlapped: the exchange runs during the backward pass, except a tail that can only start
  when the backward has finished, the gradient of the first layers, computed last (DDP: the last
  bucket; a per-layer exchange: about one layer's share of G):
  t = max(t_compute, comm - tail) + tail. The tail's bytes are part of comm, so a step that is
  all link (comm >> t_compute) costs comm, not comm + tail.
"""

from __future__ import annotations

import math

RING, PS = "ring all-reduce", "parameter server"
ALGORITHMS = (RING, PS)
SERIAL, OVERLAPPED = "serial", "overlapped"
MODELS = (SERIAL, OVERLAPPED)
MODEL_LIMIT = 0.15  # the most |relative error| a model may have and still be said to fit
# torch DistributedDataParallel's default bucket_cap_mb (25, in MiB): the gradient is
# all-reduced in pieces of at most this size, the last of them after the backward has finished
DDP_BUCKET_BYTES = 25 * 2**20

# Interconnects the project has not been lent, for predictions only. Bandwidth: bytes per
# second each rank's link moves of the ring's 2 (n - 1) / n x G, which is what nccl-tests calls
# bus bandwidth (busbw = algbw x 2 (n - 1) / n, algbw = G / t), so comm = link_bytes / busbw.
# H100 SXM over NVLink 4 (NVSwitch): all_reduce_perf's busbw at large sizes is reported from
# about 370 GB/s to 460-480 GB/s (NVIDIA nccl-tests; docs.alayanew.com's nccl-tests guide
# gives 460-480 for 8 x H100 SXM5); the lower figure is taken, so the prediction errs slow.
NVLINK_H100_BYTES_PER_S = 370e9
# 100 Gb/s Ethernet or InfiniBand EDR between nodes, one GPU per node: the line rate; TCP or
# RDMA goodput is a few percent lower, so here the prediction errs fast.
NET_100G_BYTES_PER_S = 100e9 / 8
# (interconnect, bytes per second, device counts): latency is left out of these predictions
# (alpha = 0): at ResNet-scale gradients the bandwidth term is the step's exchange
PREDICTED = (
    ("NVLink (H100), GPUs in one node", NVLINK_H100_BYTES_PER_S, (2, 8)),
    ("100 Gb/s network, one GPU per node", NET_100G_BYTES_PER_S, (2, 8)),
)


def link_bytes(algorithm: str, n: int, gradient_bytes: float) -> float:
    """Bytes one node's link carries per step in each direction (the module's docstring)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; one of {', '.join(ALGORITHMS)}")
    if n < 1:
        raise ValueError(f"a cluster has at least one node, got {n}")
    # ring: 2 (n - 1) chunks of G / n; parameter server: (n - 1) / n G pushed out plus
    # (n - 1) x G / n served back, the same sum
    return 2 * (n - 1) / n * gradient_bytes


def messages(algorithm: str, n: int, pieces: int = 1) -> int:
    """Messages one after another per step: 2 (n - 1) per piece of the gradient, the ring's
    steps or the parameter server's push and pull per remote server."""
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
    """Seconds a step's exchange takes: messages x alpha + bytes / bandwidth (bytes per second,
    each direction)."""
    if bytes_per_s <= 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bytes_per_s}")
    volume = link_bytes(algorithm, n, gradient_bytes)
    return messages(algorithm, n, pieces) * alpha + volume / bytes_per_s


def serial(t_compute: float, comm: float) -> float:
    """A step whose exchange starts when its compute ends."""
    return t_compute + comm


def overlapped(t_compute: float, comm: float, tail: float) -> float:
    """A step whose exchange runs beside its compute, but for `tail` seconds of it that can
    only start when the compute has ended (0 <= tail <= comm)."""
    tail = min(max(tail, 0.0), comm)
    return max(t_compute, comm - tail) + tail


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
    """The share of the exchange that cannot hide behind the backward pass (the overlapped
    model's tail): the last bucket, at most `bucket_bytes`, for a bucketed engine (DDP); else
    one layer's share, 1 / `layers`; all of it (nothing hides) when neither is known."""
    if bucket_bytes is not None and gradient_bytes > 0:
        return min(1.0, bucket_bytes / gradient_bytes)
    return 1.0 / layers if layers else 1.0


def relative_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def within(errors: dict[str, float], limit: float = MODEL_LIMIT) -> list[str]:
    """The models (of MODELS, in that order) whose |error| is at most `limit`."""
    return [m for m in MODELS if m in errors and abs(errors[m]) <= limit]


def choose(errors: list[dict[str, float]], limit: float = MODEL_LIMIT) -> str | None:
    """The model with the smaller mean |error| over an engine's cells (each a dict model ->
    relative error), if that mean is at most `limit`; None when neither fits or no cell has
    both errors."""
    means = {}
    for m in MODELS:
        values = [abs(e[m]) for e in errors if m in e]
        if values and len(values) == len(errors):
            means[m] = sum(values) / len(values)
    if not means:
        return None
    best = min(MODELS, key=lambda m: means.get(m, math.inf))
    return best if means[best] <= limit else None
