"""Several JAX processes (jax_impl/launch.join): bad JAX_* settings are one-line
config errors, and a process whose peers never come ends in bounded time with one line. The
two-process run itself is tested in test_resnet18.py."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest

from common import config, devices
from jax_impl import launch
from tests.fixtures import interrupt, sockets, stopping

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "env, message",
    [
        ({"JAX_NUM_PROCESSES": "abc"}, "JAX_NUM_PROCESSES must be a whole number >= 1, got 'abc'"),
        ({"JAX_NUM_PROCESSES": "-2"}, "JAX_NUM_PROCESSES must be a whole number >= 1, got '-2'"),
        ({"JAX_PROCESS_ID": "5"}, "JAX_PROCESS_ID=5 of 2 processes: use 0 to 1"),
        ({"JAX_PROCESS_ID": "-1"}, "JAX_PROCESS_ID must be a whole number >= 0, got '-1'"),
        ({"JAX_PROCESS_ID": "one"}, "JAX_PROCESS_ID must be a whole number >= 0, got 'one'"),
        ({"JAX_COORDINATOR_ADDRESS": "localhost"}, "must be host:port, got 'localhost'"),
        ({"JAX_COORDINATOR_ADDRESS": "h:99999"}, "must be host:port, got 'h:99999'"),
        ({"JAX_INIT_TIMEOUT": "soon"}, "JAX_INIT_TIMEOUT must be a whole number >= 1"),
        ({"JAX_PROCESS_ID": None}, "also set JAX_COORDINATOR_ADDRESS and JAX_PROCESS_ID"),
    ],
)
def test_bad_multi_process_settings_are_config_errors(monkeypatch, env, message):
    """Refused before jax.distributed is touched (it would raise a traceback or abort)."""
    base = {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1", "JAX_COORDINATOR_ADDRESS": "h:1"}
    for name, value in {**base, **env}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: pytest.fail("joined"))
    with pytest.raises(config.ConfigError, match=re.escape(message)):
        launch.join("sharding", devices.DevicePlan(1, "cpu", True))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def process_0(address: str, **env) -> dict:
    """The environment of process 0 of 2 whose coordinator is at `address`, with `env`."""
    return {
        "JAX_COORDINATOR_ADDRESS": address,
        "JAX_NUM_PROCESSES": "2",
        "JAX_PROCESS_ID": "0",
        **env,
    }


def run_alone(env: dict, tmp_path) -> tuple[subprocess.CompletedProcess, float]:
    """`python -m jax_impl --workload resnet18` as one process of several: (result, seconds)."""
    path = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "jax_impl", "--workload", "resnet18", "--platform", "cpu"]
    cmd += ["--preset", "smoke", "--results", str(path), "--no-progress"]
    start = time.monotonic()
    out = subprocess.run(
        cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )
    assert not path.exists()  # nothing recorded
    assert "Traceback" not in out.stderr and "Check failure" not in out.stderr, out.stderr
    return out, time.monotonic() - start


def test_process_0_without_its_peer_ends_in_bounded_time_with_one_line(tmp_path):
    """Left to itself, jax aborts after its own deadline with a C++ stack dump ("another task
    died"); JAX_INIT_TIMEOUT bounds the wait and the last line says what to start."""
    address = f"127.0.0.1:{free_port()}"
    out, seconds = run_alone(process_0(address, JAX_INIT_TIMEOUT="3"), tmp_path)
    assert out.returncode == 2 and seconds < 30  # 3 s and the imports
    assert out.stderr.strip().splitlines()[-1] == (
        "error: process 1 of 2 did not join within 3 s; start it with JAX_PROCESS_ID=1, "
        f"JAX_NUM_PROCESSES=2 and JAX_COORDINATOR_ADDRESS={address} (or raise JAX_INIT_TIMEOUT)"
    )


def test_process_0_on_a_taken_port_is_one_line(tmp_path):
    """jax's coordinator segfaults when it cannot bind its port: checked first."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out, seconds = run_alone(process_0(f"127.0.0.1:{port}"), tmp_path)
    assert out.returncode == 2 and seconds < 30
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: port {port} of JAX_COORDINATOR_ADDRESS cannot be used (Address already in use): "
        "another program holds it; choose a free port for every process"
    )


@pytest.mark.slow
@pytest.mark.multi_device
def test_two_processes_listen_on_loopback_and_stop_on_sigterm(tmp_path):
    """Two processes of one machine (JAX_COORDINATOR_ADDRESS=127.0.0.1:PORT): while they train,
    every socket they listen on (the coordinator's, the collectives') is a loopback one; a
    SIGTERM to each ends it as Ctrl-C does, and nothing is recorded."""
    results = tmp_path / "r.jsonl"
    command = ["jax_impl", "--workload", "resnet18", "--gpus", "1"]
    address = f"127.0.0.1:{free_port()}"
    procs = [
        stopping.start(command, results, env={**process_0(address), "JAX_PROCESS_ID": str(r)})
        for r in (0, 1)
    ]
    try:
        interrupt.wait_for_line(procs[0], "epoch 1/")
        addresses = sockets.listening([p.pid for p in procs])
        assert addresses and not sockets.not_loopback(addresses), addresses
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            _, err = p.communicate(timeout=90)
            assert p.returncode == 128 + signal.SIGTERM, err
            assert err.strip().splitlines()[-1] == interrupt.LAST_LINE, err
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert not results.exists()
