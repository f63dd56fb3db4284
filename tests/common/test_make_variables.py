"""What a user gives make never runs as shell text (the Makefile's checks at its top): a value
that make writes into a recipe is one valid word (or list of words), else refused in one line
as the Makefile is read, before anything runs; `make -n` too, which runs the lines that call
$(MAKE). Each case plants a command that would create a marker file. `make -n` and a refused
`make` need no environments: these run in a second."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The Makefile's settings, and make's own state when this suite runs under `make test`.
CLEARED = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "FRAMEWORK", "WORKLOAD", "ISA", "NUMERICS_ISAS")
CLEARED += ("VENV", "PYTHON", "UV", "UV_VERSION", "GPU_PYTHON", "PIP_FLAGS", "UPGRADE")


def make(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in CLEARED}
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=ROOT,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def refused(out: subprocess.CompletedProcess, name: str) -> None:
    """make stopped as it read the Makefile: exit 2, one line of make's naming `name`."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stdout + out.stderr
    assert lines[0].startswith("Makefile:") and name in lines[0] and "Stop." in lines[0], lines
    assert out.stdout == "", out.stdout


# (target, variable, value with `{mark}` where the planted command writes)
HOSTILE = [
    ("info", "FRAMEWORK", "torch ; do touch {mark} ; done ; for f in torch"),
    ("bench", "FRAMEWORK", "torch ; touch {mark} ; exit 0 ; x"),
    ("bench", "FRAMEWORK", "torch;touch {mark}"),
    ("ceiling", "WORKLOAD", "lenet ; touch {mark} ; x"),
    ("compare", "WORKLOAD", "lenet;touch {mark}"),
    ("mutants", "ISA", "AVX2 ; touch {mark}"),
    ("test", "ISA", "AVX2;touch {mark}"),
    ("numerics", "NUMERICS_ISAS", "AVX2 ; touch {mark} ; :"),
    ("setup", "VENV", ".venv;touch {mark}"),
    ("info", "VENV", ".venv/x ; touch {mark} ; :"),
    ("setup", "PYTHON", "python3 ; touch {mark} ; :"),
    ("lock-base", "UV", "uv;touch {mark};uv"),
    ("test-gpu", "GPU_PYTHON", "python3;touch {mark};python3"),
    ("setup", "PIP_FLAGS", "--quiet ; touch {mark} ; :"),
    ("setup", "UV_VERSION", "0.13.9;touch {mark}"),
    ("lock-base", "UPGRADE", "1;touch {mark}"),
    ("bench", "MAKE", "touch {mark};make"),
    ("info", "ARGS", "$(shell touch {mark})"),  # make expands a command line's value
    ("report", "RESULTS", "$(shell touch {mark})"),
]


@pytest.mark.parametrize(("target", "name", "value"), HOSTILE)
def test_a_value_that_is_not_one_valid_word_is_refused_before_anything_runs(
    tmp_path, target, name, value
):
    mark = tmp_path / "ran"
    args = [target, f"{name}={value.format(mark=mark)}"]
    if target == "bench" and name != "FRAMEWORK":
        args.append("FRAMEWORK=torch")
    refused(make("-n", *args), name)
    assert not mark.exists()


def test_the_issues_commands_run_nothing_without_n(tmp_path):
    """`make info` and `make bench` themselves, as the user typed them: nothing runs."""
    mark = tmp_path / "ran"
    refused(make("info", f"FRAMEWORK=torch ; do touch {mark} ; done ; for f in torch"), "FRAMEWORK")
    refused(make("-n", "bench", f"FRAMEWORK=torch ; touch {mark} ; exit 0 ; x"), "FRAMEWORK")
    assert not mark.exists()


def test_a_value_from_the_environment_is_checked_as_well(tmp_path):
    mark = tmp_path / "ran"
    refused(make("-n", "info", env={"FRAMEWORK": f"jax;touch {mark}"}), "FRAMEWORK")
    refused(make("-n", "setup", env={"PYTHON": f"$(shell touch {mark})"}), "PYTHON")
    assert not mark.exists()


def test_a_pattern_is_not_a_framework():
    """`filter` takes `%` as a pattern: FRAMEWORK=% once matched all three."""
    refused(make("-n", "setup", "FRAMEWORK=%"), "FRAMEWORK")
    refused(make("-n", "bench", "FRAMEWORK=torch", "WORKLOAD=%"), "WORKLOAD")


@pytest.mark.parametrize(
    ("target", "name"),
    [("test", "READY"), ("numerics", "ISA_CAP"), ("test", "TIER_test"), ("lock-base", "PYTHONS")],
)
def test_the_makefiles_own_recipe_pieces_are_not_replaced(tmp_path, target, name):
    mark = tmp_path / "ran"
    out = make("-n", target, f"{name}=touch {mark}")
    assert out.returncode == 0 and str(mark) not in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["numerics", "NUMERICS_ISAS=AVX2", "FRAMEWORK=mxnet"],
        ["mutants", "ISA=AVX2"],
        ["setup", "PYTHON=/usr/bin/python3.11", "VENV=/tmp/venvs", "UV=uv", "PIP_FLAGS=-q -U"],
        ["lock-base", "UPGRADE=1", "UV_VERSION=0.13.9"],
        ["test-gpu", "GPU_PYTHON=python3", "MAKE=make"],
    ],
)
def test_valid_values_are_taken(args):
    out = make("-n", *args)
    assert out.returncode == 0 and not out.stderr, out.stdout + out.stderr


def test_a_valid_framework_and_workload_reach_the_command():
    out = make("-n", "bench", "FRAMEWORK=jax", "WORKLOAD=lenet")
    assert out.returncode == 0, out.stdout + out.stderr
    assert ".venv/jax/bin/python -m jax_impl --workload $w" in out.stdout
    assert "for w in lenet; do" in out.stdout


def test_make_collectives_gives_its_defaults_to_the_command():
    """RANKS and COLLECTIVES_PRESET reach the command as environment, as every list does:
    unexported, `make collectives` ran `--ranks` with none and `--preset ''`."""
    show = 'show-env: ; @echo "$$RANKS|$$COLLECTIVES_PRESET"'
    out = make("-s", "--eval", show, "show-env")
    assert out.stdout.strip() == "2 4 8|cpu", out.stdout + out.stderr


def test_make_collectives_passes_its_args_as_words_not_shell_text():
    """COLLECTIVES_ARGS (a --peer-timeout, say) reaches cluster.allreduce as its own words."""
    out = make("-n", "collectives", "COLLECTIVES_ARGS=--peer-timeout 120")
    assert "$COLLECTIVES_ARGS" in out.stdout, out.stdout + out.stderr
    show = 'show-env: ; @echo "$$COLLECTIVES_ARGS"'
    out = make("-s", "--eval", show, "show-env", "COLLECTIVES_ARGS=--peer-timeout 120")
    assert out.stdout.strip() == "--peer-timeout 120", out.stdout + out.stderr
