"""Several machines ("nothing lost, nothing hangs"): the project command documented in
torch_impl/launch.py, run as written there (read from the docstring, HOST set to 127.0.0.1,
each "node" a process of this machine): a busy port and a missing node end in one line within
their bound, two nodes train and write one record, Ctrl-C stops every process."""

import ast
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common import cli, supervise
from tests.fixtures import interrupt, numerics
from torch_impl import guard, launch

ROOT = Path(__file__).resolve().parents[2]
DOC = ast.get_docstring(ast.parse((ROOT / "torch_impl" / "launch.py").read_text()))


def replace(text: str, old: str, new: str) -> str:
    assert old in text, f"the docstring no longer says {old!r}: update this test"
    return text.replace(old, new)


def block(start: str) -> str:
    """The docstring's command that begins with `start`, continuation lines joined."""
    text = DOC.split(f"\n  {start}", 1)[1].split("\n\n", 1)[0]
    return start + text.replace("\\\n", " ")


def documented_command(port: int, rank: int, results: Path, timeout: int | None) -> list[str]:
    """Node `rank`'s command of the docstring, on 127.0.0.1:port with one CPU process."""
    text = block("python -m torch_impl --workload resnet18")
    bound = f"--rdzv-timeout {timeout}" if timeout else ""
    for old, new in [
        ("HOST:29500", f"127.0.0.1:{port}"),
        ("--node-rank R", f"--node-rank {rank}"),
        ("--gpus G", "--gpus 1"),
        ("[--rdzv-timeout 300]", bound),
        ("[--preset ...] [--results ...]", f"--preset smoke --results {results}"),
    ]:
        text = replace(text, old, new)
    argv = shlex.split(text)
    return [sys.executable, *argv[1:], "--platform", "cpu", "--no-progress"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(cmd: list[str]) -> subprocess.Popen:
    """One "node": its command as a terminal starts it (interrupt.py); two share 2 cores."""
    return interrupt.start(cmd, {"OMP_NUM_THREADS": "1"})


def ends_in_one_line(proc: subprocess.Popen, timeout: float) -> tuple[str, float]:
    """Wait for `proc` (at most `timeout` s); it must fail with exit 2 and no traceback.
    Returns its last stderr line and the seconds it took."""
    begun = time.monotonic()
    _, err = proc.communicate(timeout=timeout)
    took = time.monotonic() - begun
    assert proc.returncode == cli.EXIT_BAD_INPUT, err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1], took


def test_the_documented_torchrun_commands_are_what_the_launcher_runs():
    """The docstring's two torchrun commands, one machine's and a node's of several, hold the
    options launch.torchrun_command gives torchrun (guard.py adds its own around them)."""
    starts = DOC.split("\n  python -m torch.distributed.run")[1:]
    one, several = (" ".join(t.split("\n\n", 1)[0].replace("\\\n", " ").split()) for t in starts)
    nodes = launch.Nodes(2, 0, "HOST:29500", cli.RDZV_TIMEOUT_S)
    for text, cmd in [
        (one, launch.torchrun_command(["--workload"], "N")),
        (several, launch.torchrun_command(["..."], "G", nodes)),
    ]:
        options = " ".join(cmd[3:])  # after `python -m torch.distributed.run`
        assert options in text, f"the docstring says {text!r}, the launcher {options!r}"


def test_the_timeout_line_names_the_nodes_waited_for():
    line = launch.Nodes(3, 1, "h:1", 9).timed_out()
    assert line.startswith("one of nodes 0, 2 did not join the rendezvous at h:1 within 9 s")
    assert "(this is node 1 of 3)" in line and "--node-rank (0 to 2)" in line
    assert launch.Nodes(2, 1, "h:1", 9).timed_out().startswith("node 0 did not join")


def test_a_busy_port_on_node_0_is_one_line_before_torchrun_starts(tmp_path):
    results = tmp_path / "r.jsonl"
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        proc = start(documented_command(port, 0, results, None))
        last, took = ends_in_one_line(proc, timeout=120)
    assert last == (
        f"error: the rendezvous port 127.0.0.1:{port} is in use by another program; choose "
        "another --rdzv-endpoint port, the same on every node"
    )
    assert took < 30  # the imports; no wait
    assert not results.exists()


@pytest.mark.slow
@pytest.mark.multi_device
@pytest.mark.parametrize("rank", [0, 1])
def test_a_node_alone_ends_after_rdzv_timeout_naming_the_other(tmp_path, rank):
    """Node 0 alone waits for node 1; node 1 alone connects to a port that another program
    holds (torch 2.15 alone would wait forever there)."""
    results = tmp_path / "r.jsonl"
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1] if rank == 1 else free_port()
        proc = start(documented_command(port, rank, results, timeout=5))
        last, took = ends_in_one_line(proc, timeout=120)
    assert last.startswith(
        f"error: node {1 - rank} did not join the rendezvous at 127.0.0.1:{port} within 5 s "
        f"(this is node {rank} of 2): start the same command on every node"
    )
    assert 5 <= took < 60  # 5 s after torchrun started, and the imports
    assert not results.exists()


@pytest.mark.slow
@pytest.mark.multi_device
def test_two_nodes_on_localhost_match_one_node(tmp_path, smoke_ddp):
    """Two nodes of one process each: one record, from rank 0, for a world of 2."""
    path, port = tmp_path / "r.jsonl", free_port()
    procs = [start(documented_command(port, r, path, timeout=120)) for r in (1, 0)]
    logs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), logs
    (line,) = path.read_text().splitlines()
    rec = json.loads(line)
    assert rec["extra"]["nnodes"] == 2 and rec["extra"]["world_size"] == 2
    one = smoke_ddp[1]
    assert rec["devices"] == 2 and rec["batch_size"] == one["batch_size"]
    assert sum(out.count("test acc:") for out, _ in logs) == 1  # only rank 0 reports
    # The same ranks, kernels and thread count (OMP_NUM_THREADS=1 in both): the same float32
    # computation, so the same losses (rule 3 allows for the order of the host-side sums).
    limit = numerics.reordered_sum_limit(rec["steps_timed"] or 1)
    numerics.report(
        "torch resnet18 2 nodes vs 1",
        numerics.rel_error(rec["train_loss"], one["train_loss"]),
        limit,
    )
    assert rec["test_acc"] == one["test_acc"]


def _processes_of(marker: str, workers_only=False):
    """The torchruns and workers of the run whose results path is `marker` (not the
    launchers); a worker is `python -m torch_impl` in torchrun's environment."""
    workers = interrupt.workers_of(marker, b"TORCHELASTIC_RUN_ID")
    torchruns = [] if workers_only else interrupt.processes_of(marker, (b"torch_impl.guard",))
    return torchruns + workers


@pytest.mark.slow
@pytest.mark.multi_device
def test_ctrl_c_stops_every_process_of_the_node(tmp_path):
    """Ctrl-C on node 0 while both nodes train: exit 130, and no torchrun or worker of it
    left; node 1 then fails with a line of its own rather than waiting."""
    path, port = tmp_path / "r.jsonl", free_port()
    # Epochs enough to be still training at the Ctrl-C (the smoke preset's one ends in seconds:
    # a run that had finished would exit 0)
    long = ["--epochs", "1000"]
    procs = [start(documented_command(port, r, path, timeout=120) + long) for r in (0, 1)]
    try:
        deadline = time.monotonic() + 120
        while len(_processes_of(str(path), True)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_processes_of(str(path), True)) == 2, "the workers never started"
        procs[0].send_signal(signal.SIGINT)
        _, err = procs[0].communicate(timeout=90)
        assert procs[0].returncode == cli.EXIT_INTERRUPTED, err
        assert err.strip().splitlines()[-1] == "interrupted; no record written"
        _, err = procs[1].communicate(timeout=120)
        assert procs[1].returncode != 0 and err.strip().splitlines()[-1].startswith("error: ")
    finally:  # Ctrl-C, then SIGKILL: a launcher killed outright would leave its torchrun
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.communicate(timeout=60)
            p.kill()
    time.sleep(1)  # the last ones reaped
    assert _processes_of(str(path)) == []
    assert not path.exists()


def test_workers_left_by_torchrun_are_killed_and_only_they(tmp_path):
    """supervise.kill_noted: a worker (guard.worker_main noted its pid) that outlived torchrun
    is killed; a process whose environment does not name the same file is left alone."""
    pids = tmp_path / "pids"
    code = "from torch_impl import guard; import time; guard.worker_main(lambda: time.sleep(60))"
    env = {**os.environ, "PYTHONPATH": str(ROOT), supervise.PIDS_FILE_ENV: str(pids)}
    worker = subprocess.Popen([sys.executable, "-c", code], env=env)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while not (pids.is_file() and pids.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        with open(pids, "a") as f:
            f.write(f"{other.pid}\n")  # a pid reused by another program: not to be killed
        supervise.kill_noted(pids)
        assert worker.wait(timeout=10) == -signal.SIGKILL
        assert other.poll() is None
    finally:
        for p in (worker, other):
            p.kill()
            p.wait(timeout=10)


class Exited(Exception):
    """os._exit, caught: the code a worker would have ended with."""


@pytest.mark.parametrize(
    ("raised", "code", "left"),
    [
        (None, 0, ""),
        (cli.config.ConfigError("bad --lr"), 2, "2 error: bad --lr\n"),
        (cli.training.Diverged(1, float("nan")), cli.EXIT_DIVERGED, "4 error: training diverged"),
        (KeyboardInterrupt(), cli.EXIT_INTERRUPTED, ""),
    ],
)
def test_a_worker_ends_with_exit_worker_and_its_code(monkeypatch, tmp_path, raised, code, left):
    """worker_main ends every worker, well or with a user error or Ctrl-C, through exit_worker:
    os._exit, past the interpreter's shutdown, where gloo's threads abort a process."""
    error_file = tmp_path / "errors"
    monkeypatch.setenv(supervise.ERROR_FILE_ENV, str(error_file))
    monkeypatch.delenv(supervise.PIDS_FILE_ENV, raising=False)

    def exit_(c):
        raise Exited(c)

    def entry():
        if raised is not None:
            raise raised

    monkeypatch.setattr(guard.os, "_exit", exit_)
    with pytest.raises(Exited) as e:
        guard.worker_main(entry)
    assert e.value.args == (code,)
    assert left in (error_file.read_text() if error_file.exists() else "")


def test_a_bug_in_a_worker_keeps_its_traceback(monkeypatch):
    monkeypatch.setattr(guard.os, "_exit", lambda c: pytest.fail("a bug must not exit quietly"))
    with pytest.raises(ZeroDivisionError):
        guard.worker_main(lambda: 1 / 0)


def test_exit_worker_flushes_what_the_worker_printed():
    """Block-buffered stdout (a pipe, as under torchrun): os._exit alone would drop it."""
    code = "from torch_impl import guard; print('record written'); guard.exit_worker(3)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONUNBUFFERED", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 3 and out.stdout == "record written\n"


@pytest.mark.slow
@pytest.mark.multi_device
def test_nodes_given_different_counts_say_so(tmp_path):
    """Node 0 with --nnodes 2, node 1 with --nnodes 3: torchrun's rendezvous never completes,
    and each node, both of which joined, would blame a node that did not come. Each says the
    counts instead, in one line, within the rendezvous timeout and the imports."""
    port, results = free_port(), tmp_path / "r.jsonl"
    cmds = [documented_command(port, rank, results, timeout=10) for rank in (0, 1)]
    cmds[1][cmds[1].index("--nnodes") + 1] = "3"
    begun, procs = time.monotonic(), [start(cmd) for cmd in cmds]
    try:
        lasts = [ends_in_one_line(proc, timeout=90) for proc in procs]
        took = time.monotonic() - begun
    finally:
        for proc in procs:
            proc.kill()
    at = f"the rendezvous at 127.0.0.1:{port}"
    assert [last for last, _ in lasts] == [
        f"error: node 1 joined {at} with --nnodes 3, this node (node 0) with --nnodes 2: give "
        "every node the same --nnodes",
        f"error: node 0 joined {at} with --nnodes 2, this node (node 1) with --nnodes 3: give "
        "every node the same --nnodes",
    ]
    assert took < 60, took  # the rendezvous timeout, 10 s, after the imports
    print(f"both ended {took:.1f} s after they started")
    assert not results.exists()
