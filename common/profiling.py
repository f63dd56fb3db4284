"""--profile DIR: a run's first timed epoch (resnet50: repeat) traced by its framework's profiler.

Each framework's `devices.profiler(path)` (torch.profiler, jax.profiler, mx.profiler) writes a
Chrome trace at `path` plus its extension, which Perfetto (ui.perfetto.dev) or chrome://tracing
opens and `python -m common.traces DIR` summarises the same way for all three. With --ceiling
the first timed ceiling repeat is traced beside the epoch, so the two can be set side by side:
what the training loop runs that the tight loop does not.

Tracing slows what it traces, so a profiled run writes no results record: its epoch times are
printed, not kept. The timer enters the profiler outside its clock (common.timing.Timer).
MXNet's profiler writes one Chrome trace per process, so MXNet traces one run per process.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from common import config, results

Tracer = Callable[[], AbstractContextManager]


def trace_path(directory: str | Path, framework: str, workload: str, part: str, rank: int = 0):
    """DIR/<framework>-<workload>-<part>[-rank<r>], the framework adding its extension; a DDP
    rank other than 0 traces its own process to a file of its own."""
    suffix = f"-rank{rank}" if rank else ""
    return Path(directory) / f"{framework}-{workload}-{part}{suffix}"


def check(framework: str, args: argparse.Namespace, n_devices: int = 1) -> None:
    """--profile: what it can trace and a folder it can write, or one line, before any work."""
    directory = getattr(args, "profile", None)
    if directory is None:
        return
    several = args.workload == "resnet50" and (args.sweep or (n_devices > 1 and not args.strategy))
    if framework == "mxnet" and (getattr(args, "ceiling", False) or several):
        what = "--ceiling" if getattr(args, "ceiling", False) else "several resnet50 runs"
        raise config.ConfigError(
            f"--profile with {what}: MXNet's profiler writes one trace per process; trace one "
            "run at a time (one --strategy; the ceiling apart: python -m mxnet_impl.ceiling)"
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


def tracer(hooks, args: argparse.Namespace, part: str, rank: int = 0) -> Tracer | None:
    """The Timer's `trace` for --profile (None without it): the framework's profiler
    (`hooks.profiler`: its `devices.profiler`), writing this part's trace into the folder."""
    directory = getattr(args, "profile", None)
    return tracer_at(hooks, directory, args.workload, part, rank) if directory else None


def tracer_at(hooks, directory: str | None, workload: str, part: str, rank: int = 0):
    """`tracer` for a process that has the --profile folder but not the command line (a worker
    of torch's pipelining engine); None when `directory` is."""
    if directory is None:
        return None
    profiler = hooks.devices.profiler
    path = trace_path(directory, hooks.framework, workload, part, rank)

    def trace() -> AbstractContextManager:
        path.parent.mkdir(parents=True, exist_ok=True)  # made when the trace starts, not before
        return profiler(path)

    return trace


def resnet50_traces(hooks, args: argparse.Namespace, strategy: str, split_sizes, sweep):
    """{split size: the Timer's `trace`} of one resnet50 run (None each without --profile):
    DIR/<framework>-resnet50-<strategy>, or -pipeline-split<s> for each of a sweep's."""
    return {
        s: tracer(hooks, args, f"{strategy}-split{s}" if sweep else strategy) for s in split_sizes
    }


def append(rec: results.Record, path, traced: str = "epoch") -> None:
    """Append the record to `path`; a profiled run's (--profile) instead says why it keeps none
    (tracing slowed its first timed `traced`: epoch, or repeat) and where its traces are."""
    directory = rec.extra.get("profile")
    if directory is None:
        results.append(rec, path)
        return
    print(
        f"--profile: traces in {directory} (python -m common.traces {directory}); no record "
        f"written: tracing slowed the {traced} it traced",
        file=sys.stderr,
    )
