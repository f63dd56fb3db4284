"""A node's link, measured: the bytes its interface carries while training steps, and the
bandwidth and latency of the link itself (docs/design.md, "A cluster in one box").

The bytes come from the kernel's counters of the interface (/proc/net/dev, which shows the
reading process's own network namespace), read around each timed epoch by the harness of the
process that records: what the engine really sent and received, headers included, with nothing
estimated. `python -m common.link serve|probe` measures the link between two nodes with plain
TCP, as the engines use it: a small message's round trip (alpha) and a bulk stream (beta).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

IFACE_ENV = "MULTIDEVICE_LINK_IFACE"  # the interface to count, set by the cluster for each node
# TCP/IP headers on a 1500-byte MTU, the acknowledgements, the engine's own messages: what a
# link carries beyond an all-reduce's bytes
OVERHEAD = 0.15
PING_ROUNDS = 200
STREAM_SECONDS = 2.0  # a bulk stream at most this long, so a slow link is measured in seconds
STREAM_MAX = 256 << 20
CHUNK = 1 << 20


def counters(iface: str, table: str | None = None) -> tuple[int, int]:
    """(bytes received, bytes sent) so far by `iface` in this network namespace."""
    text = table if table is not None else Path("/proc/net/dev").read_text()
    for line in text.splitlines():
        name, sep, fields = line.partition(":")
        if sep and name.strip() == iface:
            values = fields.split()
            return int(values[0]), int(values[8])
    raise ValueError(f"no interface {iface!r} in /proc/net/dev")


class Counter:
    """The bytes `iface` carried over the timed regions (`during`); nothing without one."""

    def __init__(self, iface: str | None = None):
        self.iface = iface if iface is not None else os.environ.get(IFACE_ENV)
        self.rx = self.tx = self.steps = 0

    def start(self) -> tuple[int, int] | None:
        return counters(self.iface) if self.iface else None

    def stop(self, begun: tuple[int, int] | None, steps: int) -> None:
        if begun is None:
            return
        rx, tx = counters(self.iface)
        self.rx, self.tx = self.rx + rx - begun[0], self.tx + tx - begun[1]
        self.steps += steps

    def fields(self) -> dict:
        """The record's `extra.link_bytes` (empty where nothing was counted)."""
        if not self.iface:
            return {}
        return {
            "link_bytes": {"iface": self.iface, "rx": self.rx, "tx": self.tx, "steps": self.steps}
        }


def crossing_s(payload: float, ranks: int, rate_bps: float) -> float:
    """Seconds an all-reduce of `payload` bytes over `ranks` takes across one rank's link at
    `rate_bps`, each way: 2(n - 1)/n of it in a ring (and about as much to and from a
    parameter server on every node), headers included."""
    return 2 * (ranks - 1) / ranks * payload * 8 * (1 + OVERHEAD) / rate_bps


# --- the link itself: latency and bandwidth over TCP ---------------------------------------------


def serve(address: str, port: int, deadline: float) -> None:
    """Answer one probe: echo each byte of the pings, then swallow the stream and say its size."""
    with socket.create_server((address, port)) as server:
        server.settimeout(deadline)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(deadline)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(PING_ROUNDS):
                conn.sendall(conn.recv(1))
            total = 0
            while chunk := conn.recv(CHUNK):
                total += len(chunk)
            conn.sendall(str(total).encode())


def probe(address: str, port: int, deadline: float) -> dict:
    """{"latency_s": one way, the median of PING_ROUNDS round trips / 2; "measured_bps": a
    bulk TCP stream's bits per second, until STREAM_SECONDS or STREAM_MAX bytes}."""
    conn = _connect(address, port, deadline)
    with conn:
        conn.settimeout(deadline)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        trips = []
        for _ in range(PING_ROUNDS):
            begin = time.perf_counter()
            conn.sendall(b"x")
            conn.recv(1)
            trips.append(time.perf_counter() - begin)
        block, sent, begin = b"\0" * CHUNK, 0, time.perf_counter()
        while time.perf_counter() - begin < STREAM_SECONDS and sent < STREAM_MAX:
            conn.sendall(block)
            sent += len(block)
        conn.shutdown(socket.SHUT_WR)
        received = int(conn.recv(64))  # the stream has arrived once the server says its size
        seconds = time.perf_counter() - begin
    return {"latency_s": statistics.median(trips) / 2, "measured_bps": 8 * received / seconds}


def _connect(address: str, port: int, deadline: float) -> socket.socket:
    """A connection to the server, which may still be starting: retried until `deadline` s."""
    end = time.monotonic() + deadline
    while True:
        try:
            return socket.create_connection((address, port), timeout=deadline)
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m common.link", description=__doc__.split("\n")[0])
    p.add_argument("role", choices=("serve", "probe"))
    p.add_argument("address")
    p.add_argument("port", type=int)
    p.add_argument("--deadline", type=float, default=60.0, help="seconds any wait may take")
    args = p.parse_args(argv)
    try:
        if args.role == "serve":
            serve(args.address, args.port, args.deadline)
        else:
            print(json.dumps(probe(args.address, args.port, args.deadline)), flush=True)
    except OSError as e:
        print(f"error: link {args.role} at {args.address}:{args.port}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
