"""A DevicePlan as JAX devices, the barrier for the timer, versions and threads for the record, and
--profile's tracer.

The host device count was set before JAX was imported (jax_impl/__main__.py, or the tests'
conftest); here we only take the first N devices of the platform.
"""

import shutil
from contextlib import contextmanager
from pathlib import Path

import jax
import numpy as np

from common import devices, utilization


def get_devices(plan: devices.DevicePlan) -> list[jax.Device]:
    """The platform's first N devices (`jax.devices`): one process drives them all; a CPU's N
    virtual devices were made before JAX was imported (jax_impl/__main__.py)."""
    backend = "gpu" if plan.platform == "gpu" else "cpu"
    try:
        found = jax.devices(backend)
    except RuntimeError:  # a CPU-only jaxlib on a GPU machine: "Unknown backend gpu"
        raise devices.DeviceError(
            "this JAX has no GPU backend (CPU-only jaxlib); install it with CUDA "
            "(make setup FRAMEWORK=jax on a machine with nvidia-smi, or pip install "
            "'jax[cuda12]'), or use PLATFORM=cpu"
        ) from None
    if len(found) < plan.count:
        raise devices.DeviceError(
            f"JAX sees {len(found)} {backend} device(s), {plan.count} requested; for virtual CPU "
            "devices set the count before importing jax (common.devices.set_jax_host_devices)"
        )
    return found[: plan.count]


def sync(tree=None) -> None:
    """JAX dispatches asynchronously: wait until every array in `tree` is computed."""
    if tree is not None:
        jax.block_until_ready(tree)


def padded(idx, size):
    """A test batch's indices padded with 0 to `size`, and the mask of its own: every test batch
    of one shape, so a jitted evaluation compiles once."""
    mask = np.arange(size) < len(idx)
    return np.pad(np.asarray(idx, np.int32), (0, size - len(idx))), mask


def device_names(devs: list[jax.Device]) -> list[str]:
    return [f"{d.platform}:{d.id} {d.device_kind}" for d in devs]


def with_allocator_peaks(usage: dict, world) -> dict:
    """`usage` with the allocator's peak on each of this process's GPUs (none on a CPU)."""
    mine = [d for d in world.devices if d.process_index == world.rank and d.platform == "gpu"]
    if not mine:
        return usage
    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use", 0) for d in mine]
    return utilization.with_allocator_peaks(usage, peaks, "jax peak_bytes_in_use")


def versions() -> dict[str, str]:
    import flax
    import jaxlib
    import optax

    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "flax": flax.__version__,
        "optax": optax.__version__,
    }


def threads() -> int | None:
    """The threads an operator computes with: None, as XLA:CPU sizes its own thread pools
    and no API of JAX's says how."""
    return None


@contextmanager
def profiler(path: Path):
    """--profile (common/profiling.py): jax.profiler around the block. XLA's trace stays in the
    folder `path` (TensorBoard's profile plugin or XProf opens it); its Chrome trace is copied
    to `path`.json.gz. The newest, should the folder hold an earlier run's too."""
    with jax.profiler.trace(str(path), create_perfetto_trace=True):
        yield
    traces = Path(path).glob("plugins/profile/*/perfetto_trace.json.gz")
    shutil.copyfile(max(traces, key=lambda t: t.stat().st_mtime), f"{path}.json.gz")
