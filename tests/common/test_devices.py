import os
import platform
import subprocess
import sys
from pathlib import Path

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


@pytest.mark.parametrize(
    ("flags", "env", "expected"),
    [
        ({"avx2", "fma"}, {}, False),  # AVX2: no bf16 kernels in oneDNN
        ({"avx512f", "avx512bw", "avx512vl", "avx512dq"}, {}, False),  # AVX-512: emulated
        ({"avx512f", "avx512_bf16"}, {}, True),  # Cooper Lake, Zen 4 and later
        ({"amx_bf16", "amx_tile"}, {}, True),  # Sapphire Rapids and later
        ({"avx512_bf16"}, {"ONEDNN_MAX_CPU_ISA": "AVX2"}, False),  # make numerics' cap
        ({"avx512_bf16"}, {"DNNL_MAX_CPU_ISA": "AVX512_CORE"}, False),
        ({"avx512_bf16"}, {"ONEDNN_MAX_CPU_ISA": "avx512_core_bf16"}, True),
        ({"amx_bf16"}, {"DNNL_MAX_CPU_ISA": "ALL"}, True),
    ],
)
def test_bf16_arithmetic_from_the_cpu_flags_and_isa_caps(monkeypatch, flags, env, expected):
    monkeypatch.setattr(devices, "cpu_flags", lambda: flags)
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert devices.cpu_has_bf16() is expected


@pytest.mark.skipif(
    platform.machine() != "x86_64" or not Path("/proc/cpuinfo").is_file(),
    reason="x86-64 Linux names its CPU flags in /proc/cpuinfo",
)
def test_cpu_flags_are_read_from_proc_cpuinfo():
    assert {"sse2", "fxsr"} <= devices.cpu_flags()  # every x86-64 CPU has these


@pytest.mark.parametrize(
    ("flags", "isa"),
    [
        ({"sse2"}, "other"),
        ({"avx2", "fma"}, "avx2"),
        ({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"}, "avx512"),
        (
            {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"},
            "avx512_bf16",
        ),
        ({"avx512_bf16", "amx_bf16", "amx_tile"}, "amx_bf16"),
    ],
)
def test_cpu_isa_is_the_widest_level_the_flags_allow(monkeypatch, flags, isa):
    monkeypatch.setattr(devices, "cpu_flags", lambda: flags)
    assert devices.cpu_isa() == isa


def test_isa_caps_name_each_variable_that_caps(monkeypatch):
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    assert devices.isa_caps() == {}
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv(
        "XLA_FLAGS", "--xla_cpu_max_isa=AVX2 --xla_force_host_platform_device_count=2"
    )
    assert devices.isa_caps() == {"ONEDNN_MAX_CPU_ISA": "AVX2", "xla_cpu_max_isa": "AVX2"}


def test_mxnet_gets_every_cpu_allowed_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv(devices.OMP_THREADS_ENV, raising=False)
    assert devices.set_mxnet_threads()
    assert os.environ[devices.OMP_THREADS_ENV] == str(len(os.sched_getaffinity(0)))
    monkeypatch.setenv(devices.OMP_THREADS_ENV, "3")
    assert not devices.set_mxnet_threads() and os.environ[devices.OMP_THREADS_ENV] == "3"
    monkeypatch.setenv(devices.OMP_THREADS_ENV, "")  # empty: OpenMP's default, as if unset
    assert devices.set_mxnet_threads()
