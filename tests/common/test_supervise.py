"""common/supervise.py: members that end together. The first failure ends the group on its own
line (or on how it ended), a worker's named before the processes that followed it; members that
all ended between two looks are still read; a check's reason, a deadline and the wait after the
first member finished each end it; stopping kills every member's session."""

import os
import subprocess
import sys
import time

import pytest

from common import supervise

PY = sys.executable


def member(group, name, code, line="", first=False, sleep=0.0):
    """A member that prints `line`, sleeps, and exits with `code`."""
    script = f"import sys, time; print({line!r}, flush=True); time.sleep({sleep}); sys.exit({code})"
    return group.start(name, [PY, "-c", script], first=first)


def waits_for(path) -> str:
    """A script's first lines: wait until `path` exists (a peer's signal that it is going)."""
    return f"import pathlib, time\nwhile not pathlib.Path({str(path)!r}).exists(): time.sleep(0.01)"


def test_members_that_all_ended_between_two_looks_are_still_read():
    """Every member may end before the first look (a worker failed, the scheduler then
    finished): the run must fail on the worker's line and code, never read as finished."""
    with supervise.Group("training") as group:
        member(group, "scheduler", 0)
        member(group, "server 0", 3, "server died")
        member(group, "worker 0", 2, "error: bad input", first=True)
        for m in group.members:
            m.popen.wait(30)
        with pytest.raises(supervise.Failed) as failed:
            group.watch()
    assert (failed.value.line, failed.value.code) == ("error: bad input", 2)


def test_what_others_say_after_a_member_failed_is_not_shown(tmp_path, capsys):
    """A member's peer dies and it prints its dying words (a traceback) before the watch looks:
    they are the failure's aftermath, which the group's one line says, and are not shown."""
    gone = tmp_path / "gone"
    wait = waits_for(gone)
    with supervise.Group("training") as group:
        survivor = group.start("node 0", [PY, "-c", f"{wait}\ntime.sleep(0.5)\nprint('Traceback')"])
        group.start("node 1", [PY, "-c", f"open({str(gone)!r}, 'w'); print('alive'); exit(1)"])
        survivor.popen.wait(30)
        survivor.tee.join(5)
    assert "Traceback" not in capsys.readouterr().err


def test_a_traceback_waits_for_the_peer_failure_it_follows(tmp_path, capsys):
    """A killed peer's connections close as it dies, before it can be reaped (or, under a
    launcher, before the launcher fails): the survivor's traceback can come first. It waits a
    moment for a peer's failure, and is not shown when one comes."""
    gone = tmp_path / "gone"
    wait = waits_for(gone)
    dying = (
        "print('Traceback (most recent call last):\\n  File x\\nConnectionResetError', flush=True)"
    )
    with supervise.Group("training") as group:
        survivor = group.start("node 0", [PY, "-c", f"{wait}\n{dying}\ntime.sleep(2)\nexit(1)"])
        group.start(
            "node 1", [PY, "-c", f"import time; open({str(gone)!r}, 'w'); time.sleep(0.3); exit(1)"]
        )
        survivor.popen.wait(30)
        survivor.tee.join(5)
    assert "Traceback" not in capsys.readouterr().err


def test_of_members_that_failed_between_two_looks_the_first_to_end_is_named(tmp_path):
    """Node 1 is killed and node 0, its peer gone, fails a moment later: by the next look both
    have ended, and the run names node 1, whatever the members' order."""
    gone = tmp_path / "gone"
    wait = waits_for(gone)
    with supervise.Group("training") as group:
        group.start("node 0", [PY, "-c", f"{wait}\ntime.sleep(0.3)\nexit(1)"])
        group.start("node 1", [PY, "-c", f"open({str(gone)!r}, 'w'); exit(9)"])
        for m in group.members:
            m.popen.wait(30)
        with pytest.raises(supervise.Failed) as failed:
            group.watch()
    assert "node 1 (pid" in failed.value.line


def test_a_member_without_an_error_line_is_named_with_how_it_ended():
    with supervise.Group("training") as group:
        member(group, "worker 0", 0, sleep=5)
        m = member(group, "server 0", 7, "last words")
        with pytest.raises(supervise.Failed) as failed:
            group.watch()
    assert failed.value.line == (
        f"error: training failed: server 0 (pid {m.popen.pid}) exited with code 7 (its last "
        "line: last words); every other process was stopped"
    )
    assert failed.value.code == 1
    assert all(m.popen.poll() is not None for m in group.members)  # the sleeper was stopped


def test_all_ending_well_returns():
    with supervise.Group("training") as group:
        member(group, "a", 0, "hello")
        member(group, "b", 0)
        group.watch()


@pytest.mark.parametrize(
    "kwargs, said",
    [
        ({"checks": [lambda: "node 1's link went down"]}, "error: run: node 1's link went down;"),
        ({"deadline": 0.5}, "error: run did not finish within 0 s; stopped"),
        ({"exit_wait": 0.5}, "error: run: slow did not exit within 0 s after the others"),
    ],
)
def test_checks_deadlines_and_late_members_end_the_group(kwargs, said):
    began = time.monotonic()
    with supervise.Group("run") as group:
        member(group, "quick", 0)
        member(group, "slow", 0, sleep=60)
        with pytest.raises(supervise.Failed) as failed:
            group.watch(**kwargs)
    assert failed.value.line.startswith(said) and time.monotonic() - began < 20


def test_stop_kills_what_members_started_in_their_sessions():
    """A member's own children (torchrun's workers, say) are in its session: killed with it."""
    grandchild = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print('up', flush=True)\n"
        "time.sleep(60)"
    )
    with supervise.Group("run") as group:
        m = group.start("parent", [PY, "-c", grandchild])
        while m.last[0] != "up":
            time.sleep(0.05)
        kids = subprocess.run(["pgrep", "-s", str(m.popen.pid)], capture_output=True, text=True)
        assert len(kids.stdout.split()) == 2
    end = time.monotonic() + 10  # SIGKILL is delivered, and the orphan reaped, in a moment
    while subprocess.run(["pgrep", "-s", str(m.popen.pid)], capture_output=True).returncode == 0:
        assert time.monotonic() < end, "a process of the member's session outlived the stop"
        time.sleep(0.1)


def test_stopped_processes_are_found_in_proc():
    proc = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    try:
        assert supervise.stopped([proc.pid]) == []
        proc.send_signal(19)  # SIGSTOP
        time.sleep(0.3)
        assert supervise.stopped([proc.pid, 999999999]) == [proc.pid]
    finally:
        proc.kill()
        proc.wait()


CLAIM = """
import sys, time
from common import supervise
from common.nodes import Nodes
Nodes(2, 0, sys.argv[1], 10).claim("kvstore scheduler")
print("held", flush=True)
while not (reason := supervise.WATCH_ALSO[0]()):
    time.sleep(0.05)
print(reason, flush=True)
"""


def test_a_second_node_0_on_one_machine_is_refused_and_the_first_told():
    """Two nodes here both given --node-rank 0 would start two schedulers on one port: the
    second is refused naming the first, and the first's groups (supervise.WATCH_ALSO) hear it."""
    from common import config
    from common.nodes import Nodes

    endpoint = "127.0.0.1:29999"  # claimed, never bound
    first = subprocess.Popen([PY, "-c", CLAIM, endpoint], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline() == "held\n"
        with pytest.raises(config.ConfigError) as refused:
            Nodes(2, 0, endpoint, 10).claim("kvstore scheduler")
        told = first.communicate(timeout=10)[0].strip()
    finally:
        first.kill()
    assert str(refused.value) == (
        f"another node 0 (pid {first.pid}) already hosts the kvstore scheduler at {endpoint} on "
        "this machine: give each node its own --node-rank (0 to 1)"
    )
    assert told == (
        f"another node on this machine (pid {os.getpid()}) was also given --node-rank 0 and was "
        "refused: give each node its own --node-rank (0 to 1)"
    )
