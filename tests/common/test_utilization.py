"""common/utilization.py: nvidia-smi parsing, region-only sampling, CPU time share, merging."""

import time

import pytest

from common import utilization


def test_parse_nvidia_smi_skips_unreadable_lines():
    text = "0, 87, 1024\n1, [N/A], 512\ngarbage\n1, 40, 2048\n"
    assert utilization.parse_nvidia_smi(text) == [(0, 87.0, 1024.0), (1, 40.0, 2048.0)]


def test_nvml_sampler_averages_utilisation_and_takes_peak_memory_per_gpu():
    replies = iter(["0, 10, 100\n1, 20, 200\n", "0, 30, 300\n1, 50, 100\n"])
    s = utilization.Sampler("nvml", [0, 1], interval=60, query=lambda: next(replies))
    s.sample_once()
    s.sample_once()
    r = s.result()
    assert r["utilization_source"] == "nvml"
    assert r["utilization"] == [20.0, 35.0]
    assert r["peak_memory_bytes"] == [300 * 2**20, 200 * 2**20]


def test_nvml_thread_samples_only_while_measuring():
    calls = []

    def query():
        calls.append(time.monotonic())
        return "0, 50, 10\n"

    with utilization.Sampler("nvml", [0], interval=0.01, query=query) as s:
        time.sleep(0.1)
        assert not calls  # no region yet
        with s.measure():
            time.sleep(0.1)
    assert calls and s.result()["utilization"] == [50.0]


def test_cpu_time_share_of_a_busy_region():
    """The share of one core this process got in the region, whatever else the machine runs:
    the test measures the same share itself (a loaded machine gives a busy loop less than
    100%), and the sleep after the region must not count (it would halve the share)."""
    s = utilization.Sampler("cpu_time")
    with s:
        with s.measure():
            cpu, wall = time.process_time(), time.perf_counter()
            while time.perf_counter() < wall + 0.2:
                pass
            share = 100 * (time.process_time() - cpu) / (time.perf_counter() - wall)
        time.sleep(0.2)  # outside the region: not counted
    r = s.result()
    assert r["utilization_source"] == "cpu_time"
    assert abs(r["utilization"][0] - share) <= 0.25 * share
    assert r["peak_memory_bytes"][0] > 1 << 20


def test_merge_concatenates_processes():
    parts = [
        {"utilization": [90.0], "peak_memory_bytes": [10], "utilization_source": "cpu_time"},
        {"utilization": [80.0], "peak_memory_bytes": [20], "utilization_source": "cpu_time"},
    ]
    assert utilization.merge(parts) == {
        "utilization": [90.0, 80.0],
        "peak_memory_bytes": [10, 20],
        "utilization_source": "cpu_time",
    }
    assert utilization.merge([])["utilization_source"] == "none"


def test_visible_gpu_indices_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert utilization.visible_gpu_indices(2) == [2, 3]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert utilization.visible_gpu_indices(2) == [0, 1]


def test_unknown_source_is_refused():
    with pytest.raises(ValueError):
        utilization.Sampler("tpu")


def test_allocator_peaks_replace_what_nvidia_smi_saw():
    nvml = {"utilization": [80.0], "peak_memory_bytes": [60 * 2**30], "utilization_source": "nvml"}
    out = utilization.with_allocator_peaks(nvml, [2**30], "jax peak_bytes_in_use")
    assert out["peak_memory_bytes"] == [2**30] and out["memory_source"] == "jax peak_bytes_in_use"
    assert out["nvml_memory_used_bytes"] == [60 * 2**30] and out["utilization"] == [80.0]
    assert nvml["peak_memory_bytes"] == [60 * 2**30]  # the sampler's result is not changed
