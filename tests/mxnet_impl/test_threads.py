"""MXNet computes with every CPU allowed (common.devices.set_mxnet_threads): unset,
OMP_NUM_THREADS would leave MXNet half of them, fixed when it loads. Each entry point sets it
in time, and the record says what MXNet computed with."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common import devices
from mxnet_impl import guard, launch

ROOT = Path(__file__).resolve().parents[2]
CORES = devices.cores_allowed()


def _record(module, tmp_path, *argv, env=None):
    path = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", module, "--workload", "lenet", "--preset", "smoke"]
    cmd += ["--platform", "cpu", "--no-progress", *argv, "--results", str(path)]
    clean = {k: v for k, v in os.environ.items() if k != devices.OMP_THREADS_ENV}
    out = subprocess.run(
        cmd, cwd=ROOT, env={**clean, **(env or {})}, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(path.read_text().splitlines()[-1])


@pytest.mark.skipif(CORES < 2, reason="one CPU: MXNet's default half is that one")
@pytest.mark.parametrize("module", ["mxnet_impl", "mxnet_impl.ceiling"])
def test_an_mxnet_run_computes_with_every_cpu_allowed(module, tmp_path):
    """`python -m mxnet_impl` sets the threads before MXNet loads; the ceiling, whose imports
    load it, starts itself again with them."""
    assert _record(module, tmp_path)["extra"]["threads"] == CORES


def test_a_users_thread_count_is_kept(tmp_path):
    rec = _record("mxnet_impl.ceiling", tmp_path, env={devices.OMP_THREADS_ENV: "1"})
    assert rec["extra"]["threads"] == 1


@pytest.mark.parametrize(("own", "each"), [("4", 2), ("1", 1), ("", CORES // 2 or 1)])
def test_dist_workers_share_the_launchers_threads(own, each, monkeypatch):
    monkeypatch.setenv(devices.OMP_THREADS_ENV, own)
    env = guard.process_environment(launch.environment(2, 1, 9000), workers=2, n_contexts=2)
    assert env[devices.OMP_THREADS_ENV] == str(each)
