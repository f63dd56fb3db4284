"""The all-reduce benchmark holds every core its runs compute on (cluster/allreduce.py,
held_cores), as the cluster holds its own: a loopback run held none, so it computed on the
cores that a cluster or a linked all-reduce held, and both records were wrong. The runs
themselves are left out: what is held is decided before any starts."""

import subprocess
import sys
from pathlib import Path

from cluster import allreduce
from common import config, cores, supervise

ROOT = Path(__file__).resolve().parents[2]
HOLD = """
import sys, time
from pathlib import Path
from common import cores
with cores.held(cores.allowed()[:1], "cluster", Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""


def loopback(tmp_path, run_nodes, monkeypatch) -> int:
    """`python -m cluster.allreduce --ranks 2` with `run_nodes` for its runs, its core locks
    in `tmp_path` (away from any other command's)."""
    monkeypatch.setattr(cores, "LOCK_DIR", tmp_path)
    monkeypatch.setattr(allreduce, "run_nodes", run_nodes)
    argv = ["--frameworks", "torch", "--ranks", "2", "--results", str(tmp_path / "r.jsonl")]
    return allreduce.main(argv)


def never(*args):
    raise supervise.Failed("error: a run started")


def test_a_loopback_all_reduce_on_cores_a_cluster_holds_is_refused(tmp_path, monkeypatch, capsys):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        code = loopback(tmp_path, never, monkeypatch)
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    first = cores.allowed()[0]
    assert code == 2, err
    assert err.startswith(f"error: core {first} is held by cluster (pid {holder.pid}): "), err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "r.jsonl").exists()


def test_a_loopback_run_holds_every_core_its_ranks_share(tmp_path, monkeypatch, capsys):
    refused = []

    def run_nodes(fw, nodes, args, net):
        for core in cores.allowed():  # a second command's lock on each, as a cluster takes it
            try:
                with cores.held([core], "cluster"):
                    pass
            except config.ConfigError:
                refused.append(core)
        raise supervise.Failed("error: stopped here")

    assert loopback(tmp_path, run_nodes, monkeypatch) == 1
    assert capsys.readouterr().err.strip() == "error: stopped here"
    assert refused == cores.allowed()
