"""Each node's --nnodes, shared through node 0's rendezvous store, so that nodes given
different counts are told so, not that a node did not come (torch_impl/guard.py applies it:
torchrun's agent shares, the launcher reads when the rendezvous times out)."""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import time
from pathlib import Path

from common import config, supervise
from common.nodes import Nodes

# Each node's --nnodes, shared through node 0's rendezvous store (`share`): nodes given
# different counts never complete torchrun's rendezvous, and each would blame one that came.
COUNTS_KEY = "multidevice.nnodes"  # in the store: "rank:count " of each node
COUNTS_ENV = "MULTIDEVICE_NODE_COUNT"  # to torchrun: "rank count timeout endpoint"
COUNTS_FILE_ENV = "MULTIDEVICE_NODE_COUNTS_FILE"  # what torchrun found in the store, for here
NOTES_S = 5  # a worker's wait for every node's note: each is made as its torchrun starts


def not_joined(nodes: Nodes, env: dict) -> str:
    """Why the rendezvous did not complete in time: the counts, where another node noted
    another (torchrun read them from the store), else the node that did not come."""
    counts = _noted(Path(env[COUNTS_FILE_ENV]))
    return _differ(counts, nodes.rank, nodes.count, nodes.endpoint) or nodes.timed_out()


def check_round() -> None:
    """In a worker, before it joins its group: the rendezvous also completes with nodes given
    different counts (at the smaller: torch's round is complete for every node once one node's
    count has joined), and the run would go on with a node short or end as a lost peer. Every
    node of the round noted its count (`share`); a node whose count is not the round's, or that
    sees another's, says the counts in one line. Waits a few seconds at most for the notes."""
    if not os.environ.get(COUNTS_ENV):
        return
    rank, count, _, endpoint = os.environ[COUNTS_ENV].split(" ", 3)
    nodes_in_round = int(os.environ["GROUP_WORLD_SIZE"])
    end, counts = time.monotonic() + NOTES_S, {}
    while len(counts) < nodes_in_round and time.monotonic() < end:
        counts = _noted(Path(os.environ[COUNTS_FILE_ENV]))
        time.sleep(0.2)
    line = _differ(counts, int(rank), int(count), endpoint)
    if not line and nodes_in_round != int(count):
        line = (
            f"the rendezvous at {endpoint} completed with {nodes_in_round} nodes, this node "
            f"(node {rank}) was given --nnodes {count}: give every node the same --nnodes"
        )
    if line:
        raise config.ConfigError(line)


def _noted(path: Path) -> dict[int, int]:
    """{node: its --nnodes} as the store held them when torchrun last wrote them to `path`."""
    noted = path.read_text().split() if path.is_file() else []
    pairs = (entry.split(":") for entry in noted)
    return {int(r): int(c) for r, c in pairs if r.isdigit() and c.isdigit()}


def _differ(counts: dict[int, int], rank: int, count: int, endpoint: str) -> str:
    """The line naming a node that noted another count than this node's, else ''."""
    other = {r: c for r, c in counts.items() if r != rank and c != count}
    if not other:
        return ""
    first, theirs = min(other.items())
    return (
        f"node {first} joined the rendezvous at {endpoint} with --nnodes {theirs}, this "
        f"node (node {rank}) with --nnodes {count}: give every node the same --nnodes"
    )


def share() -> None:
    """This node's --nnodes added to node 0's store, and every node's, as the store holds them,
    written for the launcher until the workers are up (a thread of torchrun's). The store's
    client holds the interpreter while it connects (torchrun's own rendezvous, node 0's store
    among it, would wait): it is made once the port answers, with a short bound."""
    rank, count, timeout, endpoint = os.environ[COUNTS_ENV].split(" ", 3)
    host, _, port = endpoint.rpartition(":")
    address = (host.strip("[]"), int(port))
    out, ready = Path(os.environ[COUNTS_FILE_ENV]), Path(os.environ[supervise.READY_FILE_ENV])
    end = time.monotonic() + int(timeout)
    while not _answers(address):
        if time.monotonic() > end:
            return
        time.sleep(0.5)
    try:
        from torch.distributed import TCPStore

        store = TCPStore(*address, is_master=False, timeout=datetime.timedelta(seconds=5))
        store.append(COUNTS_KEY, f"{rank}:{count} ")
        while not ready.exists():
            out.with_suffix(".new").write_bytes(store.get(COUNTS_KEY))
            out.with_suffix(".new").replace(out)
            time.sleep(0.5)
    except (RuntimeError, ValueError, OSError):  # the store gone: torchrun says so itself
        return


def _answers(address: tuple[str, int]) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(address, timeout=2):
        return True
    return False
