"""The command line shared by `python -m torch_impl`, `-m jax_impl` and `-m mxnet_impl`: its
arguments, their checks, and the entry point.

Each framework's `__main__` calls `run(framework, argv, before_import, load)` under
`signals.main` (a torchrun rank calls `start` inside torch_impl.guard.worker_main, which ends it
for torchrun): the arguments are parsed and checked, the devices resolved and the workload's
config built here, before any framework is imported; then `before_import(plan)`
(the framework's settings that must precede its import), `load(workload)`, which imports the
workload module `<framework>_impl.<workload>` and returns it with the framework's
harness.Hooks, and its `main(args, plan, cfg, hooks)`, which trains and records through
common.harness. Bad input ends in one line on stderr and exit code 2 (EXIT_BAD_INPUT), a run
that diverged in exit code 4 (after its record), a stop in the shell's code for the signal.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

from common import (
    checks,
    config,
    cores,
    data,
    devices,
    processes,
    profiling,
    results,
    signals,
    training,
    watchdog,
    weights,
)

EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 4
EXIT_INTERRUPTED = 130  # the shell's code for Ctrl-C
RDZV_TIMEOUT_S = 300  # the default wait for every node to join a run over several machines
PEER_TIMEOUT_S = watchdog.PEER_TIMEOUT_S  # ... and for a lost peer or link, once joined
# Set by a launcher that printed the no-accelerator note: the workers it starts do not repeat it.
NOTE_SHOWN_ENV = "MULTIDEVICE_NOTE_SHOWN"
USER_ERRORS = (
    training.Diverged,
    config.ConfigError,
    devices.DeviceError,
    data.DatasetError,
    results.ResultsError,
    weights.WeightsError,
)


def whole_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    return value


def learning_rate(text: str) -> float:
    """--lr: refused as typed, before float64 rounds it (`1e-400` is 0.0, `1e400` inf)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"lr must be a positive finite number, got {text}")
    return value


def parser(framework: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m {framework}_impl",
        description=f"Multi-device training in {framework}: one workload, one results record.",
    )
    p.add_argument("--workload", required=True, choices=config.WORKLOADS)
    p.add_argument("--gpus", type=whole_number, default=1, help="number of devices (default 1)")
    p.add_argument(
        "--platform", default=os.environ.get("PLATFORM", "auto"), choices=devices.PLATFORMS
    )
    p.add_argument(
        "--preset",
        default=None,
        choices=config.PRESETS,
        help="smoke | cpu | full (default: full with accelerators, cpu without)",
    )
    p.add_argument("--strategy", default=None, help="parallel strategy (workload-specific)")
    p.add_argument("--epochs", type=whole_number, default=None)
    p.add_argument("--batch-size", type=whole_number, default=None)
    p.add_argument("--lr", type=learning_rate, default=None)
    p.add_argument(
        "--steps-per-epoch",
        type=whole_number,
        default=None,
        help="resnet18, zero: time this many steps per epoch and extrapolate the epoch's time",
    )
    p.add_argument("--split-size", type=whole_number, default=None, help="resnet50 pipeline")
    p.add_argument("--sweep", action="store_true", help="resnet50: sweep the preset's split sizes")
    _switches(p)
    _node_options(p)
    p.add_argument(
        "--results", default=str(results.DEFAULT_PATH), help="JSON Lines file to append to"
    )
    p.add_argument(
        "--no-progress", action="store_true", help="plain lines instead of a progress bar"
    )
    return p


def _switches(p: argparse.ArgumentParser) -> None:
    """What a run computes beside its workload: precision, BatchNorm, buckets, compile, ceiling,
    profile."""
    p.add_argument("--amp", choices=("off", "bf16"), default="off", help="mixed precision")
    p.add_argument(
        "--sync-bn",
        action="store_true",
        help="resnet18: BatchNorm over the whole batch of all devices, not each device's share "
        "(the default, as DDP and Gluon); JAX, and torch DDP on CUDA",
    )
    p.add_argument(
        "--unbucketed",
        action="store_true",
        help="JAX resnet18 shard_map and pmap, zero fsdp_explicit: a collective per array, as "
        "XLA:CPU runs them, not the gradients packed into one buffer first (the default)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch lenet, resnet18 and resnet50 single: torch.compile the model (in the warm-up)",
    )
    p.add_argument(
        "--ceiling",
        action="store_true",
        help="lenet, resnet18 on 1 device: also time the framework's ceiling after each epoch",
    )
    p.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="trace the first timed epoch (resnet50: repeat; --ceiling: and its first repeat) "
        "into DIR with the framework's profiler; writes no record",
    )


def _node_options(p: argparse.ArgumentParser) -> None:
    """Each device's cores; resnet18's engines over several machines (check_nodes)."""
    p.add_argument(
        "--cores-per-device",
        type=whole_number,
        default=None,
        metavar="K",
        help="give each device K CPU cores of its own and K threads (default: the devices share "
        "every core this process may use)",
    )
    p.add_argument(
        "--nnodes", type=whole_number, default=None, help="resnet18: machines in the run"
    )
    p.add_argument(
        "--node-rank", type=whole_number, default=None, help="this machine: 0 .. nnodes - 1"
    )
    p.add_argument(
        "--rdzv-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="node 0's address and a free port there, the same on every node",
    )
    p.add_argument(
        "--rdzv-timeout",
        type=whole_number,
        default=None,
        help=f"seconds to wait for every node to join (default {RDZV_TIMEOUT_S})",
    )
    p.add_argument(
        "--peer-timeout",
        type=whole_number,
        default=None,
        help="seconds a process of several waits for a lost peer or link before it ends, in "
        f"one line (default {PEER_TIMEOUT_S}; a slow step, compile or evaluation gets longer)",
    )


def overrides(args: argparse.Namespace) -> dict:
    """Command-line settings that replace preset values (None: keep the preset's)."""
    if args.workload != "resnet50" and (args.split_size is not None or args.sweep):
        raise config.ConfigError(
            f"--split-size and --sweep apply to resnet50 only, not {args.workload}; drop them"
        )
    steps = getattr(args, "steps_per_epoch", None)
    resnet18 = args.workload in config.RESNET18_WORKLOADS
    if not resnet18 and steps is not None:
        raise config.ConfigError(
            f"--steps-per-epoch applies to resnet18 and zero only, not {args.workload}; drop it"
        )
    return {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": args.lr,
        **({"split_size": args.split_size} if args.workload == "resnet50" else {}),
        **({"steps_per_epoch": steps} if resnet18 else {}),
    }


def config_of(args: argparse.Namespace):
    """The workload's config at the chosen preset with the command line's overrides."""
    return config.get_config(args.workload, args.preset, **overrides(args))


def run(
    framework: str,
    argv: list[str] | None = None,
    before_import: Callable[[devices.DevicePlan], None] | None = None,
    load: Callable | None = None,
) -> int:
    """`start`, with bad input, a diverged run and a stop (Ctrl-C, SIGTERM, SIGHUP) each
    ending in one line and its exit code; 0 when the run is recorded."""
    try:
        with signals.as_interrupt():
            start(framework, argv, before_import, load)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return exit_code(e)
    except KeyboardInterrupt as e:
        signals.say_stopped()
        return signals.exit_code(e)
    return 0


def exit_code(error: Exception) -> int:
    return EXIT_DIVERGED if isinstance(error, training.Diverged) else EXIT_BAD_INPUT


def start(framework, argv=None, before_import=None, load=None) -> None:
    """Parse and check everything (bad settings fail before a framework is imported), then
    `load(workload)`, the framework's (`<framework>_impl/__main__.py`): the workload's module and
    the framework's harness.Hooks; then the module's `main(args, plan, cfg, hooks)`."""
    signals.watch_launcher()  # started by a supervisor (a cluster's node): end with it
    args = parser(framework).parse_args(argv)
    absolute_paths()
    plan = devices.plan(args.gpus, args.platform)
    if args.preset is None:
        args.preset = config.default_preset(plan.platform == "gpu")
    cfg = config_of(args)
    checks.check_compile(framework, args, plan.count)
    checks.check_amp(framework, args, plan.platform)
    checks.check_sync_bn(framework, args, plan.platform)
    checks.check_unbucketed(framework, args)
    checks.check_ceiling(args, plan.count)
    checks.check_nodes(framework, args)
    checks.check_peer_timeout(framework, args, plan.count)
    if args.peer_timeout:  # for every process this one starts, and their own harness
        os.environ[watchdog.PEER_TIMEOUT_ENV] = str(args.peer_timeout)
    processes.check_environment(framework, args.workload, args.strategy)
    profiling.check(framework, args, plan.count)
    results.check_writable(args.results)  # before hours of training, not after
    if args.workload in ("lenet", *config.RESNET18_WORKLOADS):
        # Here, once, before the framework's import and before torchrun's or MXNet's
        # workers start: each would fail on its own, under its launcher's traceback.
        data.locate()
    # Cores per device, before any framework sizes its threads; a launcher's worker keeps its
    # slice of the cores its launcher claimed for the node.
    per_device = getattr(args, "cores_per_device", None)
    if per_device is not None and cores.narrow() is None:
        cores.claim(plan.count, per_device)
    if before_import is not None:
        before_import(plan)
    module, hooks = load(args.workload)
    note = devices.notice(plan, per_device)
    if note and not os.environ.get(NOTE_SHOWN_ENV):
        print(note, file=sys.stderr)
    if bf16 := checks.bf16_note(framework, args, plan.platform):
        print(bf16, file=sys.stderr)
    module.main(args, plan, cfg, hooks)


PATH_ENVS = ("FASHION_MNIST_DIR", "XDG_CACHE_HOME")


def absolute_paths() -> None:
    """The folders named in the environment, made absolute here: the workers that a launcher
    starts run in the repository's folder, where a relative name means another place."""
    for name in PATH_ENVS:
        if os.environ.get(name):
            os.environ[name] = str(Path(os.environ[name]).absolute())


def worker_argv(args: argparse.Namespace, **changes) -> list[str]:
    """The command line that reproduces `args` (with `changes`, e.g. strategy="ddp") for a
    worker process that a launcher starts: every option the parser knows, given or default,
    paths absolute, so a worker means what its launcher meant from any folder."""
    values = {**vars(args), **changes}
    argv = []
    for action in parser("torch")._actions:
        name, value = action.dest, values.get(action.dest)
        if not action.option_strings or name == "help" or value is None or value is False:
            continue
        if name in ("results", "profile"):
            value = str(Path(value).resolve())
        flag = action.option_strings[-1]
        argv += [flag] if value is True else [flag, str(value)]
    return argv
