"""The cluster in one box (cluster/train.py, common/netns.py, common/supervise.py) with stand-in
nodes (tests/fixtures/fake_node.py: the frameworks' command line, a megabyte each way per
epoch, node 0's record and exit barrier): namespaces made and removed, the link's bytes counted
and its rate held, and every fault (a link down, a node killed, a node stopped, the cluster
itself stopped), in the middle of the run and in the exit barrier, ends every node within
seconds, with one line, no record, no process and no namespace left. The frameworks' own
engines in the same cluster: tests/<framework>_impl/test_cluster.py."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster import train as cluster
from common import netns, supervise
from tests.fixtures import interrupt

ROOT = Path(__file__).resolve().parents[2]
# One at a time under pytest-xdist (make test): a run removes the namespaces no live run owns,
# and counts the bytes of its own links; a second cluster beside it would share the cores.
pytestmark = pytest.mark.xdist_group("netns")
FAULT_BOUND_S = 60  # every node ends within this after a fault
KILLED_BOUND_S = 5  # a SIGKILLed cluster's namespaces are gone within this
cores = len(os.sched_getaffinity(0))


def can_make_namespaces() -> str | None:
    try:
        netns.check_can_make()
    except netns.NetnsError as e:
        return str(e)
    return None


needs_netns = pytest.mark.skipif(
    os.geteuid() != 0 or bool(can_make_namespaces()),
    reason=f"network namespaces cannot be made here: {can_make_namespaces()}",
)
needs_two_cores = pytest.mark.skipif(cores < 2, reason="two nodes need a core each")


@pytest.fixture
def fake_python(tmp_path):
    python = tmp_path / "python"
    node = ROOT / "tests" / "fixtures" / "fake_node.py"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{node}" "$@"\n')
    python.chmod(0o755)
    return python


def start(python, results, *more, nodes="1 2", link="unlimited"):
    """cluster.train with the stand-in nodes, its output in a pipe."""
    argv = ["--frameworks", "torch", "--nodes", *nodes.split(), "--links", link]
    argv += ["--preset", "smoke"]
    argv += ["--results", str(results), "--python", str(python), *more]
    return subprocess.Popen(
        [sys.executable, "-m", "cluster.train", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=interrupt.terminal_signals,
    )


def tagged(tag: str) -> list[str]:
    return [n for n in netns.existing() if n.startswith(f"{tag}-")]


def left_behind(pid: int) -> tuple[list[str], list[str]]:
    """The namespaces of the cluster `pid` still there, and any process left inside them."""
    names = [n for n in netns.existing() if n.startswith(f"{netns.PREFIX}{pid}-")]
    return names, [str(p) for n in names for p in supervise.netns_pids(n)]


@needs_netns
@needs_two_cores
def test_two_nodes_run_over_their_own_link_and_the_record_says_so(fake_python, tmp_path):
    results = tmp_path / "r.jsonl"
    proc = start(fake_python, results, link="100mbit")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert left_behind(proc.pid) == ([], [])
    recs = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["extra"]["nodes"] for r in recs] == [1, 2]  # the 1-node baseline first
    extra = recs[1]["extra"]
    assert extra["link"]["name"] == "100mbit" and extra["link"]["rate_bps"] == 100e6
    # the probe measured the rate tc set, within what TCP's headers take
    assert 85e6 < extra["link"]["measured_bps"] < 100e6
    counted = extra["link_bytes"]  # a megabyte each way per step, and TCP's headers
    assert counted["iface"] == netns.IFACE and counted["steps"] == 3
    assert all(1 << 20 <= counted[way] / 3 <= 1.1 * (1 << 20) for way in ("tx", "rx")), counted
    assert extra["cores_used"] == sorted(os.sched_getaffinity(0))[:2]
    assert "[node 1]" in out and "[2/2] ok" in out


def _switch(ns: str) -> str:
    return ns.rsplit("-", 1)[0] + "-sw"


# Node 1's namespace in; the bridge and the detached port keep every carrier up.
FAULTS = {
    "link": lambda ns: ["ip", "-n", ns, "link", "set", netns.IFACE, "down"],
    "kill": lambda ns: ["sh", "-c", f"kill -9 $(ip netns pids {ns})"],
    "stop": lambda ns: ["sh", "-c", f"kill -STOP $(ip netns pids {ns})"],
    "bridge": lambda ns: ["ip", "-n", _switch(ns), "link", "del", "br0"],
    "detach": lambda ns: ["ip", "-n", _switch(ns), "link", "set", "p1", "nomaster"],
}
SAID = {
    "link": "node 1's link went down",
    "kill": "node 1 (pid",
    "stop": "node 1 was stopped (SIGSTOP",
    "bridge": "node 1 has not reached node 0 (10.213.0.1) for 10 s",
    "detach": "node 1 has not reached node 0 (10.213.0.1) for 10 s",
}


# A detached port is found as a removed bridge is, after the same 10 s: the slow tier's.
FAULT_CASES = [
    pytest.param(f, marks=pytest.mark.slow) if f == "detach" else f for f in sorted(FAULTS)
]


@needs_netns
@needs_two_cores
@pytest.mark.parametrize("when", ["epoch 1/", "images/sec"])  # mid-run; in the exit barrier
@pytest.mark.parametrize("fault", FAULT_CASES)
def test_a_fault_on_one_node_ends_every_node_in_bounded_time(fake_python, tmp_path, fault, when):
    """A node stopped (SIGSTOP) is a fault once it stays so for --peer-timeout (5 s here)."""
    results = tmp_path / "r.jsonl"
    proc = start(fake_python, results, "--epochs", "3", "--peer-timeout", "5", nodes="2")
    seen = wait_for(proc, when)
    began = time.monotonic()
    subprocess.run(FAULTS[fault](f"{netns.PREFIX}{proc.pid}-n1"), check=True, timeout=30)
    out, _ = proc.communicate(timeout=FAULT_BOUND_S)
    took = time.monotonic() - began
    last = (seen + out).strip().splitlines()[-1]
    assert proc.returncode == 1 and SAID[fault] in last and last.startswith("error: "), seen + out
    assert took < FAULT_BOUND_S and "Traceback" not in seen + out
    assert left_behind(proc.pid) == ([], []) and not results.exists()


def wait_for(proc: subprocess.Popen, text: str, bound: float = 90) -> str:
    """The output up to the 2-node run's line holding `text`."""
    seen, end = "", time.monotonic() + bound
    while time.monotonic() < end:
        line = proc.stdout.readline()
        seen += line
        if text in line and "on 2 node(s)" in seen:
            return seen
    proc.kill()
    pytest.fail(f"never saw {text!r}:\n{seen}")


@needs_netns
@needs_two_cores
def test_a_node_stopped_for_less_than_the_peer_timeout_is_no_fault(fake_python, tmp_path):
    """A node stopped a moment (SIGSTOP, then SIGCONT: Ctrl-Z and fg, a debugger's look) holds
    its peers for that long, under their --peer-timeout: the run goes on and ends well."""
    results = tmp_path / "r.jsonl"
    proc = start(fake_python, results, "--epochs", "8", "--peer-timeout", "20", nodes="2")
    wait_for(proc, "epoch 1/")
    node = f"{netns.PREFIX}{proc.pid}-n1"
    subprocess.run(FAULTS["stop"](node), check=True, timeout=30)
    time.sleep(3)  # three of the supervisor's looks
    subprocess.run(["sh", "-c", f"kill -CONT $(ip netns pids {node})"], check=True, timeout=30)
    out, _ = proc.communicate(timeout=FAULT_BOUND_S)
    assert proc.returncode == 0, out
    assert len(results.read_text().splitlines()) == 1 and left_behind(proc.pid) == ([], [])


@needs_netns
@needs_two_cores
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_cluster_removes_every_namespace_and_process(fake_python, tmp_path, signum):
    proc = start(fake_python, tmp_path / "r.jsonl", nodes="2")
    wait_for(proc, "epoch 1/")
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=FAULT_BOUND_S)
    assert proc.returncode == 128 + signum, out
    assert out.strip().splitlines()[-1] == "interrupted; no record written"
    assert left_behind(proc.pid) == ([], [])
    assert not (tmp_path / "r.jsonl").exists()


@needs_netns
@needs_two_cores
def test_a_killed_cluster_takes_its_nodes_and_namespaces_along(fake_python, tmp_path):
    """SIGKILL leaves the command no moment to clean up: its janitor (netns.Janitor), a process
    of its own, removes the namespaces and what runs in them as the command goes."""
    proc = start(fake_python, tmp_path / "r.jsonl", nodes="2", link="unlimited")
    wait_for(proc, "epoch 1/")
    proc.kill()
    proc.wait()
    killed, end = time.monotonic(), time.monotonic() + KILLED_BOUND_S
    while left_behind(proc.pid) != ([], []) and time.monotonic() < end:
        time.sleep(0.1)
    assert left_behind(proc.pid) == ([], []), f"left {KILLED_BOUND_S} s after the kill"
    print(f"gone {time.monotonic() - killed:.2f} s after the kill")
    assert not (tmp_path / "r.jsonl").exists()


@needs_netns
def test_the_janitor_leaves_what_its_command_removed_and_what_it_never_made():
    """A network removed by its command leaves its janitor nothing to do, and it ends; a
    namespace of the same name made before (by someone else) is refused and never removed."""
    with netns.Network(1, tag=f"{netns.PREFIX}{os.getpid()}x") as net:
        janitor = net._janitor.proc
        assert sorted(tagged(net.tag)) == sorted(net.names())
    assert janitor.poll() == 0 and tagged(net.tag) == []
    theirs = netns.Network(1, tag=f"{netns.PREFIX}{os.getpid()}y")
    subprocess.run(["ip", "netns", "add", theirs.switch], check=True)
    try:
        with pytest.raises(netns.NetnsError), theirs:
            pass
        assert theirs.switch in netns.existing()  # not ours to remove: still there
    finally:
        subprocess.run(["ip", "netns", "delete", theirs.switch], check=True)


def test_without_cap_net_admin_the_cluster_says_so_in_one_line(monkeypatch, capsys):
    said = subprocess.CompletedProcess(
        [], 1, "", "mount --make-shared /run/netns failed: Operation not permitted\n"
    )
    monkeypatch.setattr(netns.subprocess, "run", lambda *a, **k: said)
    monkeypatch.setattr(cluster.results, "check_writable", lambda path: None)
    assert cluster.main(["--nodes", "1", "--preset", "smoke"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "network namespaces cannot be made here" in err
    assert "Operation not permitted" in err and "root or CAP_NET_ADMIN" in err


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--links", "fast"], "link rate 'fast': give unlimited or a rate such as"),
        (["--nodes", "1", "--links", "fast"], "link rate 'fast': give unlimited or a rate such"),
        (["--links", "99999999999gbit"], "give a rate from 8kbit to 1000gbit"),
        (["--links", "0.000000001kbit"], "give a rate from 8kbit to 1000gbit"),
        (["--timeout", "nan"], "--timeout must be a number of seconds > 0, got nan"),
        (["--timeout", "-1"], "--timeout must be a number of seconds > 0, got -1.0"),
        (["--peer-timeout", "0"], "--peer-timeout must be at least 1 s, got 0"),
        (["--peer-timeout", "10000000000"], "--peer-timeout must be at most 86400 s (a day)"),
        (
            ["--links", "5mbit"],
            "link 5mbit: a resnet18 step's gradient (44.7 MB over 2 ranks) takes about 82 s "
            "across it, past --peer-timeout 45 s, after which a node takes its peers for lost: "
            "give --peer-timeout 165 or more, or a faster link",
        ),
        (["--links", "8kbit", "--peer-timeout", "3600"], "link 8kbit: a resnet18 step's"),
        (["--strategy", "zero3"], "torch runs resnet18 over several machines as one of ddp, not"),
        (
            ["--workload", "zero", "--strategy", "zero3"],
            "jax runs zero over several machines as one of sharding, fsdp, fsdp_explicit, not",
        ),
        (["--nodes", "0"], "must be >= 1"),
        (["--nodes", str(cores + 1)], f"this machine gives {cores}"),
    ],
)
def test_bad_settings_are_one_line_before_anything_is_made(argv, said, capsys, monkeypatch):
    monkeypatch.setattr(netns, "_ip", lambda *a, **k: pytest.fail("made something"))
    assert cluster.main([*argv, "--preset", "smoke"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and said in err and "\n" not in err


def test_the_plan_runs_one_node_once_then_every_link_at_every_larger_count():
    args = cluster.parser().parse_args(
        ["--frameworks", "jax", "--nodes", "2", "1", "4", "--links", "1gbit", "100mbit"]
    )
    assert cluster.plan(args) == [
        ("jax", 1, "none"),
        ("jax", 2, "1gbit"),
        ("jax", 4, "1gbit"),
        ("jax", 2, "100mbit"),
        ("jax", 4, "100mbit"),
    ]


@pytest.mark.parametrize("sync", [False, True])
def test_each_node_runs_the_batchnorm_asked_for(sync, tmp_path):
    argv = ["--frameworks", "jax", *(["--sync-bn"] if sync else [])]
    args = cluster.parser().parse_args(argv)
    net = type("Net", (), {"address": lambda self, node: "10.0.0.1"})()
    cmd = cluster.node_command("jax", 1, 2, args, tmp_path / "r.jsonl", net)
    assert ("--sync-bn" in cmd) == sync
    assert cmd[cmd.index("--strategy") + 1] == "sharding"


def test_jaxs_nodes_run_shard_map_where_asked():
    """Lesson 2's shard_map over the nodes: its bucketed pmean across processes."""
    args = cluster.parser().parse_args(["--frameworks", "jax", "--strategy", "shard_map"])
    cluster.check_strategy(args)
    net = type("Net", (), {"address": lambda self, node: "10.0.0.1"})()
    for nodes in (1, 2):
        cmd = cluster.node_command("jax", 0, nodes, args, Path("r.jsonl"), net)
        assert cmd[cmd.index("--strategy") + 1] == "shard_map"


@pytest.mark.parametrize(
    ("framework", "strategy", "one", "several"),
    [
        ("torch", None, "zero3", "zero3"),
        ("mxnet", None, "server", "server"),
        ("jax", "fsdp_explicit", "fsdp_explicit", "fsdp_explicit"),
        ("torch", "zero1", "zero1", "zero1"),
    ],
)
def test_zero_runs_its_strategy_on_one_node_and_on_several(framework, strategy, one, several):
    """Lesson 4 on the cluster: the strategy asked for (each engine's most sharded by default),
    the same on one node as on several: its sharding over one device is the baseline."""
    argv = ["--frameworks", framework, "--workload", "zero"]
    args = cluster.parser().parse_args(argv + (["--strategy", strategy] if strategy else []))
    cluster.check_strategy(args)
    net = type("Net", (), {"address": lambda self, node: "10.0.0.1"})()
    for nodes, want in ((1, one), (2, several)):
        cmd = cluster.node_command(framework, 0, nodes, args, Path("r.jsonl"), net)
        assert cmd[cmd.index("--workload") + 1] == "zero"
        assert cmd[cmd.index("--strategy") + 1] == want


def test_each_node_is_given_the_peer_timeout_and_a_slow_link_that_carries_a_step_is_taken(
    tmp_path, monkeypatch
):
    """--peer-timeout reaches every node of several (one node alone has no peer to lose), and a
    link that carries a step's gradient within it passes the checks."""
    args = cluster.parser().parse_args(["--links", "5mbit", "--peer-timeout", "200"])
    monkeypatch.setattr(netns, "check_can_make", lambda: None)
    cluster.check(args)
    net = type("Net", (), {"address": lambda self, node: "10.0.0.1"})()
    cmd = cluster.node_command("torch", 1, 2, args, tmp_path / "r.jsonl", net)
    assert cmd[cmd.index("--peer-timeout") + 1] == "200"
    assert "--peer-timeout" not in cluster.node_command("torch", 0, 1, args, tmp_path, net)


def test_rates():
    assert netns.rate_bps("unlimited") is None
    assert netns.rate_bps("2.5gbit") == 2.5e9 and netns.rate_bps("100mbit") == 100e6
    for bad in ("0mbit", "1gb", "fast"):
        with pytest.raises(netns.config.ConfigError):
            netns.rate_bps(bad)


def test_make_passes_what_a_user_gives_as_words_not_shell(tmp_path):
    """`make cluster LINKS='1gbit;touch X'` ran the `touch` as root and exited 0: the values
    reach the command as environment now, so the word is refused and nothing else runs."""
    planted = tmp_path / "planted"
    cmd = ["make", "--no-print-directory", "cluster", "NODES=2", f"LINKS=1gbit;touch {planted}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = (t.decode() for t in proc.communicate(timeout=60))
    except subprocess.TimeoutExpired:  # a cluster that started anyway: stopped, not left
        for pid in supervise.processes.descendants(proc.pid):
            os.kill(pid, signal.SIGINT)  # the cluster removes its namespaces as it stops
        proc.communicate(timeout=90)
        raise
    assert proc.returncode != 0 and not planted.exists(), out + err
    assert "error: link rate '1gbit;touch': give unlimited or a rate" in err


HOLD = """
import sys, time
from common import cores
with cores.held([0, 1], "cluster"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_cluster_on_the_cores_another_holds_is_refused_in_one_line(monkeypatch, capsys):
    """Two clusters on the same cores would each compute at a fraction of its speed, and both
    records say nothing of it: the second is refused, naming the first's pid."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        monkeypatch.setattr(cluster.results, "check_writable", lambda path: None)
        monkeypatch.setattr(netns, "check_can_make", lambda: None)
        monkeypatch.setattr(netns, "_ip", lambda *a, **k: pytest.fail("made something"))
        monkeypatch.setattr(cluster.cores, "allowed", lambda: [0, 1])
        assert cluster.main(["--nodes", "1", "2", "--preset", "smoke"]) == 2
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: core 0 is held by cluster (pid {holder.pid}): run one cluster at a time on "
        "these cores, or wait for that one to end"
    )
    with cluster.cores.held([0, 1], "cluster"):  # its holder gone, the cores are free
        pass


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_the_cluster_command_imports_is_one_line(signum):
    """The stop comes as cluster.train imports its modules (common.netns, before main ran):
    the line and 128 + the signal's number, no traceback, nothing made. SIGINT as a terminal's
    Ctrl-C gives it, also where this test runs with SIGINT ignored (a shell's background job)."""
    code = (
        "import os, runpy, signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "class Stop:\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'common.netns':\n"
        f"            os.kill(os.getpid(), {int(signum)})\n"
        "sys.meta_path.insert(0, Stop())\n"
        "sys.argv = ['cluster.train', '--nodes', '1']\n"
        "runpy.run_module('cluster.train', run_name='__main__', alter_sys=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 128 + signum, done
    assert done.stderr == "interrupted; no record written\n" and done.stdout == ""
