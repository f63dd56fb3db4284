"""What GPUS=N and PLATFORM=auto|gpu|cpu mean on this machine (docs/design.md, "Devices").

The answer is framework-free data, a `DevicePlan`; each framework turns it into its own device
objects. No framework is imported here: accelerators are counted the way nvidia-smi sees them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PLATFORMS = ("auto", "gpu", "cpu")
MAX_VIRTUAL = 64  # virtual CPU devices share the same cores; more than this teaches nothing


class DeviceError(ValueError):
    """An impossible device request: the message is one line saying what to do."""


@dataclass(frozen=True)
class DevicePlan:
    count: int
    platform: str  # "gpu" or "cpu"
    virtual: bool  # True: `count` virtual devices on the host CPU, sharing its cores

    def describe(self) -> str:
        """d2l style: `2 x cpu (virtual)`, `1 x gpu`."""
        return f"{self.count} x {self.platform}" + (" (virtual)" if self.virtual else "")


def count_accelerators() -> int:
    """CUDA GPUs visible to this process (CUDA_VISIBLE_DEVICES respected), without a framework."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    found = len(gpu_names())
    if visible is not None:
        found = min(found, len([v for v in visible.split(",") if v.strip()]))
    return found


def gpu_names() -> list[str]:
    """Names of the NVIDIA GPUs on the machine (all of them, ignoring CUDA_VISIBLE_DEVICES)."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout
            return [line.strip() for line in out.splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    proc = Path("/proc/driver/nvidia/gpus")
    if proc.is_dir():
        return [_proc_gpu_name(d) for d in sorted(proc.iterdir())]
    return []


def _proc_gpu_name(d: Path) -> str:
    info = d / "information"
    if info.is_file():
        match = re.search(r"^Model:\s*(.+)$", info.read_text(), re.M)
        if match:
            return match.group(1).strip()
    return "NVIDIA GPU"


def cpu_flags() -> set[str]:
    """The CPU's feature flags as /proc/cpuinfo names them (elsewhere: none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return next(
        (
            set(line.split(":", 1)[1].split())
            for line in text.splitlines()
            if line.startswith("flags")
        ),
        set(),
    )


# The vector ISA levels the frameworks' CPU kernels are chosen by, widest first: (name, flags).
_ISAS = (
    ("amx_bf16", {"amx_bf16"}),
    ("avx512_bf16", {"avx512_bf16"}),
    ("avx512", {"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
    ("avx2", {"avx2", "fma"}),
)
# The variables that cap oneDNN's ISA (torch; MXNet's older build); XLA:CPU's cap is a flag.
ISA_CAP_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def cpu_isa() -> str:
    """The CPU's widest vector ISA level that the frameworks' kernels use: amx_bf16,
    avx512_bf16, avx512, avx2, or other (an older x86 CPU, another architecture). Two machines
    with one CPU name can differ here (a VM hides AVX-512, say), and so do their timings."""
    flags = cpu_flags()
    return next((name for name, needs in _ISAS if needs <= flags), "other")


def isa_caps() -> dict[str, str]:
    """The ISA caps set in the environment (`make numerics` caps at AVX2), by variable."""
    caps = {name: os.environ[name] for name in ISA_CAP_ENV if os.environ.get(name)}
    xla = re.search(r"--xla_cpu_max_isa=(\S+)", os.environ.get("XLA_FLAGS", ""))
    if xla:
        caps["xla_cpu_max_isa"] = xla.group(1)
    return caps


# oneDNN's ISA caps (torch reads ONEDNN_MAX_CPU_ISA, MXNet's older build DNNL_MAX_CPU_ISA) that
# still allow bf16 instructions: `make numerics` caps at AVX2, which takes them away.
_BF16_ISAS = ("ALL", "AVX512_CORE_BF16", "AVX512_CORE_AMX", "AVX10", "AMX")


def cpu_has_bf16() -> bool:
    """Whether the CPU has bf16 arithmetic (AVX512_BF16 or AMX-BF16) and no oneDNN ISA cap
    takes it away: where bf16 can pay on a CPU. Without it oneDNN emulates bf16 on AVX-512
    (slower than float32) and has no bf16 kernels at all on AVX2, where torch's autocast falls
    back to generic ones and MXNet's bf16 convolution fails (docs/design.md, Traps)."""
    for name in ISA_CAP_ENV:
        cap = os.environ.get(name, "").upper()
        if cap and not cap.startswith(_BF16_ISAS):
            return False
    return cpu_isa() in ("amx_bf16", "avx512_bf16")


def plan(gpus: int, platform: str = "auto", accelerators: int | None = None) -> DevicePlan:
    """Resolve a request for `gpus` devices; never silently fall back from GPU to CPU."""
    if platform not in PLATFORMS:
        raise DeviceError(f"unknown PLATFORM {platform!r}; choose one of {', '.join(PLATFORMS)}")
    if not isinstance(gpus, int) or gpus < 1:
        raise DeviceError(f"GPUS must be a whole number of at least 1, got {gpus!r}")
    if accelerators is None:
        accelerators = count_accelerators() if platform != "cpu" else 0
    if platform == "gpu" or (platform == "auto" and accelerators > 0):
        if accelerators == 0:
            raise DeviceError(
                "PLATFORM=gpu but this machine has no CUDA GPU; use PLATFORM=cpu (or auto) "
                "for virtual CPU devices"
            )
        if gpus > accelerators:
            raise DeviceError(
                f"GPUS={gpus} but this machine has {accelerators} GPU(s); "
                f"use GPUS<={accelerators}, or PLATFORM=cpu for {gpus} virtual CPU devices"
            )
        return DevicePlan(gpus, "gpu", virtual=False)
    if gpus > MAX_VIRTUAL:
        raise DeviceError(f"GPUS={gpus} virtual CPU devices is too many; use at most {MAX_VIRTUAL}")
    return DevicePlan(gpus, "cpu", virtual=True)


def notice(p: DevicePlan, cores_per_device: int | None = None) -> str | None:
    """The line to print when devices are virtual, so nobody mistakes them for accelerators."""
    if not p.virtual:
        return None
    if cores_per_device:
        return (
            f"note: no accelerator in use; running on {p.describe()}: each with "
            f"{cores_per_device} CPU core(s) of its own (--cores-per-device)"
        )
    return (
        f"note: no accelerator in use; running on {p.describe()}: {p.count} virtual devices "
        f"sharing {os.cpu_count()} CPU core(s), so timings show overheads, not GPU speedups"
    )


JAX_HOST_FLAG = "--xla_force_host_platform_device_count"


def set_jax_host_devices(n: int) -> None:
    """Ask XLA for `n` host (CPU) devices. Must run before JAX is imported, which it checks:
    XLA_FLAGS read after JAX initialised its backend are silently ignored (docs/design.md,
    "Traps")."""
    if "jax" in sys.modules:
        raise DeviceError(
            "JAX was imported before the device count was set; call "
            "common.devices.set_jax_host_devices() before importing jax"
        )
    flags = re.sub(rf"{JAX_HOST_FLAG}=\d+", "", os.environ.get("XLA_FLAGS", "")).split()
    os.environ["XLA_FLAGS"] = " ".join([*flags, f"{JAX_HOST_FLAG}={n}"])


OMP_THREADS_ENV = "OMP_NUM_THREADS"


def cores_allowed() -> int:
    """The CPUs this process may run on (taskset, a cgroup's cpuset), not the machine's count."""
    return len(os.sched_getaffinity(0))


def set_mxnet_threads() -> bool:
    """Give MXNet every CPU this process may use: OMP_NUM_THREADS, unless the user set it.
    Unset, MXNet computes with half of an x86 machine's CPUs, taking each for one of a core's
    two hyperthreads (its src/engine/openmp.cc); on a machine with one thread per core that
    leaves half the cores idle. MXNet reads it once, when it loads: call this before. True when
    this set it."""
    if os.environ.get(OMP_THREADS_ENV):
        return False
    os.environ[OMP_THREADS_ENV] = str(cores_allowed())
    return True
