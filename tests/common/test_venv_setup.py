"""make setup's choice of Python (tools/venv.sh, the Makefile's setup part): a PYTHON given that
does not run (a pyenv shim of a version not installed) ends setup in one line, before anything
is installed; the default python3 keeps looking for a Python that runs."""

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIM = """#!/bin/sh
echo "pyenv: python3.13: command not found" >&2
echo >&2
echo "The \\`python3.13' command exists in these Python versions:" >&2
echo "  3.13.0" >&2
exit 127
"""


@pytest.fixture
def shim(tmp_path) -> Path:
    """A pyenv shim for a Python that is not installed: it exits 127 with pyenv's message."""
    path = tmp_path / "bin" / "python3.13"
    path.parent.mkdir()
    path.write_text(SHIM)
    path.chmod(0o755)
    return path


def run(cmd: list[str], tmp_path: Path, **env) -> subprocess.CompletedProcess:
    # --no-index: should the check ever let setup go on, it fails fast instead of downloading
    env = {**os.environ, "VENV": str(tmp_path / "venvs"), "PIP_FLAGS": "--no-index -q", **env}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def said(out: subprocess.CompletedProcess) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_venv_sh_refuses_a_python_given_that_does_not_run(tmp_path, shim):
    lock = tmp_path / "empty.txt"
    lock.write_text("")
    out = run(
        ["tools/venv.sh", "base", str(lock), "3.11", "3.12", "3.13"],
        tmp_path,
        PYTHON=str(shim),
        UV=str(tmp_path / "no-uv"),
    )
    assert out.returncode == 1
    assert said(out) == (
        f"error: PYTHON={shim}: it does not run (pyenv: python3.13: command not found); name a "
        "Python that runs (PYTHON=python3.11), or leave PYTHON out to use python3"
    )
    assert not (tmp_path / "venvs").exists()  # nothing made


def test_a_python_given_that_is_not_a_command_is_refused(tmp_path):
    out = run(["tools/venv.sh", "--check-python"], tmp_path, PYTHON="python3.99-not-here")
    assert out.returncode == 1
    assert said(out).startswith("error: PYTHON=python3.99-not-here: not a command on PATH; ")


@pytest.mark.parametrize("python", [None, "python3"])
def test_the_default_python3_is_not_held_to_it(tmp_path, python):
    """python3 is where setup starts looking: where it does not run, python3.X is looked for."""
    env = {"PATH": str(tmp_path / "bin")}  # no python3 at all here
    (tmp_path / "bin").mkdir()
    if python is not None:
        env["PYTHON"] = python
    out = run(["/bin/bash", "tools/venv.sh", "--check-python"], tmp_path, **env)
    assert out.returncode == 0 and not out.stderr


def test_make_setup_stops_before_installing_uv_with_it(tmp_path, shim):
    venvs = tmp_path / "venvs"
    make = ["make", "--no-print-directory", "setup", f"PYTHON={shim}", f"VENV={venvs}"]
    out = run([*make, "FRAMEWORK=jax"], tmp_path)
    assert out.returncode != 0
    # not make's own line (make[1] under another make, as in `make test`)
    ours = [x for x in out.stderr.splitlines() if not re.match(r"make(\[\d+\])?: \*\*\* ", x)]
    assert ours == [
        f"error: PYTHON={shim}: it does not run (pyenv: python3.13: command not found); name a "
        "Python that runs (PYTHON=python3.11), or leave PYTHON out to use python3"
    ]
    assert "installing uv" not in out.stdout and not venvs.exists()
