"""A DevicePlan as torch devices, the barrier for the timer, and versions for the record."""

import torch

from common import devices


def get_devices(plan: devices.DevicePlan) -> list[torch.device]:
    """`cuda:0..N-1`, or `cpu` repeated N times: one process, N virtual devices sharing the CPU."""
    if plan.platform == "gpu":
        return [torch.device(f"cuda:{i}") for i in range(plan.count)]
    return [torch.device("cpu")] * plan.count


def sync(devs: list[torch.device]) -> None:
    """Wait for queued work on every CUDA device; CPU ops run eagerly, nothing to wait for."""
    for d in dict.fromkeys(devs):
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def device_names(devs: list[torch.device]) -> list[str]:
    return [torch.cuda.get_device_name(d) if d.type == "cuda" else str(d) for d in devs]


def versions() -> dict[str, str]:
    return {"torch": torch.__version__, "cuda": torch.version.cuda or "none"}
