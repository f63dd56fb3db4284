import os
import subprocess
import sys

import pytest

from common import devices


def test_virtual_cpu_devices_without_accelerators():
    p = devices.plan(2, "auto", accelerators=0)
    assert (p.count, p.platform, p.virtual) == (2, "cpu", True)
    assert p.describe() == "2 x cpu (virtual)"
    assert "virtual" in devices.notice(p)


def test_gpus_when_present():
    p = devices.plan(2, "auto", accelerators=4)
    assert (p.count, p.platform, p.virtual) == (2, "gpu", False)
    assert devices.notice(p) is None


@pytest.mark.parametrize("n", [0, -1])
def test_fewer_than_one_device_is_an_error(n):
    with pytest.raises(devices.DeviceError, match="at least 1"):
        devices.plan(n, "auto", accelerators=0)


def test_more_gpus_than_present_is_an_error_not_a_fallback():
    with pytest.raises(devices.DeviceError, match="GPUS=3 but this machine has 2 GPU"):
        devices.plan(3, "auto", accelerators=2)


def test_platform_gpu_without_accelerators_is_an_error():
    with pytest.raises(devices.DeviceError, match="no CUDA GPU"):
        devices.plan(1, "gpu", accelerators=0)


def test_platform_cpu_ignores_gpus():
    assert devices.plan(3, "cpu", accelerators=2).describe() == "3 x cpu (virtual)"


def test_unknown_platform():
    with pytest.raises(devices.DeviceError, match="unknown PLATFORM 'tpu'"):
        devices.plan(1, "tpu")


def test_cuda_visible_devices_empty_means_none(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert devices.count_accelerators() == 0


def run_python(code: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


def test_jax_flag_is_set_and_replaces_an_old_count():
    env = dict(os.environ, XLA_FLAGS="--xla_foo=1 --xla_force_host_platform_device_count=8")
    out = run_python(
        "import os; from common import devices; devices.set_jax_host_devices(2); "
        "print(os.environ['XLA_FLAGS'])",
        env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["--xla_foo=1", "--xla_force_host_platform_device_count=2"]


def test_jax_flag_after_jax_import_is_refused():
    """Stand-in module named jax: the guard looks at sys.modules, it needs no real JAX."""
    out = run_python(
        "import sys, types; sys.modules['jax'] = types.ModuleType('jax'); "
        "from common import devices; devices.set_jax_host_devices(2)"
    )
    assert out.returncode != 0
    assert "JAX was imported before the device count was set" in out.stderr
