"""torch's DDP run on one machine (torchrun, torch_impl/launch.py) stopped every way a user or a
machine stops it, and run from another folder: tests/fixtures/stopping.py."""

import signal

import pytest

from tests.fixtures import bad_inputs, stopping

pytestmark = [pytest.mark.slow, pytest.mark.multi_device]
DDP = ["torch_impl", "--workload", "resnet18", "--gpus", "2"]
GPIPE = ["torch_impl", "--workload", "resnet50", "--gpus", "2", "--strategy", "gpipe"]


def test_a_stop_signal_ends_the_run_and_its_workers(tmp_path):
    """The launcher, torchrun (its rendezvous store is the launcher's) and the gloo workers
    listen on 127.0.0.1 only; `kill` ends them all, and so does a closed terminal: its SIGHUP
    is taken as SIGTERM is (common.signals.STOPS; tests/common/test_cli.py)."""
    stopping.check_stop_signal(DDP, tmp_path, signal.SIGTERM)


@pytest.mark.parametrize("strategy", ["gpipe", "1f1b"])
def test_a_stop_signal_ends_a_pipelined_run_and_its_workers(tmp_path, strategy):
    """resnet50's pipelines over torchrun, stopped once both stages' workers compute."""
    command = [*GPIPE[:-1], strategy]
    ready = stopping.torchrun_workers_listening(2)
    stopping.check_stop_signal(command, tmp_path, signal.SIGTERM, ready=ready)


@pytest.mark.parametrize("at_the_end", [False, True], ids=["training", "leaving"])
def test_a_launcher_killed_outright_takes_torchrun_and_the_workers_along(tmp_path, at_the_end):
    """Killed while the workers train, or as they leave (torchrun then waits at its exit barrier
    on the launcher's store): every process ends, and torchrun says nothing of the store gone."""
    stopping.check_killed_launcher(DDP, tmp_path, at_the_end)


@pytest.mark.parametrize("command", [DDP, GPIPE], ids=["ddp", "gpipe"])
def test_a_launcher_killed_while_torchrun_starts_takes_it_along(tmp_path, command):
    stopping.check_killed_starting(command, tmp_path)


def test_paths_mean_the_same_from_another_folder(tmp_path):
    stopping.check_another_folder(DDP, tmp_path)


def test_a_full_disk_at_the_record_is_one_line_from_every_rank(tmp_path):
    stopping.check_full_disk(DDP, tmp_path, bad_inputs.FIRST_RECORD + "\n")


def test_a_worker_stopped_while_it_trains_ends_the_run_in_one_line(tmp_path):
    stopping.check_stopped_worker(DDP, tmp_path, "LOCAL_RANK=1")


def test_a_worker_held_a_moment_is_no_fault(tmp_path):
    """Stopped 4 s, then continued, under --peer-timeout: the run ends well."""
    stopping.check_paused_worker(DDP, tmp_path, "LOCAL_RANK=1")


def test_a_worker_in_a_tracers_stop_is_no_fault(tmp_path):
    """strace stops its tracee at each system call, gdb at a breakpoint (state t): held so 4 s,
    the run ends well."""
    stopping.check_paused_worker(DDP, tmp_path, "LOCAL_RANK=1", tracer=True)


def test_steps_longer_than_the_peer_timeout_end_well(tmp_path):
    """The watchdog bounds liveness, not speed: a step of 3 s past a bound of 2 s."""
    stopping.check_slow_steps(DDP, tmp_path)
