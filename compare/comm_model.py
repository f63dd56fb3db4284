"""The model of a data-parallel step across n nodes: the step's compute on one node and the
collectives the engine makes, each timed by the classic cost model of an all-reduce,
t = alpha + 2 (n - 1) / n x bytes / busbw (nccl-tests' bus bandwidth), and placed on a timeline
beside the backward. Pure arithmetic: no framework, no records.

Each node's link carries 2 (n - 1) / n x G bytes per step each way, G the gradient's bytes, in
either algorithm of the three engines:
- ring all-reduce (gloo, NCCL): a reduce-scatter then an all-gather, each n - 1 steps of a chunk
  of G / n to the next rank;
- parameter server with a server per node holding G / n (ps-lite, MXNet's kvstore dist_sync):
  out, the worker's pushes to the n - 1 remote servers and its server's replies to the n - 1
  remote workers' pulls; in, the same. The ring's bytes, without a server.
"""

from __future__ import annotations

from common.flops import TRAIN_MULTIPLIER

# Interconnects not lent, for predictions only, as nccl-tests' bus bandwidth (the bytes per
# second of each rank's link). H100 SXM over NVLink 4: all_reduce_perf is reported at 370 to
# 460-480 GB/s (nccl-tests; docs.alayanew.com's guide for 8 x H100 SXM5); the lower is taken, so
# the prediction errs slow. 100 Gb/s Ethernet or InfiniBand EDR: the line rate, above TCP's or
# RDMA's goodput, so that prediction errs fast. Each all-reduce costs NCCL's own latency for a
# ring in its Simple protocol, the one it picks for buffers of megabytes (src/graph/tuning.cc,
# baseLat and hwLat): 8.4 us, plus per step of the ring's 2 (n - 1), 3.4 us over NVLink and
# 9.6 us over the network (nccl_latency). Measured beside it: a small all-reduce of 2 H100s
# takes about 6 us (a user's nccl-tests run on NCCL's tracker).
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


# An all-reduce covers its buffer twice: a reduce-scatter, then an all-gather.
WEIGHT = {"all_reduce": 2}


def covered(collectives: list[dict]) -> int:
    """Bytes a device's collectives of one step cover (a record's `step_collectives`)."""
    return sum(WEIGHT.get(c["op"], 1) * c["bytes"] for c in collectives)


def collective_link_bytes(n: int, collectives: list[dict]) -> float:
    """Bytes one node's link carries per step each way for a step's counted collectives (lesson
    4's records): each ring collective moves (n - 1) / n of what it covers across each link."""
    return (n - 1) / n * covered(collectives)


def link_bytes(n: int, gradient_bytes: float) -> float:
    """Bytes one node's link carries per step in each direction (the module's docstring)."""
    if n < 1:
        raise ValueError(f"a cluster has at least one node, got {n}")
    return 2 * (n - 1) / n * gradient_bytes


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


def relative_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured
