"""The multi-node torchrun command documented in torch_impl/resnet18.py, run as written there
(read from the docstring, HOST set to 127.0.0.1): its port check, its join timeout, and what a
busy port does (torch 2.15 waits forever; the docstring says so and how to check first)."""

import ast
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ast.get_docstring(ast.parse((ROOT / "torch_impl" / "resnet18.py").read_text()))


def replace(text: str, old: str, new: str) -> str:
    assert old in text, f"the docstring no longer says {old!r}: update this test"
    return text.replace(old, new)


def documented_command(port: int, results: Path, join_timeout: int) -> list[str]:
    """Node 0's torchrun command of the docstring, on 127.0.0.1:port with one CPU process."""
    text = DOC.split("\n  python -m torch.distributed.run", 1)[1].split("\n\n", 1)[0]
    text = "python -m torch.distributed.run" + text.replace("\\\n", " ")
    for old, new in [
        ("HOST:29500", f"127.0.0.1:{port}"),
        ("--node-rank=R", "--node-rank=0"),
        ("--nproc-per-node=G", "--nproc-per-node=1"),
        ("--gpus G", "--gpus 1"),
        ("join_timeout=300", f"join_timeout={join_timeout}"),
        ("[--preset ...] [--results ...]", f"--preset smoke --results {results}"),
    ]:
        text = replace(text, old, new)
    argv = shlex.split(text)
    return [sys.executable, *argv[1:], "--platform", "cpu", "--no-progress"]


def port_check(port: int) -> subprocess.CompletedProcess:
    """The docstring's check of the port, run on this machine."""
    line = DOC.split('`python -c "', 1)[1].split('"`', 1)[0]
    code = replace(line, "29500", str(port))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_documented_port_check_finds_a_taken_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = port_check(port)
        assert out.returncode != 0 and "Address already in use" in out.stderr
    assert port_check(port).returncode == 0


@pytest.mark.slow
@pytest.mark.multi_device
def test_documented_command_without_the_other_node_ends_after_join_timeout(tmp_path):
    results = tmp_path / "r.jsonl"
    cmd = documented_command(free_port(), results, join_timeout=5)
    start = time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert time.monotonic() - start < 60  # 5 s, the imports and torchrun's own polling
    assert out.returncode != 0 and "RendezvousTimeoutError" in out.stderr.splitlines()[-1]
    assert not results.exists()


@pytest.mark.slow
@pytest.mark.multi_device
def test_documented_command_on_a_busy_port_waits_without_a_word(tmp_path):
    """What the docstring says of a busy port, kept true: no timeout ends it. When this fails
    (torchrun ended by itself), torch bounds the wait now: update the docstring."""
    results = tmp_path / "r.jsonl"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cmd = documented_command(taken.getsockname()[1], results, join_timeout=5)
        cmd[cmd.index("--rdzv-conf=join_timeout=5,read_timeout=60")] = (
            "--rdzv-conf=join_timeout=5,read_timeout=5"
        )
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=20)  # four times both timeouts, and still waiting
        finally:
            proc.kill()  # stuck in the rendezvous: it has started no worker
            _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err and "Error" not in err
    assert not results.exists()
