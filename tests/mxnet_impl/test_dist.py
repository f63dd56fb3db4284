"""resnet18's `dist` strategy (kvstore dist_sync) and its launcher, mxnet_impl/launch.py: two
workers compute what one process with two contexts does; a worker that dies, a busy port and a
missing peer each end the run in bounded time with one line."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from common import cli, signals
from mxnet_impl import guard, launch
from mxnet_impl.__main__ import load
from tests.fixtures import numerics, runs, stopping
from tests.mxnet_impl import dist_steps

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.multi_device


@pytest.mark.numerics
@pytest.mark.slow
def test_two_workers_equal_one_process_with_two_contexts(tmp_path):
    """Rule 1 (tests/fixtures/numerics.py): the same mathematics, so in float64 they agree to
    2**-24. dist_sync carries float64 as it is (its servers sum in the pushed dtype), and each
    worker updates its own copy with the same sgd_update as the one process. The difference
    that remains lies in the conv biases, which start at 0 and whose gradients are sums that
    nearly cancel (float64 reordering, amplified). Two steps, the second split unevenly (2 + 3):
    the global batch, not a worker's part, divides the summed gradient.

    A worker whose lazy weight pull is served after the first round's gradient sum has replaced
    the weights on the server ends far off (and the other, whose second step sums its
    gradients, off too): dist_sync pulls the weights before any step, and this test catches a
    run where that order is lost."""
    import mxnet as mx

    launch.dist_sync(
        [sys.executable, "-m", "tests.mxnet_impl.dist_steps", str(tmp_path)], 2, "dist_steps"
    )
    start, one = dist_steps.run(runs.world_of([mx.cpu(0), mx.cpu(1)]))  # context_list, alone
    one = {k: v[0] for k, v in one.items()}
    workers = [dict(np.load(tmp_path / f"worker{r}.npz")) for r in range(2)]
    # The steps moved the weights far more than the limit: the check can see a wrong step.
    assert numerics.rel_error(one, start) > 1e3 * numerics.SAME_MATH_LIMIT
    numerics.check_same_math("mxnet resnet18 2 dist_sync workers vs 2 contexts", workers[0], one)
    for k, v in workers[1].items():
        # Both workers apply the same update to the same pulled sum: equal to the last bit.
        np.testing.assert_array_equal(v, workers[0][k], err_msg=k)


def _cli(path, env=None, timeout=120):
    argv = ["--workload", "resnet18", "--strategy", "dist", "--gpus", "2", "--preset", "smoke"]
    argv += ["--platform", "cpu", "--no-progress", "--results", str(path)]
    return subprocess.run(
        [sys.executable, "-m", "mxnet_impl", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def _ours(marker: str):
    """(pid, is a worker) of every process whose command line holds `marker`."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes()
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue  # gone, or not ours to read
        if marker.encode() in cmd:
            yield int(proc.name), b"DMLC_ROLE=worker" in env


def _kill_a_worker(marker: str, after: float, killed: list) -> None:
    """SIGKILL (as the OOM killer would) a worker `after` seconds after it appears."""
    deadline, seen = time.monotonic() + 60, None
    while time.monotonic() < deadline:
        pids = [pid for pid, worker in _ours(marker) if worker]
        seen = seen or (time.monotonic() if pids else None)
        if pids and time.monotonic() - seen >= after:
            os.kill(pids[-1], signal.SIGKILL)
            killed.append(time.monotonic())
            return
        time.sleep(0.05)


@pytest.mark.slow
def test_a_dying_worker_ends_the_run_in_bounded_time(tmp_path):
    """A worker killed 3 s after it starts (in the join or the first steps, as the machine's
    load decides): ps-lite would keep the other worker waiting for it forever; the launcher
    stops every process at once and ends on one line, with no record and no process left."""
    path, killed = tmp_path / "r.jsonl", []
    thread = threading.Thread(target=_kill_a_worker, args=(str(path), 3, killed))
    thread.start()
    out = _cli(path)
    ended = time.monotonic()
    thread.join()
    assert killed, "no worker was seen"
    print(f"dist_sync run ended {ended - killed[0]:.1f} s after its worker was killed")
    assert out.returncode == 1, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: MXNet dist_sync training failed: the kvstore worker"), last
    assert "was killed by SIGKILL" in last and last.endswith("every other process was stopped")
    assert ended - killed[0] < 10 and not path.exists()
    assert not list(_ours(str(path))), "a process of the run was left behind"


LONE_WORKER = """
import os, signal, sys, time
from common import devices, signals
from mxnet_impl import launch

def run():
    with signals.as_interrupt():
        world = launch.join(devices.DevicePlan(1, "cpu", True))
        for pid in map(int, sys.argv[1:]):  # the scheduler and the server
            os.kill(pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGTERM)  # a stop that the main thread takes up
        time.sleep(60)
    return 0

sys.exit(signals.main(run))
"""


@pytest.mark.slow
def test_a_worker_stopped_after_its_peers_died_still_ends():
    """A worker's kvstore, freed, waits for the other workers at a barrier through the
    scheduler. A worker stopped after the scheduler and the server died (its launcher killed
    outright took them along) ends on the stop's line within the bound all the same, instead
    of waiting there forever."""
    env = guard.process_environment(launch.environment(1, 1, guard.port()), 1, 1)
    roles = ("scheduler", "server")
    peers = [subprocess.Popen(guard.SERVE, env={**env, "DMLC_ROLE": r}, cwd=ROOT) for r in roles]
    try:
        begun = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-c", LONE_WORKER, *(str(p.pid) for p in peers)],
            env={**env, "DMLC_ROLE": "worker"},
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
    finally:
        for peer in peers:
            peer.kill()
            peer.wait()
    assert out.returncode == 128 + signal.SIGTERM, out.stderr
    assert out.stderr.strip().splitlines()[-1] == signals.STOPPED, out.stderr
    assert time.monotonic() - begun < stopping.STOP_BOUND_S


def test_a_busy_port_is_one_line(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        start = time.monotonic()
        out = _cli(tmp_path / "r.jsonl", {"DMLC_PS_ROOT_PORT": str(port)}, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: port {port} of DMLC_PS_ROOT_PORT (the kvstore scheduler) cannot be used "
        "(Address already in use): another program holds it; choose a free port for every process"
    )
    assert time.monotonic() - start < 30 and not (tmp_path / "r.jsonl").exists()


def test_a_missing_peer_is_one_line_in_bounded_time(tmp_path):
    """A worker started by hand (DMLC_ROLE=worker) whose scheduler never comes: ps-lite alone
    would wait forever; MXNET_DIST_INIT_TIMEOUT ends it with one line."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free, and nobody will listen on it
    env = {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port)}
    env |= {"DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1", "MXNET_DIST_INIT_TIMEOUT": "2"}
    start = time.monotonic()
    out = _cli(tmp_path / "r.jsonl", env, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: kvstore dist_sync: the scheduler at 127.0.0.1:{port}, 1 server(s) and 2 "
        "worker(s) did not all join within 2 s (MXNET_DIST_INIT_TIMEOUT); start every one"
    )
    assert time.monotonic() - start < 30 and not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["--workload", "resnet18", "--gpus", "4", "--strategy", "dist"],
        ["--workload", "resnet18", "--gpus", "2", "--platform", "cpu", "--preset", "cpu"]
        + ["--epochs", "3", "--batch-size", "8", "--lr", "0.05", "--amp", "bf16"]
        + ["--results", "rel/r.jsonl", "--profile", "rel/p", "--no-progress"],
    ],
)
def test_the_worker_command_line_reproduces_the_launchers(argv, tmp_path, monkeypatch):
    """Each dist_sync worker runs `python -m mxnet_impl` with cli.worker_argv's command line
    (from ROOT): it means every option the user gave, paths resolved where the user stood."""
    monkeypatch.chdir(tmp_path)
    parser = cli.parser("mxnet")
    args = parser.parse_args(argv)
    again = parser.parse_args(cli.worker_argv(args, strategy="dist"))
    want = vars(args) | {"strategy": "dist"}
    want |= {k: str(tmp_path / want[k]) for k in ("results", "profile") if want[k]}
    assert vars(again) == want


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--ceiling", "--ceiling runs in one process on one device: drop it"),
        ("--compile", "--compile is for torch: MXNet's resnet18 and resnet50 are hybridized"),
    ],
)
def test_a_dist_run_refuses_ceiling_and_compile_before_any_process_starts(
    flag, message, tmp_path, capsys
):
    """The launcher refuses them in one line (common.cli), as a worker would; none starts."""
    argv = ["--workload", "resnet18", "--strategy", "dist", "--gpus", "2", "--platform", "cpu"]
    argv += ["--preset", "smoke", "--results", str(tmp_path / "r.jsonl"), flag]
    args = cli.parser("mxnet").parse_args(argv)
    assert flag in cli.worker_argv(args, strategy="dist")  # a worker would be told it too
    assert cli.run("mxnet", argv, load=load) == cli.EXIT_BAD_INPUT
    assert message in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "r.jsonl").exists()


def _node(rank: int, port: int, results: Path) -> subprocess.Popen:
    """One node of two on this machine, its scheduler (node 0's) at 127.0.0.1:`port`."""
    argv = [sys.executable, "-m", "mxnet_impl", "--workload", "resnet18", "--strategy", "dist"]
    argv += ["--gpus", "1", "--preset", "smoke", "--platform", "cpu", "--no-progress"]
    argv += ["--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", f"127.0.0.1:{port}"]
    argv += ["--results", str(results)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    return subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True, **pipes)


@pytest.mark.slow
def test_two_nodes_both_given_rank_0_each_end_in_one_line(tmp_path):
    """Both would start a scheduler on one port: ps-lite's second says only "bind failed", and
    the first waits for a node that will not come (--rdzv-timeout, 300 s). The second claimant
    is refused, naming the first; the first, told so, ends too; both within a minute."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = tmp_path / "r.jsonl"
    begun, procs = time.monotonic(), [_node(0, port, results) for _ in range(2)]
    try:
        errs = [p.communicate(timeout=90)[1] for p in procs]
        took = time.monotonic() - begun
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    lasts = sorted(e.strip().splitlines()[-1] for e in errs)
    assert sorted(p.returncode for p in procs) == [1, 2], errs
    assert lasts[0].startswith("error: MXNet dist_sync training: another node on this machine")
    assert lasts[0].endswith(
        "was also given --node-rank 0 and was refused: give each node its own --node-rank (0 to "
        "1); every process was stopped"
    )
    assert lasts[1].startswith("error: another node 0 (pid ")
    assert lasts[1].endswith(
        f"already hosts the kvstore scheduler at 127.0.0.1:{port} on this machine: give each "
        "node its own --node-rank (0 to 1)"
    )
    assert took < 60 and not any("Traceback" in e for e in errs), (took, errs)
    print(f"both ended {took:.1f} s after they started")
    assert not results.exists()
