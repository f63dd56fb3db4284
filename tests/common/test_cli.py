"""common.cli in process; the bad inputs a user types are in tests/fixtures/bad_inputs.py."""

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from common import checks, cli, config

ROOT = Path(__file__).resolve().parents[2]


def test_bad_setting_fails_before_the_framework_is_imported(capsys):
    argv = ["--workload", "resnet50", "--platform", "cpu", "--preset", "smoke"]
    load = lambda workload: pytest.fail("imported")  # noqa: E731
    assert cli.run("torch", [*argv, "--split-size", "99"], load=load) == 2
    assert "split_size must be between 1 and the batch size 4" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("framework", "workload", "platform", "message"),
    [
        ("jax", "lenet", "cpu", "lenet runs in float32 only"),
        ("mxnet", "resnet18", "gpu", "on a GPU use --amp off"),
        ("mxnet", "resnet18", "cpu", None),
        ("torch", "resnet18", "gpu", None),
        ("torch", "zero", "cpu", "zero runs in float32"),
    ],
)
def test_bf16_where_a_bf16_path_exists(framework, workload, platform, message):
    args = argparse.Namespace(workload=workload, amp="bf16")
    if message is None:
        checks.check_amp(framework, args, platform)
    else:
        with pytest.raises(config.ConfigError, match=message):
            checks.check_amp(framework, args, platform)


@pytest.mark.parametrize(
    ("framework", "workload", "strategy", "platform", "message"),
    [
        ("jax", "resnet18", "sharding", "cpu", None),
        ("jax", "resnet18", "pmap", "gpu", None),
        ("torch", "resnet18", None, "gpu", None),
        ("torch", "resnet18", "ddp", "cpu", "SyncBatchNorm runs on CUDA devices only"),
        ("torch", "resnet18", "dataparallel", "gpu", "SyncBatchNorm runs under DDP only"),
        ("mxnet", "resnet18", None, "cpu", "MXNet has no BatchNorm synchronised across dist"),
        ("jax", "lenet", None, "cpu", "--sync-bn is for resnet18"),
        ("torch", "resnet50", None, "gpu", "--sync-bn is for resnet18"),
    ],
)
def test_sync_bn_where_the_engine_has_one(framework, workload, strategy, platform, message):
    args = argparse.Namespace(workload=workload, strategy=strategy, sync_bn=True)
    if message is None:
        checks.check_sync_bn(framework, args, platform)
    else:
        with pytest.raises(config.ConfigError, match=message):
            checks.check_sync_bn(framework, args, platform)


@pytest.mark.parametrize(
    ("framework", "workload", "strategy", "message"),
    [
        ("jax", "resnet18", "shard_map", None),
        ("jax", "resnet18", "pmap", None),
        ("jax", "zero", "fsdp_explicit", None),
        ("jax", "resnet18", "sharding", "--unbucketed applies to JAX's explicit collectives"),
        ("jax", "zero", "fsdp", "--unbucketed applies to JAX's explicit collectives"),
        ("torch", "zero", "zero3", "--unbucketed applies to JAX's explicit collectives"),
        ("mxnet", "resnet18", "dist", "--unbucketed applies to JAX's explicit collectives"),
    ],
)
def test_unbucketed_where_a_strategy_packs_its_own_buckets(framework, workload, strategy, message):
    args = argparse.Namespace(workload=workload, strategy=strategy, unbucketed=True)
    if message is None:
        checks.check_unbucketed(framework, args)
    else:
        with pytest.raises(config.ConfigError, match=message):
            checks.check_unbucketed(framework, args)


@pytest.mark.parametrize(
    ("framework", "strategy", "engine"),
    [("torch", "zero2", "zero2"), ("jax", "fsdp", "fsdp"), ("mxnet", "server", "server")],
)
def test_zero_runs_its_sharded_strategies_over_several_machines(framework, strategy, engine):
    argv = ["--workload", "zero", "--strategy", strategy, "--nnodes", "2", "--node-rank", "1"]
    args = cli.parser(framework).parse_args([*argv, "--rdzv-endpoint", "10.0.0.1:29500"])
    checks.check_nodes(framework, args)
    assert args.strategy == engine
    args.strategy = "zero9"
    with pytest.raises(config.ConfigError, match="zero's strategies, and"):
        checks.check_nodes(framework, args)


@pytest.mark.parametrize(
    ("framework", "platform", "amp", "has_bf16", "noted"),
    [
        ("torch", "cpu", "bf16", False, True),
        ("jax", "cpu", "bf16", False, True),
        ("torch", "cpu", "bf16", True, False),  # bf16 arithmetic: it can pay
        ("torch", "gpu", "bf16", False, False),
        ("torch", "cpu", "off", False, False),
        ("mxnet", "cpu", "bf16", False, False),  # refused on AVX2 (use_bf16), emulated on AVX-512
    ],
)
def test_bf16_on_a_cpu_without_bf16_arithmetic_is_noted(
    monkeypatch, framework, platform, amp, has_bf16, noted
):
    monkeypatch.setattr(checks.devices, "cpu_has_bf16", lambda: has_bf16)
    note = checks.bf16_note(framework, argparse.Namespace(amp=amp), platform)
    assert (note is not None) is noted
    if noted:
        assert note.startswith("note: this CPU has no bf16 arithmetic") and "\n" not in note
        assert "measured" in note and "float32" in note


def test_a_stop_signal_ends_a_run_as_ctrl_c_does(capsys):
    """SIGTERM (kill, timeout, a scheduler) and SIGHUP (the terminal closed) raise where Ctrl-C
    does: one line, exit 128 + the signal's number, nothing recorded. (At their defaults, as at
    a terminal: under `nohup` SIGHUP is ignored, and stays so.)"""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        before = signal.signal(signum, signal.SIG_DFL)

        def load(workload, signum=signum):
            os.kill(os.getpid(), signum)
            time.sleep(5)  # the handler raises before this ends
            pytest.fail("the signal did not stop the run")

        argv = ["--workload", "resnet50", "--platform", "cpu", "--preset", "smoke"]
        assert cli.run("torch", argv, load=load) == 128 + signum
        assert capsys.readouterr().err.splitlines()[-1] == "interrupted; no record written"
        assert signal.getsignal(signum) is signal.SIG_DFL  # the run's handler is gone after it
        signal.signal(signum, before)


def test_an_ignored_hangup_stays_ignored():
    """`nohup make compare`: SIGHUP ignored when the run starts is left ignored."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with cli.signals.as_interrupt():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert callable(signal.getsignal(signal.SIGTERM))  # the run's handler
    finally:
        signal.signal(signal.SIGHUP, before)


def stopped_by_sigterm(code: str) -> subprocess.CompletedProcess:
    """`python -c code` run to its end, which SIGTERM's exit code must be."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    return done


def test_a_main_thread_stuck_in_native_code_is_ended_by_the_watchdog(tmp_path):
    """A process whose main thread never returns to Python after a stop signal (a collective
    waiting for a peer that is gone) still ends, with the line and 128 + the signal's number:
    the watchdog heard the signal and the handler never ran."""
    code = (
        "import os, signal, time\n"
        "from common import signals\n"
        "with signals.as_interrupt(grace=0.5):\n"
        "    signal.signal(signal.SIGTERM, lambda *a: None)  # as if its handler never ran\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(10)\n"
    )
    done = stopped_by_sigterm(code)
    assert done.stderr.strip() == "interrupted; no record written"


@pytest.mark.parametrize("also_stuck", [True, False], ids=["any-end", "not-stuck"])
@pytest.mark.parametrize("stuck", [False, True], ids=["stop-taken", "stuck"])
def test_a_goodbye_is_said_however_the_process_ends(stuck, also_stuck):
    """signals.on_leaving: the normal exit after a stop taken up says it, and the watchdog says
    it before it ends a process whose main thread is stuck, unless it is a goodbye that would
    wait for what the main thread is stuck in (MXNet's kvstore free)."""
    code = (
        "import os, signal, time\n"
        "from common import signals\n"
        f"signals.on_leaving(lambda: print('goodbye', flush=True), stuck={also_stuck})\n"
        "try:\n"
        "    with signals.as_interrupt(grace=0.5):\n"
        f"        if {stuck}:\n"
        "            signal.signal(signal.SIGTERM, lambda *a: None)  # its handler never runs\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(10)\n"
        "except KeyboardInterrupt:\n"
        "    raise SystemExit(143)\n"
    )
    done = stopped_by_sigterm(code)
    assert done.stdout.split() == ([] if stuck and not also_stuck else ["goodbye"])


def test_a_stop_taken_up_late_is_said_once():
    """A main thread back from native code after the grace takes its stop up while the
    watchdog, which gave up on it, says its goodbye: both come to say the line, and the
    process says it once."""
    code = (
        "import os, signal, sys, time\n"
        "from common import signals\n"
        "signals.on_leaving(lambda: time.sleep(1))  # the watchdog's goodbye takes a while\n"
        "def run():\n"
        "    with signals.as_interrupt(grace=0.2):\n"
        "        signal.signal(signal.SIGTERM, lambda *a: None)  # not taken up in time\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(0.6)  # the watchdog is in its goodbye\n"
        "        raise signals.Stopped(signal.SIGTERM)  # back from native code: taken up\n"
        "sys.exit(signals.main(run))\n"
    )
    done = stopped_by_sigterm(code)
    assert done.stderr == "interrupted; no record written\n"


def test_a_goodbye_asked_for_twice_is_said_once(monkeypatch):
    """A main thread back from native code while the watchdog says goodbye (a second goodbye
    would cancel the first) waits for it to be said, and says it no more."""
    monkeypatch.setattr(cli.signals, "_LEAVE", [])
    monkeypatch.setattr(cli.signals.atexit, "register", lambda leave: None)
    said = []
    cli.signals.on_leaving(lambda: (said.append("goodbye"), time.sleep(0.5)))
    (leave,) = cli.signals._LEAVE
    watchdog = threading.Thread(target=leave)
    watchdog.start()
    time.sleep(0.1)
    start = time.monotonic()
    leave()
    waited = time.monotonic() - start
    watchdog.join()
    assert said == ["goodbye"] and waited > 0.3


def test_worker_argv_reproduces_the_command_line_with_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["--workload", "resnet18", "--gpus", "2", "--results", "r.jsonl", "--ceiling"]
    args = cli.parser("torch").parse_args([*argv, "--epochs", "3", "--profile", "p"])
    again = cli.parser("torch").parse_args(cli.worker_argv(args, strategy="ddp"))
    want = {**vars(args), "strategy": "ddp"}
    want |= {"results": str(tmp_path / "r.jsonl"), "profile": str(tmp_path / "p")}
    assert vars(again) == want
