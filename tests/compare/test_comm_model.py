"""compare/comm_model.py: the bytes each node's link carries, against a message-by-message
count of each algorithm; the times of the exchange and of the two step models; the choice of a
model; and that the bytes test fails on a planted bug."""

import math

import pytest

from common import collectives
from compare import comm_model as cm

G = 1000.0


def ring_count(n: int, g: float) -> tuple[float, float]:
    """(bytes node 0 sends, bytes it receives) in a ring all-reduce of n ranks, one rank per
    node, counted step by step: a reduce-scatter and an all-gather of n - 1 steps each, every
    rank sending one chunk of g / n to the next."""
    sent = received = 0.0
    for _phase in ("reduce-scatter", "all-gather"):
        for _step in range(n - 1):
            for rank in range(n):
                if rank == 0:
                    sent += g / n
                if (rank + 1) % n == 0:
                    received += g / n
    return sent, received


def ps_count(n: int, g: float) -> tuple[float, float]:
    """(sent, received) by node 0 in one push and pull of a parameter server with a server on
    every node, each server holding g / n: only messages between two nodes cross a link."""
    sent = received = 0.0
    for worker in range(n):
        for server in range(n):
            if worker == server:
                continue  # on one node: the loopback, not the link
            part = g / n
            # the push goes worker -> server, the pull's answer server -> worker
            if worker == 0:
                sent, received = sent + part, received + part
            if server == 0:
                received, sent = received + part, sent + part
    return sent, received


def check_bytes(link_bytes) -> None:
    """What the model must give: the counts above, and the closed form's values."""
    expected = {1: 0.0, 2: 1000.0, 4: 1500.0, 8: 1750.0}  # 2 (n - 1) / n x 1000
    for n, value in expected.items():
        for algorithm, count in ((cm.RING, ring_count), (cm.PS, ps_count)):
            got = link_bytes(algorithm, n, G)
            assert got == pytest.approx(value, rel=1e-12), (algorithm, n)
            assert all(got == pytest.approx(c, rel=1e-12) for c in count(n, G)), (algorithm, n)


def test_link_bytes_are_two_n_minus_one_over_n_of_the_gradient_each_way():
    check_bytes(cm.link_bytes)


@pytest.mark.parametrize(
    "bug",
    [
        lambda alg, n, g: (n - 1) / n * g,  # one phase of the ring, or the push alone
        lambda alg, n, g: 2 * (n - 1) * g,  # whole gradients, not chunks
        lambda alg, n, g: 2 * (n - 1) / n * g if alg == cm.RING else (n - 1) / n * g,
        lambda alg, n, g: 2 * (n - 1) / (n + 1) * g,  # the chunk as g / (n + 1)
    ],
    ids=["one phase", "whole gradients", "push only", "wrong chunk"],
)
def test_the_bytes_test_fails_on_a_planted_bug(bug):
    with pytest.raises(AssertionError):
        check_bytes(bug)


def test_messages_and_the_exchange_time():
    assert cm.messages(cm.RING, 1) == 0
    assert cm.messages(cm.RING, 2) == 2 and cm.messages(cm.RING, 8) == 14
    assert cm.messages(cm.PS, 4) == 6  # a push to and a pull from each of 3 remote servers
    assert cm.messages(cm.RING, 4, pieces=3) == 18  # each of DDP's buckets all-reduced apart
    # 4 messages of 100 µs, then 40 MB at 100 MB/s
    assert cm.comm_time(cm.RING, 2, 40e6, 1e8, 1e-4, pieces=2) == pytest.approx(0.4004)
    assert cm.comm_time(cm.PS, 4, 40e6, 1e9) == pytest.approx(0.06)  # 60 MB at 1 GB/s
    assert cm.comm_time(cm.RING, 1, 40e6, 1e8, 1e-4) == 0.0  # one node: no exchange
    with pytest.raises(ValueError, match="bandwidth"):
        cm.comm_time(cm.RING, 2, 1.0, 0.0)
    with pytest.raises(ValueError, match="unknown algorithm"):
        cm.link_bytes("tree", 2, 1.0)
    with pytest.raises(ValueError, match="at least one node"):
        cm.link_bytes(cm.RING, 0, 1.0)


def test_the_two_step_models():
    assert cm.serial(0.5, 0.4) == pytest.approx(0.9)
    # compute-bound: the tail alone shows
    assert cm.overlapped(0.5, 0.4, 0.1) == pytest.approx(0.6)
    # link-bound: the exchange, its tail included once
    assert cm.overlapped(0.1, 1.0, 0.2) == pytest.approx(1.0)
    assert cm.overlapped(0.5, 0.4, 0.0) == 0.5  # all of it hidden
    assert cm.overlapped(0.5, 0.4, 9.0) == pytest.approx(0.9)  # a tail is at most the exchange
    assert cm.step_time(cm.SERIAL, 0.5, 0.4, 0.1) == pytest.approx(0.9)
    assert cm.step_time(cm.OVERLAPPED, 0.5, 0.4, 0.1) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="unknown model"):
        cm.step_time("pipelined", 1.0, 1.0, 0.0)


def test_tail_and_pieces():
    bucket = collectives.DDP_BUCKET_BYTES
    assert bucket == 25 * 2**20
    assert cm.pieces(40e6, bucket) == 2 and cm.pieces(10e6, bucket) == 1
    assert cm.pieces(40e6, None) == 1
    assert cm.tail_share(40e6, bucket, 21) == pytest.approx(bucket / 40e6)  # DDP's last bucket
    assert cm.tail_share(10e6, bucket, 21) == 1.0  # one bucket: nothing hides
    assert cm.tail_share(40e6, None, 21) == pytest.approx(1 / 21)  # one layer's share
    assert cm.tail_share(40e6, None, None) == 1.0


def test_a_model_is_chosen_only_within_the_limit():
    serial_fits = [{"serial": 0.02, "overlapped": -0.2}, {"serial": -0.05, "overlapped": 0.1}]
    assert cm.choose(serial_fits) == cm.SERIAL  # means 3.5% and 15%
    both_off = [{"serial": 0.3, "overlapped": -0.2}]
    assert cm.choose(both_off) is None  # the better one, 20%, is past 15%
    assert cm.choose(both_off, limit=0.25) == cm.OVERLAPPED
    assert cm.choose([]) is None
    assert cm.within({"serial": 0.15, "overlapped": -0.151}) == ["serial"]
    assert cm.within({"serial": 0.2}) == []
    assert cm.relative_error(1.1, 1.0) == pytest.approx(0.1)


def test_prediction_constants_are_named_with_units():
    names = [name for name, *_ in cm.PREDICTED]
    assert any("NVLink" in n for n in names) and any("100 Gb/s" in n for n in names)
    assert cm.NET_100G_BYTES_PER_S == 100e9 / 8  # bits to bytes
    assert all(counts == (2, 8) for *_, counts in cm.PREDICTED)
    assert all(math.isfinite(bw) and bw > 0 for _, bw, _, _ in cm.PREDICTED)
    # NCCL's ring latency in its Simple protocol: 8.4 us + 2 (n - 1) steps
    assert cm.nccl_latency(2, 3.4e-6) == pytest.approx(15.2e-6)
    assert cm.nccl_latency(8, 9.6e-6) == pytest.approx(142.8e-6)


def check_timeline(timeline) -> None:
    """A 3 s step: forward 1 s, backward 2 s. A 0.5 s collective ready at a quarter of the
    backward (1.5 s) ends at 2 s; a 1 s one ready at half (2 s) ends at 3 s; a 0.4 s one ready
    at the end (3 s) ends at 3.4 s. One the compute waits for (ready None, 0.25 s) lengthens
    the forward. A 1.8 s one ready at once holds the link until 2.8 s: the next, ready at
    1.2 s, ends at 3.3 s."""
    pieces = [(0.5, 0.25), (1.0, 0.5), (0.4, 1.0)]
    assert timeline(3.0, pieces) == pytest.approx(3.4)
    assert timeline(3.0, [(0.25, None), *pieces]) == pytest.approx(3.65)
    assert timeline(3.0, [(1.8, 0.0), (0.5, 0.1)]) == pytest.approx(3.3)
    assert timeline(3.0, [(0.1, 0.0)]) == pytest.approx(3.0)  # hidden: the compute


def test_the_timeline_starts_each_collective_when_ready_and_the_link_free():
    check_timeline(cm.timeline)


@pytest.mark.parametrize(
    "bug",
    [
        lambda t, pieces: t + sum(x for x, _ in pieces),  # nothing hides: serial
        lambda t, pieces: max([t] + [t / 3 + (r or 0) * t * 2 / 3 + x for x, r in pieces]),
        lambda t, pieces: max(t, sum(x for x, _ in pieces)),  # all of it hides
    ],
    ids=["serial", "link never busy", "no tail"],
)
def test_the_timeline_test_fails_on_a_planted_bug(bug):
    with pytest.raises(AssertionError):
        check_timeline(bug)
