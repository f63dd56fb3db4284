"""The command line's checks of what a run asks for (common/cli.py `start`), each a one-line
ConfigError before any framework is imported: --compile, --amp, --ceiling and the options of a
run over several machines, and the note where bf16 runs but cannot pay.
"""

from __future__ import annotations

import argparse
import os

from common import config, devices, processes

COMPILE_SCOPE = "--compile applies to torch lenet, resnet18 and resnet50 single"


def check_compile(framework: str, args: argparse.Namespace, n_devices: int) -> None:
    """--compile asks for torch.compile, torch's counterpart of JAX's jit and Gluon's hybridize:
    refused in one line where there is no eager torch path to compile."""
    if not getattr(args, "compile", False):
        return
    if framework == "jax":
        raise config.ConfigError("--compile is for torch: JAX always compiles (jit); drop it")
    if args.workload == "zero":
        raise config.ConfigError(f"{COMPILE_SCOPE}, not zero; drop it")
    if framework == "mxnet":
        raise config.ConfigError(
            "--compile is for torch: MXNet's resnet18 and resnet50 are hybridized (compiled) "
            "already and its lenet runs NDArray operations, which do not compile; drop it"
        )
    if args.workload == "resnet50" and args.sweep:
        raise config.ConfigError(f"{COMPILE_SCOPE}, not the --sweep; drop it")
    default = "single" if n_devices == 1 else "single, model_parallel and pipeline"
    strategy = args.strategy or (default if args.workload == "resnet50" else "ddp")
    if args.workload == "resnet50" and strategy != "single":
        raise config.ConfigError(f"{COMPILE_SCOPE}, not resnet50 {strategy}; drop it")
    if args.workload == "resnet18" and strategy == "dataparallel" and n_devices > 1:
        # nn.DataParallel copies the module onto each GPU per step; a compiled module's copies
        # would all call the original on GPU 0. DDP compiles the module of each process.
        raise config.ConfigError("--compile with dataparallel runs on 1 GPU; use --strategy ddp")


def check_amp(framework: str, args: argparse.Namespace, platform: str) -> None:
    """--amp bf16 where a bf16 path exists, else one line (resnet50's is in stages)."""
    if getattr(args, "amp", "off") == "off":
        return
    if args.workload == "lenet":
        raise config.ConfigError("lenet runs in float32 only, like the book; drop --amp")
    if args.workload == "zero":
        raise config.ConfigError(
            "zero runs in float32, the byte counts ZeRO's closed forms give; drop --amp"
        )
    if framework == "mxnet" and platform == "gpu":
        raise config.ConfigError(
            "MXNet 1.9's bf16 kernels are oneDNN's, for the CPU: on a GPU use --amp off"
        )


BUCKETED = {"resnet18": ("shard_map", "pmap"), "zero": ("fsdp_explicit",)}


def packs_buckets(framework: str, workload: str | None, strategy: str | None) -> bool:
    """Whether the strategy packs its gradients into buckets itself (JAX's explicit
    collectives), so that --unbucketed applies and its record says which it ran."""
    return framework == "jax" and strategy in BUCKETED.get(workload, ())


def check_unbucketed(framework: str, args: argparse.Namespace) -> None:
    """--unbucketed where a JAX strategy packs its gradients itself, else one line."""
    if not getattr(args, "unbucketed", False):
        return
    if not packs_buckets(framework, args.workload, args.strategy):
        raise config.ConfigError(
            "--unbucketed applies to JAX's explicit collectives (resnet18 shard_map and pmap, "
            "zero fsdp_explicit), whose buckets the strategy packs itself; drop it"
        )


def check_sync_bn(framework: str, args: argparse.Namespace, platform: str) -> None:
    """--sync-bn where the engine synchronises BatchNorm across the devices of a data-parallel
    run (torch SyncBatchNorm, JAX's axis_name), else one line."""
    if not getattr(args, "sync_bn", False):
        return
    if args.workload != "resnet18":
        raise config.ConfigError("--sync-bn is for resnet18 (the data-parallel BatchNorm); drop it")
    if framework == "mxnet":
        raise config.ConfigError(
            "MXNet has no BatchNorm synchronised across dist workers (gluon.contrib's "
            "SyncBatchNorm spans one process's GPUs): drop --sync-bn"
        )
    if framework == "torch" and args.strategy == "dataparallel":
        raise config.ConfigError("torch's SyncBatchNorm runs under DDP only: use --strategy ddp")
    if framework == "torch" and platform != "gpu":
        raise config.ConfigError(
            "torch's SyncBatchNorm runs on CUDA devices only: on the CPU drop --sync-bn"
        )


def check_ceiling(args: argparse.Namespace, n_devices: int) -> None:
    """--ceiling times the framework's ceiling (common/ceiling.py) inside the run: one device."""
    if not getattr(args, "ceiling", False):
        return
    if args.workload == "resnet50":
        raise config.ConfigError(
            "--ceiling covers lenet and resnet18 (resnet50's repeats are a tight loop already)"
        )
    processes = os.environ.get("JAX_NUM_PROCESSES", "1").strip() not in ("", "1")
    if n_devices != 1 or getattr(args, "nnodes", None) or args.strategy == "dist" or processes:
        raise config.ConfigError("--ceiling runs in one process on one device: drop it")


def bf16_note(framework: str, args: argparse.Namespace, platform: str) -> str | None:
    """A note where --amp bf16 runs but cannot pay: torch or JAX on a CPU without bf16
    arithmetic (devices.cpu_has_bf16; MXNet refuses there or emulates, docs/design.md)."""
    if getattr(args, "amp", "off") != "bf16" or framework == "mxnet" or platform != "cpu":
        return None
    if devices.cpu_has_bf16():
        return None
    return f"note: this CPU has no bf16 arithmetic (AVX512_BF16 or AMX): {BF16_COST[framework]}"


# What bf16 cost on a CPU without bf16 arithmetic (results/cpu-avx2-2core.jsonl).
BF16_COST = {
    "torch": "torch's bf16 convolutions fall back to generic kernels, measured at 21x float32's "
    "time on an AVX2 CPU; use --amp off",
    "jax": "XLA's bf16 steps took 0.72-1.19x float32's time on an AVX2 CPU (three measured "
    "pairs): no consistent gain",
}


NODE_OPTIONS = ("--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-timeout")
MAX_TIMEOUT_S = 86400  # a day: a longer wait is a slip of the keyboard, and overflows clocks
NODES_SCOPE = (
    "--nnodes, --node-rank and --rdzv-* apply to the multi-node engines of resnet18 (torch ddp, "
    "JAX sharding and shard_map, MXNet dist), zero's strategies, and their allreduce"
)
# Each framework's engine over several machines: torchrun's c10d rendezvous, jax.distributed's
# coordinator, ps-lite's scheduler (each at node 0's --rdzv-endpoint).
NODE_STRATEGIES = {"torch": "ddp", "jax": "sharding", "mxnet": "dist"}
# resnet18's strategies that run there: JAX's shard_map is one program over the same Mesh as
# sharding, its collectives written out (and bucketed).
RESNET18_NODE_STRATEGIES = {"torch": ("ddp",), "jax": ("sharding", "shard_map"), "mxnet": ("dist",)}
# zero's strategies that run there too: each is one process per device under the same engine.
ZERO_NODE_STRATEGIES = {
    "torch": ("ddp", "zero1", "zero2", "zero3"),
    "jax": ("sharding", "fsdp", "fsdp_explicit"),
    "mxnet": ("dist", "server"),
}


def node_strategies(workload: str | None) -> dict[str, tuple[str, ...]]:
    """Each framework's strategies of `workload` that run over several machines."""
    return ZERO_NODE_STRATEGIES if workload == "zero" else RESNET18_NODE_STRATEGIES


def check_nodes(framework: str, args: argparse.Namespace) -> None:
    """The options of a run over several machines (torchrun's c10d rendezvous): refused in one
    line where they do not apply, and checked before a framework is imported."""
    given = [o for o in NODE_OPTIONS if getattr(args, o[2:].replace("-", "_"), None) is not None]
    if not given:
        return
    if args.workload not in ("resnet18", "zero", "allreduce"):
        raise config.ConfigError(f"{NODES_SCOPE}, not {args.workload}; drop {given[0]}")
    engine = NODE_STRATEGIES[framework]
    if args.workload != "allreduce" and args.strategy in node_strategies(args.workload)[framework]:
        engine = args.strategy
    if args.strategy not in (None, engine):
        raise config.ConfigError(
            f"{NODES_SCOPE}, not {framework} resnet18 {args.strategy}; drop {given[0]}"
        )
    args.strategy = engine  # several machines run the framework's multi-node engine
    missing = [o for o in NODE_OPTIONS[:3] if o not in given]
    if missing:
        raise config.ConfigError(
            f"a run over several machines needs --nnodes, --node-rank and --rdzv-endpoint on "
            f"every node; {missing[0]} is missing"
        )
    if args.nnodes < 2:
        raise config.ConfigError(
            f"--nnodes must be at least 2, got {args.nnodes}; on one machine drop --nnodes, "
            "--node-rank and --rdzv-*"
        )
    if not 0 <= args.node_rank < args.nnodes:
        raise config.ConfigError(
            f"--node-rank must be 0 to {args.nnodes - 1} for --nnodes {args.nnodes}, got "
            f"{args.node_rank}; give each node its own"
        )
    processes.port_of(args.rdzv_endpoint, "--rdzv-endpoint")
    check_seconds("--rdzv-timeout", args.rdzv_timeout)


def check_seconds(option: str, seconds: int | None) -> None:
    """A wait's bound, from 1 s to MAX_TIMEOUT_S (the engines' and Python's clocks overflow
    far above it: a thread's traceback, and the wait without its bound)."""
    if seconds is not None and seconds < 1:
        raise config.ConfigError(f"{option} must be at least 1 s, got {seconds}")
    if seconds is not None and seconds > MAX_TIMEOUT_S:
        raise config.ConfigError(
            f"{option} must be at most {MAX_TIMEOUT_S} s (a day), got {seconds}"
        )


def check_peer_timeout(framework: str, args: argparse.Namespace, n_devices: int) -> None:
    """--peer-timeout bounds a run of several processes (common/watchdog.py, and on several
    machines the engines' own waits): refused in one line where the run has one process."""
    check_seconds("--peer-timeout", args.peer_timeout)
    if args.peer_timeout is None or several_processes(framework, args, n_devices):
        return
    raise config.ConfigError(
        "--peer-timeout bounds a run of several processes (torch ddp or MXNet dist on 2 or more "
        "devices, JAX_NUM_PROCESSES, --nnodes); this run has one: drop it"
    )


def several_processes(framework: str, args: argparse.Namespace, n_devices: int) -> bool:
    """Whether the run is one of several processes that wait for each other."""
    if getattr(args, "nnodes", None) is not None:
        return True
    if framework == "jax":
        return os.environ.get("JAX_NUM_PROCESSES", "1").strip() not in ("", "0", "1")
    if n_devices < 2 or args.workload not in ("resnet18", "zero", "allreduce"):
        return False
    strategy = args.strategy or {"torch": "ddp"}.get(framework)
    if args.workload == "zero":
        return strategy in ZERO_NODE_STRATEGIES[framework] or framework == "torch"
    return args.workload == "allreduce" or strategy == NODE_STRATEGIES[framework]
