"""Devices with cores of their own (`--cores-per-device K`, docs/design.md, "Devices").

Virtual CPU devices that share a machine's cores measure a scheme's overheads, never its
speedup: two devices on two shared cores each compute with both. With K cores per device, a run
on N devices keeps to N x K cores of its own, and every process computes with K threads per
device, so the 1-device run on K cores and the N-device run on N x K cores compare like with
like: speedup = t(1) / t(N) is data parallelism, not a change in threads.

How the cores are handed out: the command the user typed pins itself to the first N x K cores it
may use (`claim`) and says K in the environment; the processes a launcher starts inherit that
set, and each worker keeps its own slice of it (`narrow`): the i-th of P local processes takes
the i-th P-th of the node's cores. A framework's thread count is K per device: OMP_NUM_THREADS
(torch's intra-op threads, MXNet's OpenMP), and XLA's CPU pool, which is as large as the set of
cores the process may run on, so a JAX process is pinned before JAX starts.

How the devices then run (`execution`, in every record): one process per device ("processes":
torch DDP, MXNet dist, several JAX processes), one process whose framework may run its devices
at once ("concurrent": XLA's virtual devices, MXNet's contexts), or one process that runs them
one after another ("sequential": a torch process computes on its `cpu` devices in turn, so its
N devices can never be faster than one).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from common import config, devices

PER_DEVICE_ENV = "MULTIDEVICE_CORES_PER_DEVICE"  # K, set by the command that claimed the cores
NODE_ENV = "MULTIDEVICE_NODE_CORES"  # the cores it claimed: this node's, e.g. "0,1"
# A launcher's worker: its index among this node's processes and their number (torchrun says
# LOCAL_RANK and LOCAL_WORLD_SIZE itself).
LOCAL_INDEX_ENV, LOCAL_COUNT_ENV = "MULTIDEVICE_LOCAL_INDEX", "MULTIDEVICE_LOCAL_PROCESSES"
EXECUTIONS = ("single", "processes", "concurrent", "sequential")
# A lock per core that a command holds while its runs compute there: the kernel releases it
# when the holder ends, however it ends, so no lock outlives its command.
LOCK_DIR = Path("/run/lock") if Path("/run/lock").is_dir() else Path("/tmp")


def allowed() -> list[int]:
    """The CPUs this process may run on, in order (taskset, a cgroup's cpuset)."""
    return sorted(os.sched_getaffinity(0))


def claim(n_devices: int, per_device: int, env=None) -> list[int]:
    """Pin this process to the first `n_devices` x `per_device` cores it may use, set the
    threads per process to `per_device`, and say both in `env` (os.environ) for the processes
    it starts. One line (ConfigError) when the machine has too few."""
    env = os.environ if env is None else env
    mine, wanted = allowed(), n_devices * per_device
    if per_device < 1:
        raise config.ConfigError(f"--cores-per-device must be at least 1, got {per_device}")
    if wanted > len(mine):
        raise config.ConfigError(
            f"--cores-per-device {per_device} on {n_devices} device(s) needs {wanted} cores; "
            f"this process may use {len(mine)} ({_text(mine)}): use --cores-per-device "
            f"{max(1, len(mine) // n_devices)} or fewer devices"
        )
    node = mine[:wanted]
    os.sched_setaffinity(0, node)
    env[PER_DEVICE_ENV] = str(per_device)
    env[NODE_ENV] = _text(node)
    env[devices.OMP_THREADS_ENV] = str(per_device)
    return node


def local_process(env: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """(index, count) of this process among its node's launched processes, or None for a
    process nobody launched as one of several."""
    env = os.environ if env is None else env
    for index, count in (("LOCAL_RANK", "LOCAL_WORLD_SIZE"), (LOCAL_INDEX_ENV, LOCAL_COUNT_ENV)):
        if env.get(index, "").isdigit() and env.get(count, "").isdigit():
            return int(env[index]), int(env[count])
    return None


def narrow(env: Mapping[str, str] | None = None) -> list[int] | None:
    """In a launched worker of a run with cores per device: pin it to its slice of the node's
    cores (the i-th of P equal parts) and return them; None where there is nothing to narrow.
    Runs before the framework is imported (XLA sizes its pool by the cores allowed)."""
    env = os.environ if env is None else env
    local = local_process(env)
    if not env.get(PER_DEVICE_ENV) or not env.get(NODE_ENV) or local is None:
        return None
    node, (index, count) = parse(env[NODE_ENV]), local
    if count < 1 or len(node) % count or index >= count:
        raise config.ConfigError(
            f"{count} processes cannot share the cores {env[NODE_ENV]} evenly; "
            f"give each device the same number of cores"
        )
    size = len(node) // count
    slice_ = node[index * size : (index + 1) * size]
    os.sched_setaffinity(0, slice_)
    return slice_


def processes(env: Mapping[str, str] | None = None) -> int:
    """The processes a run's devices are spread over, from the engines' own environment:
    torchrun's WORLD_SIZE, ps-lite's DMLC_NUM_WORKER, JAX_NUM_PROCESSES; else 1."""
    env = os.environ if env is None else env
    if "TORCHELASTIC_RUN_ID" in env:
        return int(env.get("WORLD_SIZE", "1"))
    if env.get("DMLC_ROLE") == "worker":
        return int(env.get("DMLC_NUM_WORKER", "1"))
    text = env.get("JAX_NUM_PROCESSES", "1").strip()
    return int(text) if text.isdigit() else 1


def execution(framework: str, n_devices: int, env: Mapping[str, str] | None = None) -> str:
    """How this run's devices compute (module docstring): single, processes, concurrent or
    sequential; `n_devices`: every process's devices."""
    if n_devices == 1:
        return "single"
    if processes(env) == n_devices:
        return "processes"
    return "sequential" if framework == "torch" else "concurrent"


def record_fields(framework: str, n_devices: int, env: Mapping[str, str] | None = None) -> dict:
    """The record's `extra` fields: cores per device (None: the devices shared the cores),
    the cores this node used, and how its devices ran (`execution`)."""
    env = os.environ if env is None else env
    per_device = int(env[PER_DEVICE_ENV]) if env.get(PER_DEVICE_ENV) else None
    used = parse(env[NODE_ENV]) if env.get(NODE_ENV) else allowed()
    return {
        "cores_per_device": per_device,
        "cores_used": used,
        "execution": execution(framework, n_devices, env),
    }


def parse(text: str) -> list[int]:
    """`0,1,4` -> [0, 1, 4]."""
    return [int(c) for c in text.split(",") if c.strip()]


def _text(cores: list[int]) -> str:
    return ",".join(map(str, cores))


@contextlib.contextmanager
def held(cores: list[int], what: str, lock_dir: Path | None = None) -> Iterator[None]:
    """Hold `cores` for this command (`what`: its name in the line another one reads) until
    the block ends: one that holds any of them already refuses this one in one line naming its
    pid (config.ConfigError), where two would contend for the cores and both records be
    wrong."""
    with contextlib.ExitStack() as stack:
        for core in cores:
            stack.enter_context(_core_lock(core, what, lock_dir or LOCK_DIR))
        yield


@contextlib.contextmanager
def _core_lock(core: int, what: str, lock_dir: Path) -> Iterator[None]:
    path = lock_dir / f"multidevice-core{core}.lock"
    fd = None
    with contextlib.suppress(OSError):  # another user's lock, or no folder to write in: not held
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by what this starts
    if fd is None:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another command"
            raise config.ConfigError(
                f"core {core} is held by {holder}: run one {what} at a time on these cores, "
                "or wait for that one to end"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{what} (pid {os.getpid()})".encode(), 0)
        yield
    finally:
        os.close(fd)  # the lock goes with it
