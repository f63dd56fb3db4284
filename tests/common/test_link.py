"""common/link.py: the interface counters the harness reads around each timed epoch, and the
TCP probe of a link's latency and bandwidth (over loopback here)."""

import socket
import threading

import pytest

from common import link

HEADER = "Inter-|   Receive ... |  Transmit\n face |bytes packets ... |bytes packets ...\n"
ROWS = [  # /proc/net/dev's row: 8 fields received, then 8 sent
    "    lo:   1000  10 0 0 0 0 0 0   1000  10 0 0 0 0 0 0",
    "  mdt0: 123456 100 0 0 0 0 0 0 654321 200 0 0 0 0 0 0",
]
TABLE = HEADER + "\n".join(ROWS) + "\n"


def test_counters_read_the_interfaces_received_and_sent_bytes():
    assert link.counters("mdt0", TABLE) == (123456, 654321)
    with pytest.raises(ValueError, match="no interface 'eth9'"):
        link.counters("eth9", TABLE)


def test_the_counter_adds_up_the_timed_regions_only(monkeypatch):
    readings = iter([(100, 1000), (300, 5000), (1300, 6000), (1400, 9000)])
    monkeypatch.setattr(link, "counters", lambda iface: next(readings))
    counter = link.Counter("mdt0")
    counter.stop(counter.start(), steps=4)
    counter.stop(counter.start(), steps=4)  # the bytes between the regions are not counted
    assert counter.fields() == {
        "link_bytes": {"iface": "mdt0", "rx": 200 + 100, "tx": 4000 + 3000, "steps": 8}
    }


def test_no_interface_no_counting(monkeypatch):
    monkeypatch.delenv(link.IFACE_ENV, raising=False)
    counter = link.Counter()
    counter.stop(counter.start(), steps=3)
    assert counter.fields() == {}


def test_the_loopback_counter_sees_what_a_socket_sends():
    """The kernel's own count, not an estimate: a megabyte over loopback is counted (at least
    once each way; loopback counts every packet as sent and received)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def swallow():
        conn, _ = server.accept()
        with conn:
            while conn.recv(1 << 16):
                pass

    thread = threading.Thread(target=swallow)
    thread.start()
    counter = link.Counter("lo")
    begun = counter.start()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"\0" * (1 << 20))
    thread.join(10)
    server.close()
    counter.stop(begun, steps=1)
    assert counter.tx >= 1 << 20 and counter.rx >= 1 << 20


def test_the_probe_measures_latency_and_bandwidth_over_loopback():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = threading.Thread(target=link.serve, args=("127.0.0.1", port, 20.0))
    server.start()
    got = link.probe("127.0.0.1", port, 20.0)
    server.join(20)
    assert 0 < got["latency_s"] < 0.1
    assert got["measured_bps"] > 1e6  # loopback moves far more than a megabit per second
