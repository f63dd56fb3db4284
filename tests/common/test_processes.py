"""common.processes: settings of several processes, the coordinator's port, a bounded wait."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common import config, processes

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text", ["abc", "-1", "", " ", "1.5", "²"])
def test_env_int_refuses_what_is_not_a_whole_number_in_range(monkeypatch, text):
    monkeypatch.setenv("N_TEST", text)
    with pytest.raises(
        config.ConfigError, match=f"N_TEST must be a whole number >= 0, got {text!r}"
    ):
        processes.env_int("N_TEST", None, 0)


def test_env_int_reads_the_variable_or_the_default(monkeypatch):
    monkeypatch.delenv("N_TEST", raising=False)
    assert processes.env_int("N_TEST", "7", 1) == 7
    monkeypatch.setenv("N_TEST", "3")
    assert processes.env_int("N_TEST", "7", 1) == 3
    with pytest.raises(config.ConfigError, match="got None"):  # no default: must be set
        processes.env_int("N_UNSET_TEST", None, 0)


@pytest.mark.parametrize("address", ["host", ":29500", "host:", "host:port", "host:0", "h:70000"])
def test_port_of_wants_host_and_port(address):
    with pytest.raises(config.ConfigError, match=f"ADDR must be host:port, got {address!r}"):
        processes.port_of(address, "ADDR")


def test_port_of():
    assert processes.port_of("10.0.0.1:29500", "ADDR") == 29500
    assert processes.port_of("[::1]:29500", "ADDR") == 29500


def test_a_port_held_by_another_program_is_refused():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(config.ConfigError, match=f"port {port} of ADDR cannot be used"):
            processes.check_port_free(port, "ADDR")
    processes.check_port_free(port, "ADDR")  # free again


DEADLINE = """
import sys, time
from common import processes
with processes.deadline(float(sys.argv[1]), "error: gave up waiting", 5):
    time.sleep(float(sys.argv[2]))  # the wait (jax's, in C++, in the real use)
print("finished")
"""


def wait(deadline: float, seconds: float) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", DEADLINE, str(deadline), str(seconds)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_deadline_ends_a_wait_that_does_not_finish_with_one_line_and_its_code():
    start = time.monotonic()
    out = wait(0.5, 30)
    assert time.monotonic() - start < 10
    assert out.returncode == 5 and out.stderr == "error: gave up waiting\n" and not out.stdout


def test_deadline_lets_a_wait_that_finishes_go_on():
    out = wait(30, 0)
    assert out.returncode == 0 and out.stdout == "finished\n" and not out.stderr
