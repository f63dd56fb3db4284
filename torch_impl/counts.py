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

from common import supervise
from common.nodes import Nodes

# Each node's --nnodes, shared through node 0's rendezvous store (`share`): nodes given
# different counts never complete torchrun's rendezvous, and each would blame one that came.
COUNTS_KEY = "multidevice.nnodes"  # in the store: "rank:count " of each node
COUNTS_ENV = "MULTIDEVICE_NODE_COUNT"  # to torchrun: "rank count timeout endpoint"
COUNTS_FILE_ENV = "MULTIDEVICE_NODE_COUNTS_FILE"  # what torchrun found in the store, for here


def not_joined(nodes: Nodes, env: dict) -> str:
    """Why the rendezvous did not complete in time: the counts, where another node noted
    another (torchrun read them from the store), else the node that did not come."""
    path = Path(env[COUNTS_FILE_ENV])
    noted = path.read_text().split() if path.is_file() else []
    pairs = (entry.split(":") for entry in noted)
    counts = {int(r): int(c) for r, c in pairs if r.isdigit() and c.isdigit()}
    other = {r: c for r, c in counts.items() if r != nodes.rank and c != nodes.count}
    if not other:
        return nodes.timed_out()
    rank, count = min(other.items())
    return (
        f"node {rank} joined the rendezvous at {nodes.endpoint} with --nnodes {count}, this "
        f"node (node {nodes.rank}) with --nnodes {nodes.count}: give every node the same --nnodes"
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
