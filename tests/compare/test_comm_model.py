"""compare/comm_model.py: the bytes each node's link carries, against a message-by-message
count of both algorithms; the step's timeline; NCCL's latency; and that the bytes and timeline
tests fail on planted bugs."""

import math

import pytest

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
        got = link_bytes(n, G)
        assert got == pytest.approx(value, rel=1e-12), n
        for count in (ring_count, ps_count):
            assert all(got == pytest.approx(c, rel=1e-12) for c in count(n, G)), (count, n)


def test_link_bytes_are_two_n_minus_one_over_n_of_the_gradient_each_way():
    check_bytes(cm.link_bytes)


def test_a_steps_counted_collectives_cross_each_link_as_their_rings_do():
    """Lesson 4's records: an all-gather (or a reduce-scatter) is one phase of the ring, an
    all-reduce both, so a step that gathers G and all-reduces G carries 3 (n - 1) / n x G."""
    ops = [
        {"op": "all_gather", "count": 3, "bytes": G},
        {"op": "all_reduce", "count": 1, "bytes": G},
    ]
    for n in (1, 2, 4, 8):
        sent, received = ring_count(n, G)
        assert sent == received
        assert cm.collective_link_bytes(n, ops) == pytest.approx(sent / 2 + sent, rel=1e-12), n
    assert cm.covered(ops) == 3 * G  # an all-reduce counted once would give 2 G


@pytest.mark.parametrize(
    "bug",
    [
        lambda n, g: (n - 1) / n * g,  # one phase of the ring, or the push alone
        lambda n, g: 2 * (n - 1) * g,  # whole gradients, not chunks
        lambda n, g: 2 * (n - 1) / (n + 1) * g,  # the chunk as g / (n + 1)
    ],
    ids=["one phase", "whole gradients", "wrong chunk"],
)
def test_the_bytes_test_fails_on_a_planted_bug(bug):
    with pytest.raises(AssertionError):
        check_bytes(bug)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="at least one node"):
        cm.link_bytes(0, 1.0)
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
