"""A DevicePlan as MXNet contexts, the data set and index batches on them, the barrier for the
timer, versions and threads for the record, and --profile's tracer."""

import ctypes
import os
from contextlib import contextmanager
from pathlib import Path

import mxnet as mx
import numpy as np

from common import devices, processes


def get_devices(plan: devices.DevicePlan) -> list[mx.Context]:
    """`mx.gpu(i)`, or `mx.cpu(0..N-1)`: distinct CPU contexts that share the same cores."""
    if plan.platform == "gpu":
        if mx.context.num_gpus() < plan.count:
            raise devices.DeviceError(
                f"MXNet sees {mx.context.num_gpus()} GPU(s), {plan.count} requested; the PyPI "
                "mxnet wheel is CPU-only (a CUDA build needs mxnet-cuXXX with a CUDA 11 runtime)"
            )
        return [mx.gpu(i) for i in range(plan.count)]
    return [mx.cpu(i) for i in range(plan.count)]


def to_device(arrays, ctx: mx.Context) -> list[mx.nd.NDArray]:
    """Host arrays as NDArrays on `ctx`, once, each keeping its dtype (nd.array's default is
    float32): the data set, whose batches are index slices."""
    return [mx.nd.array(a, ctx=ctx, dtype=a.dtype) for a in arrays]


def one_copy(parts: list[np.ndarray], ctx: mx.Context) -> list[mx.nd.NDArray]:
    """Index arrays on `ctx` from one copy: a copy per step (a synchronous copy from NumPy)
    would keep the CPU from queueing the next step while a GPU runs this one."""
    flat = mx.nd.array(np.concatenate(parts), ctx=ctx, dtype="int64")
    ends = np.cumsum([len(p) for p in parts])
    return [flat[int(end) - len(p) : int(end)] for p, end in zip(parts, ends, strict=True)]


def add_up(values: list[mx.nd.NDArray]) -> mx.nd.NDArray:
    """NDArrays of several contexts summed on the first one's (not synced)."""
    return mx.nd.add_n(*(v.as_in_context(values[0].context) for v in values))


def float_sum(values: list[mx.nd.NDArray]) -> float:
    """NDArray scalars summed as Python floats (float64); each waits for its value."""
    return sum(float(v.asscalar()) for v in values)


def pull_weights_first(trainer) -> None:
    """Pull a dist_sync Trainer's weights now, before its first step. Its first call pulls
    them lazily, and its first step then pushes the gradients on the same keys, unordered by
    the engine: a late pull would get a step's gradient sum as the weights (docs/design.md,
    Traps). `update` sets the kvstore up as every call does, and updates nothing before any
    backward (ignore_stale_grad)."""
    trainer.update(1, ignore_stale_grad=True)
    mx.nd.waitall()


def sync(devs=None) -> None:
    """MXNet's engine is asynchronous: wait for every queued operation."""
    mx.nd.waitall()


def device_names(devs: list[mx.Context]) -> list[str]:
    return [str(d) for d in devs]


def versions() -> dict[str, str]:
    return {"mxnet": mx.__version__}


def threads() -> int | None:
    """The threads an operator computes with: the OpenMP count MXNet set when it loaded
    (common.devices.set_mxnet_threads), read from the libgomp it links; None without one."""
    try:
        return ctypes.CDLL("libgomp.so.1").omp_get_max_threads()
    except OSError:
        return None


def has_bf16() -> bool:
    """Whether MXNet's oneDNN runs a bf16 convolution here: on AVX-512 CPUs it does (with bf16
    instructions or emulated), on AVX2 ones (or DNNL_MAX_CPU_ISA=AVX2) it raises an error."""
    from mxnet.contrib.amp.amp import bfloat16

    one = mx.nd.amp_cast(mx.nd.ones((1, 1, 1, 1)), dtype=bfloat16)
    # MXNet logs the failed oneDNN attempt before raising or falling back: not to the terminal.
    with open(os.devnull, "w") as null, processes.fd_redirected(2, null.fileno()):
        try:
            mx.nd.Convolution(one, one, kernel=(1, 1), num_filter=1, no_bias=True).wait_to_read()
        except mx.base.MXNetError:
            return False
    return True


@contextmanager
def profiler(path: Path):
    """--profile (common/profiling.py): mx.profiler around the block, every operator and engine
    event; the Chrome trace at `path`.json, MXNet's aggregate table by operator at `path`.txt.
    MXNet writes one Chrome trace per process (a second set_config fails), so a run traces one
    block: --profile with --ceiling is refused for MXNet (profiling.check)."""
    mx.profiler.set_config(profile_all=True, aggregate_stats=True, filename=f"{path}.json")
    mx.profiler.set_state("run")
    try:
        yield
    finally:
        mx.nd.waitall()
        mx.profiler.set_state("stop")
    mx.profiler.dump(finished=True)  # unfinished, the file is completed at the process's exit
    Path(f"{path}.txt").write_text(mx.profiler.dumps(reset=True))
