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


# --- check_environment: what a framework's C++ reads as it loads ---------------------------------


def refused(framework, env, workload="lenet", strategy=None) -> str:
    with pytest.raises(config.ConfigError) as raised:
        processes.check_environment(framework, workload, strategy, env)
    message = str(raised.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("framework", ["torch", "jax", "mxnet"])
@pytest.mark.parametrize("text", ["abc", "0", "-1", "", "4,2", "1.5", "²", "99999999999"])
def test_a_thread_count_that_is_not_a_whole_number_is_refused(framework, text):
    message = refused(framework, {"OMP_NUM_THREADS": text})
    assert message == (
        f"OMP_NUM_THREADS must be a whole number >= 1 (threads per process), got {text!r}; "
        "set it to one, or unset it"
    )


@pytest.mark.parametrize("text", ["1", "16", " 2"])
def test_a_thread_count_is_accepted(text):
    for framework in ("torch", "jax", "mxnet"):
        processes.check_environment(framework, "lenet", None, {"OMP_NUM_THREADS": text})


@pytest.mark.parametrize(
    "flags, bad",
    [
        ("--xla_dump_to=/tmp/x foo", "'foo', which is not --name or --name=value"),
        ("-xla_dump_to=/tmp/x", "'-xla_dump_to=/tmp/x', which is not --name"),
        ("--xla_dump_to=/tmp/x --2", "'--2', which is not --name"),
        ("--xla_dump_to='/tmp/x", "XLA_FLAGS cannot be read (No closing quotation)"),
        ("no-such-flags-file", "XLA_FLAGS='no-such-flags-file' is neither flags"),
    ],
)
def test_xla_flags_that_xla_would_end_the_process_on_are_refused(flags, bad):
    assert bad in refused("jax", {"XLA_FLAGS": flags})
    processes.check_environment("torch", "lenet", None, {"XLA_FLAGS": flags})  # torch: unread


def test_xla_flags_that_look_right_are_accepted(tmp_path):
    """Only the syntax is checked: XLA's flag names change with every jaxlib."""
    flagfile = tmp_path / "flags"
    flagfile.write_text("--xla_dump_to=/tmp/x\n")
    for flags in (
        "--xla_force_host_platform_device_count=2",
        " --xla_dump_to='/tmp/a b' --xla_cpu_enable_fast_math=false ",
        "--xla_gpu_autotune_level=0\t--xla_dump_hlo_as_text",
        str(flagfile),
        "",
    ):
        processes.check_environment("jax", "resnet18", "sharding", {"XLA_FLAGS": flags})


def test_a_gloo_interface_that_does_not_exist_is_refused():
    present = processes.network_interfaces()
    assert present  # at least the loopback
    message = refused("torch", {"GLOO_SOCKET_IFNAME": "nosuch0"}, "resnet18", "ddp")
    assert message.startswith("GLOO_SOCKET_IFNAME=nosuch0 names no network interface of this")
    assert f"(it has: {', '.join(sorted(present))})" in message
    name = sorted(present)[0]
    assert "nosuch0" in refused("torch", {"GLOO_SOCKET_IFNAME": f"{name},nosuch0"})
    processes.check_environment("torch", "resnet18", "ddp", {"GLOO_SOCKET_IFNAME": name})
    processes.check_environment("jax", "lenet", None, {"GLOO_SOCKET_IFNAME": "nosuch0"})


def test_nccl_and_ps_lite_interfaces_that_do_not_exist_are_refused():
    name = sorted(processes.network_interfaces())[0]
    for framework, variable, strategy in (
        ("torch", "NCCL_SOCKET_IFNAME", "ddp"),
        ("mxnet", "DMLC_INTERFACE", "dist"),
    ):
        message = refused(framework, {variable: "nosuch0"}, "resnet18", strategy)
        assert message.startswith(f"{variable}=nosuch0 names no network interface of this")
        processes.check_environment(framework, "resnet18", strategy, {variable: name})
    # NCCL's own syntax: a prefix, `=` for an exact name, `^` for names to avoid
    refused("torch", {"NCCL_SOCKET_IFNAME": f"={name[:-1]}"})
    for text in (name[:-1], f"={name}", "^nosuch0", f"{name},{name[:-1]}"):
        processes.check_environment("torch", "resnet18", "ddp", {"NCCL_SOCKET_IFNAME": text})


LEFTOVER = {"DMLC_ROLE": "server", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9091"}


@pytest.mark.parametrize(
    "workload, strategy, env",
    [
        ("lenet", None, {"DMLC_ROLE": "worker"}),
        ("lenet", None, LEFTOVER),
        ("resnet18", None, {"DMLC_PS_ROOT_URI": "127.0.0.1"}),
        ("resnet18", "gluon", {"DMLC_NUM_WORKER": "2"}),
        ("resnet50", "pipeline", LEFTOVER),
    ],
)
def test_leftover_ps_lite_variables_are_refused_outside_dist(workload, strategy, env):
    message = refused("mxnet", env, workload, strategy)
    names = " ".join(sorted(env))
    assert message == (
        f"{names} set (left from a kvstore dist run?): MXNet would join a parameter server, "
        f"which only --strategy dist uses; unset them (unset {names})"
    )


@pytest.mark.parametrize("role", ["server", "scheduler", ""])
def test_a_dist_run_is_a_worker_or_the_launcher_never_a_server(role):
    message = refused("mxnet", {**LEFTOVER, "DMLC_ROLE": role}, "resnet18", "dist")
    assert message.startswith(f"DMLC_ROLE={role}: python -m mxnet_impl runs as a worker")


def test_ps_lite_variables_where_they_belong_are_accepted():
    worker = {**LEFTOVER, "DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "2"}
    processes.check_environment("mxnet", "resnet18", "dist", worker)  # a worker
    launcher = {"DMLC_NUM_WORKER": "2", "DMLC_PS_ROOT_PORT": "9091"}
    processes.check_environment("mxnet", "resnet18", "dist", launcher)  # the launcher's settings
    processes.check_environment("mxnet", "lenet", None, {"DMLC_LOG_STACK_TRACE_DEPTH": "10"})
    processes.check_environment("torch", "lenet", None, LEFTOVER)  # only MXNet reads them


def test_check_environment_reads_the_process_environment(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "abc")
    with pytest.raises(config.ConfigError, match="OMP_NUM_THREADS must be"):
        processes.check_environment("torch", "lenet", None)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    processes.check_environment("torch", "lenet", None)
