"""Several JAX processes (jax_impl/launch.join): bad JAX_* settings are one-line
config errors, and a process whose peers never come ends in bounded time with one line. The
two-process run itself is tested in test_resnet18.py."""

import argparse
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

from common import config, devices, processes, signals
from jax_impl import guard, launch
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
        launch.join(devices.DevicePlan(1, "cpu", True))


def test_one_process_is_a_world_of_its_own_and_several_run_one_program_over_the_mesh(monkeypatch):
    """Without JAX_NUM_PROCESSES a process is alone; with it, a strategy that cannot span
    processes is refused before jax.distributed is touched; those that can are one program over
    the Mesh of every process's devices (lesson 2's sharding and shard_map, lesson 4's)."""
    monkeypatch.delenv("JAX_NUM_PROCESSES", raising=False)
    world = launch.join(devices.DevicePlan(1, "cpu", True))
    assert (world.rank, world.size, world.plan.count, world.sum(3.0)) == (0, 1, 1, 3.0)
    assert world.devices == jax.devices("cpu")[:1]
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: pytest.fail("joined"))
    args = argparse.Namespace(strategy="pmap", nnodes=None)
    with pytest.raises(config.ConfigError, match="need --strategy sharding or shard_map, not pmap"):
        launch.join(devices.DevicePlan(1, "cpu", True), args)
    args = argparse.Namespace(workload="zero", strategy="pmap", nnodes=None)
    with pytest.raises(config.ConfigError, match="sharding or fsdp or fsdp_explicit, not pmap"):
        launch.join(devices.DevicePlan(1, "cpu", True), args)
    for workload, allowed in (
        ("resnet18", ("sharding", "shard_map")),
        ("zero", ("sharding", "fsdp", "fsdp_explicit")),
    ):
        assert guard._over_processes(argparse.Namespace(workload=workload)) == allowed


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


SUM = """
import numpy as np
from common import devices
devices.set_jax_host_devices(1)  # one CPU device per process, as --gpus 1 sets it
from jax_impl import launch
world = launch.join(devices.DevicePlan(1, "cpu", True))
print(world.rank, world.size, world.plan.count, world.sum(np.array([world.rank, 1.0])).tolist())
"""


@pytest.mark.multi_device
def test_two_processes_join_one_world_whose_sum_spans_both():
    """launch.join in two processes: every process's devices, and `sum` over the processes."""
    address = f"127.0.0.1:{free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SUM],
            cwd=ROOT,
            env={**os.environ, **process_0(address), "JAX_PROCESS_ID": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    lines = [out.strip().splitlines()[-1] if out.strip() else err for out, err in outs]
    assert lines == ["0 2 2 [1.0, 2.0]", "1 2 2 [1.0, 2.0]"], lines


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
    out, seconds = run_alone(process_0(address, JAX_INIT_TIMEOUT="1"), tmp_path)
    assert out.returncode == 2 and seconds < 30  # 1 s and the imports
    assert out.stderr.strip().splitlines()[-1] == (
        "error: process 1 of 2 did not join within 1 s; start it with JAX_PROCESS_ID=1, "
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


def _two_processes(results):
    """Processes 0 and 1 of a two-process resnet18 run on this machine, process 0 at epoch 1."""
    command = ["jax_impl", "--workload", "resnet18", "--gpus", "1"]
    address = f"127.0.0.1:{free_port()}"
    procs = [
        stopping.start(command, results, env={**process_0(address), "JAX_PROCESS_ID": str(r)})
        for r in (0, 1)
    ]
    interrupt.wait_for_line(procs[0], "epoch 1/")
    return procs


def _stopped_as_by_ctrl_c(procs, results):
    """Each process ends as a Ctrl-C ends it (not in jax's abort), and nothing is recorded."""
    try:
        for p in procs:
            _, err = p.communicate(timeout=90)
            assert p.returncode == 128 + signal.SIGTERM, err
            assert err.strip().splitlines()[-1] == interrupt.LAST_LINE, err
            assert err.count(interrupt.LAST_LINE) == 1, err
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert not results.exists()


@pytest.mark.slow
@pytest.mark.multi_device
def test_two_processes_listen_on_loopback_and_stop_on_sigterm(tmp_path):
    """Two processes of one machine (JAX_COORDINATOR_ADDRESS=127.0.0.1:PORT): while they train,
    every socket they listen on (the coordinator's, the collectives') is a loopback one; a
    SIGTERM to each ends it as Ctrl-C does, and nothing is recorded."""
    procs = _two_processes(tmp_path / "r.jsonl")
    try:
        # Each process of several runs under guard.run_wrapped: its sockets are its child's.
        pids = [pid for p in procs for pid in (p.pid, *processes.descendants(p.pid))]
        addresses = sockets.listening(pids)
        assert addresses and not sockets.not_loopback(addresses), addresses
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
    _stopped_as_by_ctrl_c(procs, tmp_path / "r.jsonl")


@pytest.mark.slow
@pytest.mark.multi_device
def test_a_process_stopped_inside_a_collective_leaves_the_group_cleanly(tmp_path):
    """Process 1 takes its SIGTERM while its main thread waits in a step's collective for
    process 0 (paused): its watchdog ends it, leaving jax's group through the shutdown barrier
    (jax_impl/launch.join), so process 0, stopped a moment later, passes the barrier too
    instead of waiting there for a peer gone without a word and aborting."""
    procs = _two_processes(tmp_path / "r.jsonl")
    node = [procs[0].pid, *processes.descendants(procs[0].pid)]  # guard's wrapper and its child
    for pid in node:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(2)  # process 1 is in the next step's collective, waiting for process 0
    procs[1].send_signal(signal.SIGTERM)
    time.sleep(signals.GRACE + 2)  # its watchdog has taken the signal
    procs[0].send_signal(signal.SIGTERM)
    for pid in node:
        os.kill(pid, signal.SIGCONT)
    _stopped_as_by_ctrl_c(procs, tmp_path / "r.jsonl")


@pytest.mark.slow
@pytest.mark.multi_device
def test_a_sigterm_to_process_0_alone_ends_both_in_bounded_time(tmp_path):
    """Process 0 takes a SIGTERM between steps while process 1 goes on into the next step's
    collective: process 0's goodbye (the shutdown barrier) is bounded after a stop, so it ends
    in its one line, and process 1, its peer and coordinator gone, ends too. How process 1 ends
    is jax's: XLA's client aborts the process (exit 134, its C++ stack), for which jaxlib has
    no hook (README, "Known limits")."""
    procs = _two_processes(tmp_path / "r.jsonl")
    start = time.monotonic()
    procs[0].send_signal(signal.SIGTERM)
    try:
        _, err = procs[0].communicate(timeout=signals.GRACE + 10)
        assert procs[0].returncode == 128 + signal.SIGTERM, err
        assert err.strip().splitlines()[-1] == interrupt.LAST_LINE, err
        procs[1].communicate(timeout=30)
        assert procs[1].returncode != 0 and time.monotonic() - start < 30
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.slow
@pytest.mark.multi_device
def test_processes_given_different_counts_each_end_in_one_line(tmp_path):
    """Process 0 with --nnodes 2, process 1 with --nnodes 3: the coordinator's count rules, so
    jax alone would go on with 2 and ignore the 3. The process given the other count refuses
    in one line (exit 2); process 0, its peer gone, ends by itself (--peer-timeout) in one line
    too; both within a minute, no traceback, no process left, nothing recorded."""
    results, address = tmp_path / "r.jsonl", f"127.0.0.1:{free_port()}"
    procs = [
        stopping.start(
            ["jax_impl", "--workload", "resnet18", "--gpus", "1", "--nnodes", str(count)]
            + ["--node-rank", str(rank), "--rdzv-endpoint", address, "--peer-timeout", "10"],
            results,
        )
        for rank, count in ((0, 2), (1, 3))
    ]
    begun, errs = time.monotonic(), []
    try:
        for p in procs:
            errs.append(p.communicate(timeout=90)[1])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    took = time.monotonic() - begun
    lasts = [err.strip().splitlines()[-1] if err.strip() else "" for err in errs]
    assert procs[1].returncode == 2, errs[1]
    assert lasts[1] == (
        "error: this process was given 3 JAX processes (JAX_NUM_PROCESSES, --nnodes) and 2 "
        "joined: give every process the same count"
    )
    assert procs[0].returncode == 1 and lasts[0].startswith("error: "), errs[0]
    assert lasts[0].endswith(
        "another process of the run, or the link to it, went (that node's output says which)"
    ), errs[0]
    assert took < 60 and not any("Traceback" in err for err in errs), (took, errs)
    print(f"both ended {took:.1f} s after they started")
    assert interrupt.processes_of(str(results)) == [] and not results.exists()
