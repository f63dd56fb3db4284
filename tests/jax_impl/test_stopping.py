"""A node of a multi-process JAX run (jax_impl/guard.py's wrapper and its child) stopped by a
signal to its pid alone, as `kill -INT PID` or a batch scheduler sends it: it ends as a Ctrl-C
ends it, in one line, its child along."""

import signal
import socket
import time

import pytest

from common import processes, signals
from tests.fixtures import interrupt, stopping

pytestmark = [pytest.mark.slow, pytest.mark.multi_device]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_to_the_node_alone_ends_it_in_one_line(tmp_path, signum):
    """Node 0 of two waits for node 1 at the join (it never comes); the signal to the node's
    pid, not to its group, reaches its child all the same."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    command = ["jax_impl", "--workload", "resnet18", "--gpus", "1", "--nnodes", "2"]
    proc = stopping.start(
        [*command, "--node-rank", "0", "--rdzv-endpoint", address], tmp_path / "r.jsonl"
    )
    try:
        end = time.monotonic() + 120
        while not _answers(address) and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.2)  # until the coordinator listens: the child waits for node 1
        child = processes.descendants(proc.pid)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=signals.GRACE + 20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum, err
    assert err.strip().splitlines()[-1] == interrupt.LAST_LINE, err
    assert stopping._gone(child, 10) == []
    assert not (tmp_path / "r.jsonl").exists()


def _answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return False
    return True
