"""The plan of `make compare` (compare/run.py): which runs, with which flags, and why the others
are left out on this machine. A pure function of the request, the accelerator count and the
CPU's bf16 arithmetic, so a one-GPU machine's plan prints anywhere (`--dry-run --assume-gpus 1`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from common import checks as zero_checks
from common import config, devices

ALL = ("torch", "jax", "mxnet")
# Every 1-device run of these times its framework's ceiling after each epoch (--ceiling).
CEILING_WORKLOADS = ("lenet", "resnet18")


@dataclass(frozen=True)
class Run:
    workload: str
    gpus: int
    frameworks: tuple[str, ...]
    strategy: str | None  # None: the framework's default
    flags: tuple[str, ...] = ()
    # "cuda": platform gpu only; "1gpu": only with exactly one GPU; "bf16": a GPU or a CPU with
    # bf16 arithmetic (devices.cpu_has_bf16); "cpu-bf16": such a CPU, never a GPU
    needs: str | None = None
    why: str = ""
    # On a CPU: each device with cores of its own (--cores-per-device, PINNED_FLAGS), so that
    # the 1- and 2-device runs of a row compare like with like; on GPUs, a plain run.
    pinned: bool = False


# Each framework's plain path (float32; torch eager) runs on 1 and 2 devices; beside it on one
# device its faster paths: bf16 where it can pay (BF16_WHY), torch compiled. A row a machine
# cannot run is skipped with its reason.
BF16, COMPILED = ("--amp", "bf16"), ("--compile",)
DP_CUDA = "nn.DataParallel without CUDA silently runs the plain module"
BF16_WHY = (
    "a GPU or a CPU with AVX512_BF16 or AMX; without them bf16 did not pay in ResNet-18 steps "
    "measured on a 2-core AVX2 CPU: torch 21x float32's time, JAX 0.72-1.19x in three pairs "
    "(results/cpu-avx2-2core.jsonl)"
)
MX_BF16 = (
    "MXNet's bf16 kernels are oneDNN's, for CPUs only: they fail on AVX2, and emulated on AVX-512 "
    "without AVX512_BF16 they were measured 2.6x slower than float32 (docs/design.md, Traps)"
)
# The scaling runs on a CPU time fewer steps than the 1-device comparison (the records say so).
PINNED_FLAGS = {
    "lenet": ("--epochs", "3"),
    "resnet18": ("--steps-per-epoch", "5"),
    "resnet50": (),
    "zero": ("--steps-per-epoch", "5"),
}
PINNED_1 = "only on a CPU: the 1-device baseline of the 2-device run, on one device's cores"
ONE_GPU = "the 2-device runs cannot run: at least the single-device time"
ONE_GPU_SWEEP = "the 2-device sweep cannot run: the split sizes with both stages on the one GPU"
# Lesson 4 (zero): what it measures is memory and bytes, which a step's shards and program give
# whatever the epoch's length, so each run times few steps (PINNED_FLAGS). Every strategy runs
# on 2 devices, a core each, as the plan's other scaling runs (a 2-core CPU gives no more
# devices a core of their own); each framework's plain data parallel (ZERO_BASELINES) on 1
# device too: the baseline of every strategy's time, and the closed forms at N = 1. A sharded
# strategy on 1 device holds what DDP holds, so it is not run.
ZERO_STRATEGIES = zero_checks.ZERO_NODE_STRATEGIES  # every zero strategy, its baseline first
ZERO_BASELINES = {fw: strategies[0] for fw, strategies in ZERO_STRATEGIES.items()}
ZERO_RUNS = tuple(
    Run("zero", n, (fw,), strategy, pinned=True)
    for fw, strategies in ZERO_STRATEGIES.items()
    for strategy in strategies
    for n in ((1, 2) if strategy == ZERO_BASELINES[fw] else (2,))
)
RUNS: tuple[Run, ...] = (
    Run("lenet", 1, ALL, None),
    Run("lenet", 1, ALL, None, (), "cpu", PINNED_1, pinned=True),
    Run("lenet", 2, ALL, None, pinned=True),
    Run("lenet", 1, ("torch",), None, COMPILED),
    Run("resnet18", 1, ("torch",), "ddp"),
    Run("resnet18", 1, ("torch",), "ddp", (), "cpu", PINNED_1, pinned=True),
    Run("resnet18", 2, ("torch",), "ddp", pinned=True),
    Run("resnet18", 1, ("torch",), "ddp", BF16, "bf16", BF16_WHY),
    Run("resnet18", 1, ("torch",), "ddp", COMPILED),
    Run("resnet18", 1, ("torch",), "ddp", COMPILED + BF16, "bf16", BF16_WHY),
    Run("resnet18", 1, ("torch",), "dataparallel", (), "cuda", DP_CUDA),
    Run("resnet18", 2, ("torch",), "dataparallel", (), "cuda", DP_CUDA),
    Run("resnet18", 1, ("torch",), "dataparallel", COMPILED, "cuda", DP_CUDA),
    Run("resnet18", 1, ("jax",), "sharding"),
    Run("resnet18", 1, ("jax",), "sharding", (), "cpu", PINNED_1, pinned=True),
    Run("resnet18", 2, ("jax",), "sharding", pinned=True),
    Run("resnet18", 1, ("jax",), "sharding", BF16, "bf16", BF16_WHY),
    Run("resnet18", 1, ("jax",), "shard_map"),
    Run("resnet18", 1, ("jax",), "shard_map", (), "cpu", PINNED_1, pinned=True),
    Run("resnet18", 2, ("jax",), "shard_map", pinned=True),
    Run("resnet18", 1, ("jax",), "pmap"),
    Run("resnet18", 1, ("jax",), "pmap", (), "cpu", PINNED_1, pinned=True),
    Run("resnet18", 2, ("jax",), "pmap", pinned=True),
    Run("resnet18", 1, ("mxnet",), "gluon"),
    Run("resnet18", 1, ("mxnet",), "gluon", (), "cpu", PINNED_1, pinned=True),
    Run("resnet18", 2, ("mxnet",), "gluon", pinned=True),
    Run("resnet18", 1, ("mxnet",), "dist", (), "cpu", PINNED_1, pinned=True),
    Run("resnet18", 2, ("mxnet",), "dist", pinned=True),
    Run("resnet18", 1, ("mxnet",), "gluon", BF16, "cpu-bf16", MX_BF16),
    Run("resnet50", 2, ALL, None, pinned=True),  # single, model_parallel, pipeline
    Run("resnet50", 2, ALL, None, ("--sweep",), pinned=True),  # split_size sweep
    Run("resnet50", 2, ("torch",), "gpipe", pinned=True),
    Run("resnet50", 2, ("torch",), "1f1b", pinned=True),
    *ZERO_RUNS,
    Run("resnet50", 1, ALL, None, (), "1gpu", ONE_GPU),
    Run("resnet50", 1, ALL, None, ("--sweep",), "1gpu", ONE_GPU_SWEEP),
)


MAX_DEVICES = 2  # the most devices a run of the plan asks for


def _step(fw: str, run: Run, platform: str, cpu_cores: int) -> Step:
    """The command of `run` for `fw`: on a CPU, a pinned run gives each device its share of
    the cores and times fewer steps (PINNED_FLAGS)."""
    if not (run.pinned and platform == "cpu"):
        return Step(fw, run.workload, run.gpus, run.strategy, run.flags)
    flags = (*run.flags, *PINNED_FLAGS[run.workload])
    return Step(fw, run.workload, run.gpus, run.strategy, flags, max(1, cpu_cores // MAX_DEVICES))


class PlanError(ValueError):
    """An impossible request: one line for the user."""


@dataclass(frozen=True)
class Step:
    """One command of the plan."""

    framework: str
    workload: str
    gpus: int
    strategy: str | None
    flags: tuple[str, ...]
    cores: int | None = None  # cores per device (--cores-per-device); None: shared cores

    def args(self, platform: str, preset: str, results: str) -> list[str]:
        argv = ["-m", f"{self.framework}_impl", "--workload", self.workload]
        argv += ["--gpus", str(self.gpus), "--platform", platform, "--preset", preset]
        if self.strategy:
            argv += ["--strategy", self.strategy]
        if self.cores:
            argv += ["--cores-per-device", str(self.cores)]
        elif self.gpus == 1 and self.workload in CEILING_WORKLOADS:
            argv += ["--ceiling"]
        return [*argv, *self.flags, "--results", results, "--no-progress"]

    def describe(self) -> str:
        what = self.strategy or "default strategies"
        flags = " " + " ".join(self.flags) if self.flags else ""
        cores = f", {self.cores} core(s) per device" if self.cores else ""
        return f"{self.framework} {self.workload} on {self.gpus} device(s){cores}, {what}{flags}"


@dataclass(frozen=True)
class Plan:
    platform: str  # "gpu" or "cpu"
    preset: str
    accelerators: int
    steps: tuple[Step, ...]
    skipped: tuple[tuple[Step, str], ...]


def make_plan(
    frameworks,
    workloads,
    platform: str,
    accelerators: int,
    preset: str | None = None,
    cpu_bf16: bool = False,
    cpu_cores: int = 2,
) -> Plan:
    """The runs for this machine, from the request, the accelerator count, whether the CPU has
    bf16 arithmetic (devices.cpu_has_bf16) and the cores it may use."""
    asked = [("framework", fw, ALL) for fw in frameworks]
    asked += [("workload", w, config.WORKLOADS) for w in workloads]
    asked += [("platform", platform, devices.PLATFORMS)]
    asked += [("preset", preset, config.PRESETS)] if preset is not None else []
    for what, name, known in asked:
        if name not in known:
            raise PlanError(f"unknown {what} {name!r}; choose from {', '.join(known)}")
    if platform == "gpu" and accelerators == 0:
        raise PlanError("--platform gpu but this machine has no CUDA GPU; use auto or cpu")
    resolved = "gpu" if platform == "gpu" or (platform == "auto" and accelerators > 0) else "cpu"
    preset = preset or config.default_preset(resolved == "gpu")
    steps, skipped = [], []
    for workload in workloads:
        for fw in ALL:
            if fw not in frameworks:
                continue
            for run in RUNS:
                if run.workload != workload or fw not in run.frameworks:
                    continue
                step = _step(fw, run, resolved, cpu_cores)
                if run.needs == "1gpu" and not (resolved == "gpu" and accelerators == 1):
                    continue  # a stand-in for the 2-device runs, where those cannot run
                if run.needs == "cpu" and resolved != "cpu":
                    continue  # a CPU's scaling baseline: a GPU is a device of its own already
                if run.pinned and resolved == "cpu" and cpu_cores < MAX_DEVICES:
                    skipped.append((step, f"needs {MAX_DEVICES} cores: one per device"))
                elif run.needs == "cuda" and resolved != "gpu":
                    skipped.append((step, f"needs CUDA: {run.why}"))
                elif run.needs == "bf16" and not (resolved == "gpu" or cpu_bf16):
                    skipped.append((step, f"needs bf16 arithmetic: {run.why}"))
                elif run.needs == "cpu-bf16" and (resolved == "gpu" or not cpu_bf16):
                    skipped.append((step, f"needs a CPU with bf16 arithmetic: {run.why}"))
                elif resolved == "gpu" and run.gpus > accelerators:
                    skipped.append(
                        (step, f"needs {run.gpus} GPUs; this machine has {accelerators}")
                    )
                else:
                    steps.append(step)
    return Plan(resolved, preset, accelerators, tuple(steps), tuple(skipped))


def select(plan: Plan, spec: list[str] | None) -> Plan:
    """`plan` with only the steps `spec` names (--steps: numbers and ranges such as 1-4), in the
    plan's order; None: all of them."""
    if spec is None:
        return plan
    total, chosen = len(plan.steps), set()
    for token in spec:
        first, _, last = token.partition("-")
        if not (first.isdigit() and (last.isdigit() or not last)):
            raise PlanError(f"--steps {token!r}: give step numbers or ranges, such as 1-4 7")
        lo, hi = int(first), int(last or first)
        if not 1 <= lo <= hi <= total:
            raise PlanError(f"--steps {token}: the plan has steps 1 to {total} (see --dry-run)")
        chosen.update(range(lo, hi + 1))
    steps = tuple(s for i, s in enumerate(plan.steps, start=1) if i in chosen)
    return dataclasses.replace(plan, steps=steps)
