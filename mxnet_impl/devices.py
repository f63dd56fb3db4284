"""A DevicePlan as MXNet contexts, the barrier for the timer, and versions for the record."""

import mxnet as mx

from common import devices


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


def sync(devs=None) -> None:
    """MXNet's engine is asynchronous: wait for every queued operation."""
    mx.nd.waitall()


def device_names(devs: list[mx.Context]) -> list[str]:
    return [str(d) for d in devs]


def versions() -> dict[str, str]:
    return {"mxnet": mx.__version__}
