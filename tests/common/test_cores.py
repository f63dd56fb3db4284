"""--cores-per-device (common/cores.py): the command claims N x K cores, a launcher's workers keep
their slices, the records say how the devices ran. Affinity is changed in child processes only,
so the test process keeps its cores."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common import config, cores

ROOT = Path(__file__).resolve().parents[2]
CORES = sorted(os.sched_getaffinity(0))
two_cores = pytest.mark.skipif(len(CORES) < 2, reason="needs 2 cores to give 2 devices one each")


def in_child(code: str, env: dict | None = None) -> dict:
    """Run `code` (which prints one JSON value) in a fresh Python, with `env` added."""
    out = subprocess.run(
        [sys.executable, "-c", f"import json, os\nfrom common import cores\n{code}"],
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    return json.loads(out)


@two_cores
def test_claim_pins_the_process_to_n_times_k_cores_and_says_k():
    got = in_child(
        "env = {}\n"
        "node = cores.claim(2, 1, env)\n"
        "print(json.dumps([node, sorted(os.sched_getaffinity(0)), env]))"
    )
    node, affinity, env = got
    assert node == affinity == CORES[:2]
    assert env == {
        cores.PER_DEVICE_ENV: "1",
        cores.NODE_ENV: f"{CORES[0]},{CORES[1]}",
        "OMP_NUM_THREADS": "1",
    }


def test_claim_refuses_more_cores_than_the_process_may_use():
    with pytest.raises(config.ConfigError, match=r"needs \d+ cores; this process may use"):
        cores.claim(len(CORES) + 1, 1, {})
    with pytest.raises(config.ConfigError, match="at least 1"):
        cores.claim(1, 0, {})


@two_cores
@pytest.mark.parametrize(
    "env, want",
    [
        ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, [1]),  # torchrun's second worker
        ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}, [0]),
        ({cores.LOCAL_INDEX_ENV: "1", cores.LOCAL_COUNT_ENV: "2"}, [1]),  # MXNet's launcher
        ({cores.LOCAL_INDEX_ENV: "0", cores.LOCAL_COUNT_ENV: "1"}, [0, 1]),  # one per node
    ],
)
def test_a_launched_worker_keeps_its_slice_of_the_nodes_cores(env, want):
    node = f"{CORES[0]},{CORES[1]}"
    got = in_child(
        "print(json.dumps([cores.narrow(), sorted(os.sched_getaffinity(0))]))",
        {cores.PER_DEVICE_ENV: "1", cores.NODE_ENV: node, **env},
    )
    expected = [CORES[i] for i in want]
    assert got == [expected, expected]


def test_nothing_is_narrowed_without_cores_per_device_or_a_launcher():
    assert cores.narrow({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}) is None
    assert cores.narrow({cores.PER_DEVICE_ENV: "1", cores.NODE_ENV: "0,1"}) is None


def test_uneven_slices_are_refused():
    env = {cores.PER_DEVICE_ENV: "1", cores.NODE_ENV: "0,1,2", "LOCAL_RANK": "0"}
    with pytest.raises(config.ConfigError, match="cannot share the cores 0,1,2 evenly"):
        cores.narrow({**env, "LOCAL_WORLD_SIZE": "2"})


@pytest.mark.parametrize(
    "framework, devices, env, want",
    [
        ("torch", 1, {}, "single"),
        ("torch", 2, {}, "sequential"),  # one torch process steps its cpu devices in turn
        ("jax", 2, {}, "concurrent"),
        ("mxnet", 2, {}, "concurrent"),
        ("torch", 2, {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2"}, "processes"),
        ("mxnet", 2, {"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "2"}, "processes"),
        ("jax", 2, {"JAX_NUM_PROCESSES": "2"}, "processes"),
        ("jax", 4, {"JAX_NUM_PROCESSES": "2"}, "concurrent"),
    ],
)
def test_execution_says_how_the_devices_ran(framework, devices, env, want):
    assert cores.execution(framework, devices, env) == want


def test_record_fields_name_the_nodes_cores():
    env = {cores.PER_DEVICE_ENV: "2", cores.NODE_ENV: "4,5,6,7"}
    fields = cores.record_fields("jax", 2, env)
    assert fields == {"cores_per_device": 2, "cores_used": [4, 5, 6, 7], "execution": "concurrent"}
    shared = cores.record_fields("torch", 1, {})
    assert shared["cores_per_device"] is None and shared["cores_used"] == CORES
