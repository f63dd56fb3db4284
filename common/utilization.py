"""Device utilisation and peak memory during timed regions, framework-free.

On GPUs a thread asks `nvidia-smi` (which reads NVML) every `interval` seconds for each GPU's
utilisation and memory, keeping only samples taken inside `measure()` regions. On CPUs each
process reports its own CPU time / wall time over the same regions (100 = one busy core) and its
peak resident memory. Several processes (DDP ranks) each measure themselves; `merge` joins them.

Result, stored in a record's `extra`:
  {"utilization": [mean % per device or per process], "peak_memory_bytes": [...],
   "utilization_source": "nvml" | "cpu_time" | "none"}
On GPUs `with_allocator_peaks` puts the framework allocator's own peaks in `peak_memory_bytes`:
nvidia-smi's memory.used counts what a process reserved, and JAX reserves 75% of the GPU at
start, so only the allocators' figures compare across frameworks.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager

QUERY = [
    "nvidia-smi",
    "--query-gpu=index,utilization.gpu,memory.used",
    "--format=csv,noheader,nounits",
]


def parse_nvidia_smi(text: str) -> list[tuple[int, float, float]]:
    """`index, util %, memory MiB` lines -> [(index, util, MiB)]; unreadable lines are skipped
    (nvidia-smi prints `[N/A]` or `[Not Supported]` on some boards)."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            rows.append((int(parts[0]), float(parts[1]), float(parts[2])))
        except ValueError:
            continue
    return rows


def query_nvidia_smi() -> str:
    return subprocess.run(QUERY, capture_output=True, text=True, timeout=10, check=True).stdout


def visible_gpu_indices(count: int) -> list[int]:
    """nvidia-smi numbers GPUs ignoring CUDA_VISIBLE_DEVICES: map the first `count` visible."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if ids and all(v.isdigit() for v in ids):
        return [int(v) for v in ids[:count]]
    return list(range(count))


def sampler_for(platform: str, gpus: int) -> Sampler:
    """nvidia-smi samples of this process's first `gpus` visible GPUs on a GPU platform (0:
    none, e.g. a rank that does not report), else this process's CPU time."""
    if platform == "gpu":
        return Sampler("nvml", visible_gpu_indices(gpus) if gpus else [])
    return Sampler("cpu_time")


class Sampler:
    """`source="nvml"`: sample `gpu_indices` in a thread; `"cpu_time"`: this process's CPU time.

    Use `with sampler:` around the run (starts/stops the thread) and `with sampler.measure():`
    around each timed region; `result()` summarises the regions only.
    """

    def __init__(
        self,
        source: str,
        gpu_indices: Sequence[int] = (),
        interval: float = 0.2,
        query: Callable[[], str] = query_nvidia_smi,
    ):
        if source not in ("nvml", "cpu_time"):
            raise ValueError(f"unknown utilisation source {source!r}")
        if source == "nvml" and query is query_nvidia_smi and not shutil.which("nvidia-smi"):
            source = "none"  # a GPU without nvidia-smi: record that nothing was sampled
        self.source = source
        self.gpu_indices = list(gpu_indices)
        self.interval = interval
        self.query = query
        self.samples: dict[int, list[tuple[float, float]]] = {i: [] for i in self.gpu_indices}
        self.cpu_seconds = 0.0
        self.wall_seconds = 0.0
        self._active = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        if self.source == "nvml":
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def _poll(self) -> None:
        while not self._stop.is_set():
            if self._active.is_set():
                self.sample_once()
            self._stop.wait(self.interval)

    def sample_once(self) -> None:
        try:
            rows = parse_nvidia_smi(self.query())
        except (OSError, subprocess.SubprocessError):
            return
        for index, util, mib in rows:
            if index in self.samples:
                self.samples[index].append((util, mib))

    @contextmanager
    def measure(self):
        """A timed region: GPU samples are kept and this process's CPU time counted."""
        cpu, wall = time.process_time(), time.perf_counter()
        self._active.set()
        try:
            yield
        finally:
            self._active.clear()
            self.cpu_seconds += time.process_time() - cpu
            self.wall_seconds += time.perf_counter() - wall

    def result(self) -> dict:
        if self.source == "nvml":
            util = [_mean([u for u, _ in self.samples[i]]) for i in self.gpu_indices]
            peak = [
                int(max((m for _, m in self.samples[i]), default=0) * 2**20)
                for i in self.gpu_indices
            ]
            return {"utilization": util, "peak_memory_bytes": peak, "utilization_source": "nvml"}
        if self.source == "none":
            return {"utilization": [], "peak_memory_bytes": [], "utilization_source": "none"}
        share = 100.0 * self.cpu_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0
        return {
            "utilization": [round(share, 1)],
            "peak_memory_bytes": [peak_rss_bytes()],
            "utilization_source": "cpu_time",
        }


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def peak_rss_bytes() -> int:
    """Peak resident memory of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def with_allocator_peaks(result: dict, peaks: Sequence[int], source: str) -> dict:
    """`result` with `peaks` (bytes per device, from the framework's allocator) as the peak
    memory; nvidia-smi's reading is kept as `nvml_memory_used_bytes`."""
    out = dict(result, peak_memory_bytes=[int(p) for p in peaks], memory_source=source)
    if result.get("utilization_source") == "nvml":
        out["nvml_memory_used_bytes"] = result.get("peak_memory_bytes", [])
    return out


def merge(parts: Sequence[dict]) -> dict:
    """One result per process (DDP ranks, in rank order) -> one result with a list entry each."""
    if not parts:
        return {"utilization": [], "peak_memory_bytes": [], "utilization_source": "none"}
    if parts[0]["utilization_source"] == "nvml":
        return dict(parts[0])  # one sampler (rank 0) already saw every GPU
    return {
        "utilization": [u for p in parts for u in p["utilization"]],
        "peak_memory_bytes": [m for p in parts for m in p["peak_memory_bytes"]],
        "utilization_source": parts[0]["utilization_source"],
    }
