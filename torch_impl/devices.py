"""A DevicePlan as torch devices, the barrier for the timer, versions, threads and usage for the
record, how a GPU trains (its layout and the compile mode of --compile) and --profile's tracer."""

import logging
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from common import devices, utilization
from torch_impl import guard

CUDA_GRAPHS = "reduce-overhead"  # torch.compile's mode that captures CUDA graphs
_modes: set[str] = set()  # the compile modes of this process's compiled models and functions


def get_devices(plan: devices.DevicePlan) -> list[torch.device]:
    """`cuda:0..N-1`, or `cpu` repeated N times: one process, N virtual devices sharing the CPU."""
    if plan.platform == "gpu":
        return [torch.device(f"cuda:{i}") for i in range(plan.count)]
    return [torch.device("cpu")] * plan.count


def to_device(arrays, device: torch.device) -> list[torch.Tensor]:
    """Host arrays as tensors on `device`, once: the data set, whose batches are index slices."""
    return [torch.from_numpy(a).to(device) for a in arrays]


def one_copy(parts: list[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """Index arrays on `device` from one host-to-device copy: a copy per step (`.to` waits for
    the queued GPU work) would keep the CPU from queueing the next step ahead."""
    flat = torch.from_numpy(np.concatenate(parts)).to(device)
    ends = np.cumsum([len(p) for p in parts])
    return [flat[end - len(p) : end] for p, end in zip(parts, ends, strict=True)]


def sync(devs: list[torch.device]) -> None:
    """Wait for queued work on every CUDA device; CPU ops run eagerly, nothing to wait for."""
    for d in dict.fromkeys(devs):
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def device_names(devs: list[torch.device]) -> list[str]:
    return [torch.cuda.get_device_name(d) if d.type == "cuda" else str(d) for d in devs]


def versions() -> dict[str, str]:
    return {"torch": torch.__version__, "cuda": torch.version.cuda or "none"}


def threads() -> int | None:
    """The threads an operator computes with: torch's intra-op count."""
    return torch.get_num_threads()


def gather_usage(usage: dict, devs: list[torch.device], gpu: bool, world: int) -> dict:
    """Utilisation and allocator peaks of every DDP rank (`world` > 1: a collective), on rank 0
    (the others get theirs back); one process's own otherwise."""
    peaks = [torch.cuda.max_memory_allocated(d) for d in devs] if gpu else []
    parts = [(usage, peaks)]
    if world > 1:
        parts = [None] * world
        dist.all_gather_object(parts, (usage, peaks))
    merged = utilization.merge([u for u, _ in parts])
    if gpu:
        allocated = [p for _, ps in parts for p in ps]
        merged = utilization.with_allocator_peaks(
            merged, allocated, "torch.cuda.max_memory_allocated"
        )
    return merged


def gpu_layout(net: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`net` as a GPU trains it best: cuDNN times its algorithms for each (fixed) shape once, in
    the warm-up, and channels-last (NHWC) is the layout tensor cores want, sparing a transpose
    around every convolution. On a CPU, `net` as it is."""
    if device.type != "cuda":
        return net
    torch.backends.cudnn.benchmark = True
    return net.to(memory_format=torch.channels_last)


def compile_mode(device: torch.device, n_devices: int = 1) -> str:
    """torch.compile's mode for --compile. On one GPU, "reduce-overhead": Inductor's kernels
    and also CUDA graphs of the compiled forward and backward, one launch each instead of one
    per kernel: the fastest step measured on one GPU (docs/results.md).
    Several devices keep "default": DDP's all-reduce hooks fire between the pieces of the
    backward, outside any graph, and lenet's devices take turns in one process, each with graphs
    of its own; neither combination is measured here. A CPU has no CUDA graphs."""
    return CUDA_GRAPHS if device.type == "cuda" and n_devices == 1 else "default"


def _warmup_calls(mode: str) -> int:
    """Calls per batch shape before a compiled step runs as it will when timed: CUDA graph trees
    run a new graph eagerly on its first call and record it on its second, so graphs need a third
    to replay; otherwise the first call compiles."""
    return 3 if mode == CUDA_GRAPHS else 1


def compile_model(net: torch.nn.Module, device: torch.device, n_devices: int = 1) -> int:
    """torch.compile `net` in place (it compiles on its first call for each batch shape); returns
    how many calls per shape the warm-up needs (_warmup_calls). dynamic=False: a graph specialised
    to each batch shape, as the ceiling's one shape is. By default the second shape (an epoch's
    last, partial batch) compiles for a symbolic batch (the full batches keep their own graph
    either way)."""
    mode = compile_mode(device, n_devices)
    _quiet_cuda_home(device)
    _modes.add(mode)
    net.compile(mode=mode, dynamic=False)
    return _warmup_calls(mode)


def compile_function(fn, device: torch.device, n_devices: int = 1):
    """(fn torch.compiled, warm-up calls per batch shape), as compile_model compiles a module:
    lenet's forward, a function of the images and the parameters, which are inputs of the graph
    (updated in place between calls, never baked in as constants)."""
    mode = compile_mode(device, n_devices)
    _quiet_cuda_home(device)
    _modes.add(mode)
    return torch.compile(fn, mode=mode, dynamic=False), _warmup_calls(mode)


def _quiet_cuda_home(device: torch.device) -> None:
    """On a CPU, TorchInductor's C++ build looks for CUDA (torch.utils.cpp_extension), which
    warns, where an nvcc is on the PATH, that it found no CUDA runtime: nothing it builds for
    a CPU uses CUDA, so the line is only noise in a CPU run's output."""
    if device.type == "cpu":
        logging.getLogger("torch.utils.cpp_extension").addFilter(_not_cuda_home)


def _not_cuda_home(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("No CUDA runtime is found")


def new_step() -> None:
    """A training step begins: CUDA graphs (--compile on one GPU) may reuse the last step's
    output memory from here. Only where this process compiles for CUDA graphs: torch.compiler's
    call imports TorchInductor (seconds) in an eager process just to find none."""
    if CUDA_GRAPHS in _modes:
        torch.compiler.cudagraph_mark_step_begin()


def compile_fields(compiled: bool, device: torch.device, n_devices: int = 1) -> dict:
    """The record's account of --compile: the mode, and how many graphs torch.compile left out
    of CUDA graphs in this process (torch logs each reason; 0 where the mode's graphs all run)."""
    if not compiled:
        return {"compile_mode": None}
    return {"compile_mode": compile_mode(device, n_devices), "cudagraph_skips": guard.graph_skips()}


@contextmanager
def profiler(path: Path):
    """--profile (common/profiling.py): torch.profiler around the block, CPU ops and, where torch
    sees a GPU, its kernels; the Chrome trace at `path`.json, torch's table of ops by self time
    (the device's where there is one) at `path`.txt."""
    gpu = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CPU]
    activities += [torch.profiler.ProfilerActivity.CUDA] if gpu else []
    with torch.profiler.profile(activities=activities) as prof:
        yield
    prof.export_chrome_trace(f"{path}.json")
    table = prof.key_averages().table(
        sort_by="self_device_time_total" if gpu else "self_cpu_time_total", row_limit=30
    )
    Path(f"{path}.txt").write_text(table + "\n")
