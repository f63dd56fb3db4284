"""--profile DIR: a run's first timed epoch traced by its framework's own profiler.

Each framework's `devices.profiler(path)` (torch.profiler, jax.profiler, mx.profiler) writes a
Chrome trace at `path` plus its extension, which Perfetto (ui.perfetto.dev) or chrome://tracing
opens and `python -m compare.profile DIR` summarises the same way for all three. With --ceiling
the first timed ceiling repeat is traced beside the epoch, so the two can be set side by side:
what the training loop runs that the tight loop does not.

Tracing slows what it traces, so a profiled run writes no results record: its epoch times are
printed, not kept. The timer enters the profiler outside its clock (common.timing.Timer).
"""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from common import config

WORKLOADS = ("lenet", "resnet18")
PARTS = ("epoch", "ceiling")  # the first timed epoch; the first timed ceiling repeat


def trace_path(directory: str | Path, framework: str, workload: str, part: str, rank: int = 0):
    """DIR/<framework>-<workload>-<part>[-rank<r>], the framework adding its extension; a DDP
    rank other than 0 traces its own process to a file of its own."""
    suffix = f"-rank{rank}" if rank else ""
    return Path(directory) / f"{framework}-{workload}-{part}{suffix}"


def check(framework: str, args: argparse.Namespace) -> None:
    """--profile: a workload it covers and a folder it can write, or one line, before any work."""
    directory = getattr(args, "profile", None)
    if directory is None:
        return
    if args.workload not in WORKLOADS:
        raise config.ConfigError(
            f"--profile covers {' and '.join(WORKLOADS)}, not {args.workload}; drop it"
        )
    if framework == "mxnet" and getattr(args, "ceiling", False):
        raise config.ConfigError(
            "--profile with --ceiling: MXNet's profiler writes one trace per process; trace the "
            "ceiling apart (python -m mxnet_impl.ceiling --profile DIR)"
        )
    path = Path(directory)
    parent = next((p for p in path.parents if p.exists()), Path("."))
    if path.exists() and not path.is_dir():
        raise config.ConfigError(f"--profile {directory}: not a folder; name a folder")
    writable = path if path.exists() else parent
    if not writable.is_dir() or not os.access(writable, os.W_OK | os.X_OK):
        raise config.ConfigError(
            f"--profile {directory}: cannot write there ({writable}); name another folder"
        )


def tracer(
    framework: str, args: argparse.Namespace, part: str, rank: int = 0
) -> Callable[[], AbstractContextManager] | None:
    """The Timer's `trace` for --profile (None without it): the framework's profiler, writing
    this part's trace into the --profile folder."""
    directory = getattr(args, "profile", None)
    if directory is None:
        return None
    profiler = importlib.import_module(f"{framework}_impl.devices").profiler
    path = trace_path(directory, framework, args.workload, part, rank)

    def trace() -> AbstractContextManager:
        path.parent.mkdir(parents=True, exist_ok=True)  # made when the trace starts, not before
        return profiler(path)

    return trace


def skip_note(directory: str, traced: str = "epoch") -> str:
    """Why a profiled run (or ceiling: `traced` "repeat") appended no record, and where to look."""
    return (
        f"--profile: traces in {directory} (python -m compare.profile {directory}); no record "
        f"written: tracing slowed the {traced} it traced"
    )
