import torch

from common import devices
from torch_impl import devices as tdev


def test_virtual_cpu_devices_repeat_cpu():
    devs = tdev.get_devices(devices.DevicePlan(2, "cpu", True))
    assert devs == [torch.device("cpu")] * 2
    tdev.sync(devs)
    assert tdev.device_names(devs) == ["cpu", "cpu"]
    assert "torch" in tdev.versions()
