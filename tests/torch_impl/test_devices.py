import torch

from common import devices, results
from tests.fixtures import locks
from torch_impl import devices as tdev


def test_virtual_cpu_devices_repeat_cpu():
    devs = tdev.get_devices(devices.DevicePlan(2, "cpu", True))
    assert devs == [torch.device("cpu")] * 2
    tdev.sync(devs)
    assert tdev.device_names(devs) == ["cpu", "cpu"]
    assert "torch" in tdev.versions()


def test_the_record_names_the_locked_versions():
    versions, _ = results.environment(tdev.versions())
    locks.check_versions(versions, ["torch", "numpy"])
    locks.check_environment()
