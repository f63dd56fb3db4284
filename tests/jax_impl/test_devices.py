import jax
import pytest

from common import devices, results
from jax_impl import devices as jdev
from tests.fixtures import locks


def test_two_virtual_host_devices_from_conftest():
    devs = jdev.get_devices(devices.DevicePlan(2, "cpu", True))
    assert len(devs) == 2 and devs[0] != devs[1]
    x = jax.device_put(jax.numpy.ones(3), devs[1])
    jdev.sync(x)
    assert x.devices() == {devs[1]}


def test_more_than_configured_is_a_clear_error():
    with pytest.raises(devices.DeviceError, match="JAX sees 2 cpu device"):
        jdev.get_devices(devices.DevicePlan(3, "cpu", True))


@pytest.mark.parametrize(
    ("platform", "virtual", "want"), [("cpu", True, "cpu"), ("gpu", False, None)]
)
def test_platform_cpu_keeps_jax_off_the_gpu(monkeypatch, platform, virtual, want):
    """PLATFORM=cpu on a GPU machine: JAX must start no CUDA backend (which would reserve 75%
    of the GPU and, with jax.distributed, try to share it between processes)."""
    from jax_impl import __main__ as entry

    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(devices, "set_jax_host_devices", lambda n: None)  # jax is loaded
    entry.before_import(devices.DevicePlan(2, platform, virtual))
    assert entry.os.environ.get("JAX_PLATFORMS") == want


def test_a_gpu_plan_without_a_gpu_backend_is_a_clear_error(monkeypatch):
    def no_gpu(backend=None):
        raise RuntimeError(f"Unknown backend {backend}")

    monkeypatch.setattr(jdev.jax, "devices", no_gpu)
    with pytest.raises(devices.DeviceError, match="no GPU backend.*PLATFORM=cpu"):
        jdev.get_devices(devices.DevicePlan(1, "gpu", False))


def test_the_record_names_the_locked_versions():
    versions, _ = results.environment(jdev.versions())
    locks.check_versions(versions, ["jax", "jaxlib", "flax", "optax", "numpy"])
    locks.check_environment()
