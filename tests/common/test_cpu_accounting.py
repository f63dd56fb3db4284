"""tools/cpu_accounting.py: process accounting's records attributed to suites and tests."""

from tools import cpu_accounting


def _acct(name, pid, ppid, user_s, sys_s=0.0):
    """A line as dump-acct prints it (CPU in acct v3's ticks)."""
    user, system = user_s * cpu_accounting.TICKS_PER_S, sys_s * cpu_accounting.TICKS_PER_S
    fields = [name, "v3", f"{user:.2f}", f"{system:.2f}", "1.00", "0", "0", "100.00", "0.00"]
    return "|".join([*fields, str(pid), str(ppid), "", "0", "__", "Fri Nov 27 23:16:23 2026"])


ACCT = "\n".join(
    [
        _acct("make", 10, 1, 0.0),
        _acct("python", 11, 10, 1.0),  # the suite's pytest
        _acct("python", 12, 11, 4.0, 1.0),  # an xdist worker: the in-process tests
        _acct("python", 13, 12, 3.0),  # a run a test started
        _acct("g++", 14, 13, 2.0),  # ... and what that run started
        _acct("cc1plus", 15, 12, 4.0),  # a compiler the worker itself started
    ]
)
STARTS = "\n".join(
    [
        "11\t\t-m -q -n 2 tests/common",
        "12\t\t-c import sys;exec(eval(sys.stdin.readline()))",
        "13\ttests/common/test_x.py::test_a\t-m torch_impl --gpus 2",
    ]
)


def test_cpu_goes_to_the_suite_and_the_test_that_started_it():
    found = cpu_accounting.attribute(
        cpu_accounting.read_acct(ACCT), cpu_accounting.read_starts(STARTS)
    )
    assert dict(found["suites"]["-m -q -n 2 tests/common"]) == {"own": 10.0, "started": 5.0}
    assert dict(found["tests"]) == {"tests/common/test_x.py::test_a": 5.0}
    assert found["names"]["python"] == 9.0 and found["names"]["cc1plus"] == 4.0
    text = cpu_accounting.report(found)
    assert text.startswith("CPU s in all: 15") and "tests/common/test_x.py::test_a" in text


def test_without_root_or_acct_it_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert cpu_accounting.main(["true"]) == 2
    assert capsys.readouterr().err.startswith("error: needs root")
