import jax
import pytest

from common import devices
from jax_impl import devices as jdev


def test_two_virtual_host_devices_from_conftest():
    devs = jdev.get_devices(devices.DevicePlan(2, "cpu", True))
    assert len(devs) == 2 and devs[0] != devs[1]
    x = jax.device_put(jax.numpy.ones(3), devs[1])
    jdev.sync(x)
    assert x.devices() == {devs[1]}


def test_more_than_configured_is_a_clear_error():
    with pytest.raises(devices.DeviceError, match="JAX sees 2 cpu device"):
        jdev.get_devices(devices.DevicePlan(3, "cpu", True))
