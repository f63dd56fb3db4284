"""MXNet's kvstore dist_sync run on one machine (the scheduler, a server and two workers that
mxnet_impl/launch.py starts) stopped every way a user or a machine stops it, and run from
another folder: tests/fixtures/stopping.py."""

import signal

import pytest

from tests.fixtures import bad_inputs, stopping

pytestmark = [pytest.mark.slow, pytest.mark.multi_device]
DIST = ["mxnet_impl", "--workload", "resnet18", "--gpus", "2", "--strategy", "dist"]


def test_a_stop_signal_ends_the_run_and_every_process_it_started(tmp_path):
    """SIGTERM to the launcher; a closed terminal's SIGHUP is taken as SIGTERM is
    (common.signals.STOPS; tests/common/test_cli.py)."""
    stopping.check_stop_signal(DIST, tmp_path, signal.SIGTERM)


def test_a_launcher_killed_outright_takes_its_processes_along(tmp_path):
    stopping.check_killed_launcher(DIST, tmp_path)


def test_a_launcher_killed_while_its_processes_start_takes_them_along(tmp_path):
    stopping.check_killed_starting(DIST, tmp_path)


def test_paths_mean_the_same_from_another_folder(tmp_path):
    stopping.check_another_folder(DIST, tmp_path)


def test_a_full_disk_at_the_record_is_one_line_from_every_worker(tmp_path):
    stopping.check_full_disk(DIST, tmp_path, bad_inputs.FIRST_RECORD + "\n")


def test_a_worker_stopped_while_it_trains_ends_the_run_in_one_line(tmp_path):
    stopping.check_stopped_worker(DIST, tmp_path, "DMLC_ROLE=worker")


def test_a_worker_stopped_while_it_starts_ends_the_run_in_one_line_naming_it(tmp_path):
    """Stopped before it joined the kvstore: the line names the stopped worker, not a timeout."""
    stopping.check_stopped_worker(DIST, tmp_path, "DMLC_ROLE=worker", training=False)


def test_a_worker_held_a_moment_is_no_fault(tmp_path):
    """Stopped 4 s, then continued, under --peer-timeout: the run ends well."""
    stopping.check_paused_worker(DIST, tmp_path, "DMLC_ROLE=worker")


def test_a_worker_in_a_tracers_stop_is_no_fault(tmp_path):
    """strace stops its tracee at each system call, gdb at a breakpoint (state t): held so 4 s,
    the run ends well."""
    stopping.check_paused_worker(DIST, tmp_path, "DMLC_ROLE=worker", tracer=True)


def test_steps_longer_than_the_peer_timeout_end_well(tmp_path):
    """The watchdog bounds liveness, not speed: a step of 3 s past a bound of 2 s."""
    stopping.check_slow_steps(DIST, tmp_path)
