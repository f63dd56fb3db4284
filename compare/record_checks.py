"""Whether a record read from a results file can be shown: every field the report reads is
checked here (compare/records.py calls `problem`), so a hand-edited or foreign record is left
out with its reason instead of ending the report in a traceback.
"""

from __future__ import annotations

import math

from common import cores, results
from common.results import Record

WORKLOADS = ("lenet", "resnet18", "resnet50")
# extra[SHARED_DEVICE] = true: a resnet50 record whose stages all ran on one device (a 1-GPU
# machine): it measures the per-micro-batch overhead, not overlap
SHARED_DEVICE = "stages_share_device"
# The strategy of a ceiling record (python -m <fw>_impl.ceiling, common/ceiling.py): not a
# training run, so it is kept out of the training tables and shown against them.
CEILING = "ceiling"
# extra.execution: how a run's devices ran (common/cores.py). `sequential` (one process stepping
# its CPU devices one after another) can be no speedup, however many cores each device had.
EXECUTIONS = cores.EXECUTIONS
SEQUENTIAL = "sequential"
MAX_DEVICES = 1 << 16  # far past any machine's devices: a larger count is junk, not a run
MAX_COUNT = 1 << 31  # likewise for batch sizes, epochs, steps, split sizes and repeats


def problem(rec: Record) -> str | None:
    """Why a well-formed record still cannot be shown, or None. Every field the report reads is
    checked here, so that a hand-edited or foreign record is left out with its reason instead
    of ending the report in a traceback."""
    checks = (_schema_problem, run_problem, _measured, extra_problem, cores_problem)
    for check in (*checks, cluster_problem, origin_problem):
        why = check(rec)
        if why is not None:
            return why
    return None


def _schema_problem(rec: Record) -> str | None:
    if not _whole(rec.schema) or rec.schema != results.SCHEMA_VERSION:
        return (
            f"schema {_shown(rec.schema)} is not one this report reads "
            f"(schema {results.SCHEMA_VERSION}); read it with the code that wrote it"
        )
    return None


def run_problem(rec: Record) -> str | None:
    """Why what a record says ran (workload, strategy, devices, sizes) cannot be shown, or None."""
    if rec.workload not in WORKLOADS:
        return f"unknown workload {_shown(rec.workload)}"
    if not (_text(rec.strategy) and _text(rec.preset)):
        return "strategy and preset must be strings"
    if rec.platform not in ("cpu", "gpu"):
        return f"unknown platform {_shown(rec.platform)}"
    for name in ("virtual", "extrapolated"):
        if not isinstance(getattr(rec, name), bool):
            return f"{name} must be true or false, got {_shown(getattr(rec, name))}"
    diverged = rec.diverged_at_epoch
    if diverged is not None and _count_problem("", diverged):
        return f"diverged_at_epoch must be a whole number >= 1 or null, got {_shown(diverged)}"
    why = _count_problem("devices", rec.devices, MAX_DEVICES)
    why = why or _count_problem("batch_size", rec.batch_size)
    for name in ("epochs", "steps_timed", "split_size"):
        value = getattr(rec, name)
        why = why or (None if value is None else _count_problem(name, value))
    if why is None and rec.strategy == CEILING and (rec.devices != 1 or rec.workload == "resnet50"):
        why = "a ceiling record is of lenet or resnet18 on 1 device"
    return why


def _measured(rec: Record) -> str | None:
    # a diverged run is shown as diverged, so what it measured (null where non-finite) is not
    # checked
    return None if rec.diverged_at_epoch is not None else measured_problem(rec)


def measured_problem(rec: Record) -> str | None:
    """Why the times, rates or accuracies of a record (not diverged) cannot be shown, or None."""
    name = "seconds" if rec.workload == "resnet50" else "sec_per_epoch"
    why = stats_problem(name, getattr(rec, name))
    if why is not None:
        return why
    if rec.test_acc is not None and not _fraction(rec.test_acc):
        return f"test_acc must be a number from 0 to 1, got {_shown(rec.test_acc)}"
    if rec.images_per_sec is not None and not (
        _number(rec.images_per_sec) and rec.images_per_sec >= 0
    ):
        return f"images_per_sec must be a number >= 0, got {_shown(rec.images_per_sec)}"
    accs = rec.test_acc_per_epoch
    if not isinstance(accs, list) or not all(_fraction(a) for a in accs):
        return "test_acc_per_epoch is not a list of numbers from 0 to 1"
    return None


def stats_problem(name: str, stats) -> str | None:
    """Why timing statistics ({"median", "std", "n", ...}) cannot be shown, or None."""
    if not isinstance(stats, dict):
        return f"no {name} statistics"
    if not positive(stats.get("median")):
        return f"{name} has no positive median (got {_shown(stats.get('median'))})"
    std = stats.get("std")
    if std is not None and not (_number(std) and std >= 0):
        return f"{name} std must be a number >= 0, got {_shown(std)}"
    if "n" in stats:
        return _count_problem(f"{name} n", stats["n"])
    return None


def extra_problem(rec: Record) -> str | None:
    """Why the `extra` fields the report reads (precision, tier, sweep, sizes, sources, the
    ceiling measured in the run) cannot be shown, or None."""
    extra = rec.extra
    if not isinstance(extra, dict):
        return "extra is not an object"
    for name, ok, wanted in (
        ("amp", _text, "a string"),
        ("compiled", _flag, "true or false"),
        ("sweep", _flag, "true or false"),
        (SHARED_DEVICE, _flag, "true or false"),
        ("utilization_source", _text, "a string"),
        ("memory_source", _text, "a string"),
    ):
        if extra.get(name) is not None and not ok(extra[name]):
            return f"extra.{name} must be {wanted}, got {_shown(extra[name])}"
    for name in ("num_batches", "image_size", "repeats"):
        if extra.get(name) is not None and _count_problem("", extra[name]):
            return _count_problem(f"extra.{name}", extra[name])
    if extra.get("sweep") and rec.split_size is None:
        return "a sweep's record (extra.sweep) needs its split_size"
    c = extra.get("ceiling")
    if c is None or (isinstance(c, dict) and c.get("sec_per_epoch") is None):
        return None  # no ceiling measured in the run (one without times is not shown)
    if not isinstance(c, dict):
        return "extra.ceiling is not an object"
    why = stats_problem("extra.ceiling.sec_per_epoch", c["sec_per_epoch"])
    if why is None and c.get("steps_timed") is not None:
        why = _count_problem("extra.ceiling.steps_timed", c["steps_timed"])
    return why


def cores_problem(rec: Record) -> str | None:
    """Why what a record says of its CPU cores (extra.cores_per_device, cores_used, execution)
    cannot be shown, or None. Runs after extra_problem: extra is an object."""
    extra = rec.extra
    per_device = extra.get("cores_per_device")
    if per_device is not None and _count_problem("", per_device, MAX_DEVICES):
        return _count_problem("extra.cores_per_device", per_device, MAX_DEVICES)
    used = extra.get("cores_used")
    if used is not None and not (
        isinstance(used, list) and all(_whole(c) and c >= 0 for c in used)
    ):
        return f"extra.cores_used must be a list of CPU numbers (>= 0), got {_shown(used)}"
    execution = extra.get("execution")
    if execution is not None and execution not in EXECUTIONS:
        return f"extra.execution must be one of {', '.join(EXECUTIONS)}, got {_shown(execution)}"
    return None


def cluster_problem(rec: Record) -> str | None:
    """Why a run of the cluster in one box (extra.nodes, link, link_bytes, gradient_bytes,
    engine) cannot be shown, or None; a record without extra.nodes is no cluster run."""
    extra = rec.extra
    nodes = extra.get("nodes")
    if nodes is None:
        return None
    why = _count_problem("extra.nodes", nodes, MAX_DEVICES)
    if why is None and _whole(rec.devices) and nodes > rec.devices:
        why = f"extra.nodes ({nodes}) is more than the run's {rec.devices} device(s)"
    why = why or link_problem(extra.get("link"), nodes)
    why = why or link_bytes_problem(extra.get("link_bytes"))
    grad = extra.get("gradient_bytes")
    if why is None and grad is not None and not (_whole(grad) and grad >= 1):
        why = f"extra.gradient_bytes must be a whole number >= 1, got {_shown(grad)}"
    engine = extra.get("engine")
    if why is None and engine is not None and not _text(engine):
        why = f"extra.engine must be a string, got {_shown(engine)}"
    return why


def link_problem(link, nodes: int) -> str | None:
    """Why extra.link (the link between the nodes) cannot be shown, or None; a run on one node
    needs none."""
    if link is None:
        return None if nodes == 1 else f"a run on {nodes} nodes needs extra.link"
    if not isinstance(link, dict):
        return "extra.link is not an object"
    if not _text(link.get("name")):
        return f"extra.link.name must be a string, got {_shown(link.get('name'))}"
    for name in ("rate_bps", "measured_bps"):
        if link.get(name) is not None and not positive(link[name]):
            return f"extra.link.{name} must be a number > 0 or null, got {_shown(link[name])}"
    latency = link.get("latency_s")
    if latency is not None and not (_number(latency) and latency >= 0):
        return f"extra.link.latency_s must be a number >= 0 or null, got {_shown(latency)}"
    return None


def link_bytes_problem(counts) -> str | None:
    """Why extra.link_bytes ({"tx", "rx", "steps"}) cannot be shown, or None."""
    if counts is None:
        return None
    if not isinstance(counts, dict):
        return "extra.link_bytes is not an object"
    for name in ("tx", "rx"):
        value = counts.get(name)
        if not (_whole(value) and value >= 0):
            return f"extra.link_bytes.{name} must be a whole number >= 0, got {_shown(value)}"
    return _count_problem("extra.link_bytes.steps", counts.get("steps"))


def origin_problem(rec: Record) -> str | None:
    """Why where a record was made (versions, hardware, commit, time) cannot be shown, or None."""
    versions, hw = rec.versions, rec.hardware
    if not isinstance(versions, dict) or not all(_text(v) for v in versions.values()):
        return "versions must be an object of strings"
    if not isinstance(hw, dict):
        return "hardware is not an object"
    for name in ("cpu", "cpu_isa"):
        if hw.get(name) is not None and not _text(hw[name]):
            return f"hardware.{name} must be a string, got {_shown(hw[name])}"
    if hw.get("cpu_count") is not None and _count_problem("", hw["cpu_count"]):
        return _count_problem("hardware.cpu_count", hw["cpu_count"])
    if hw.get("isa_caps") is not None and not isinstance(hw["isa_caps"], dict):
        return "hardware.isa_caps is not an object"
    gpus = hw.get("gpus")
    if gpus is not None and not isinstance(gpus, list):
        return "hardware.gpus must be a list of GPUs, each with a name"
    if not all(_text(g.get("name") if isinstance(g, dict) else g) for g in gpus or []):
        return "hardware.gpus must be a list of GPUs, each with a name"
    if rec.git_commit is not None and not _text(rec.git_commit):
        return f"git_commit must be a string, got {_shown(rec.git_commit)}"
    if not isinstance(rec.timestamp, str):
        return f"timestamp must be a string, got {_shown(rec.timestamp)}"
    if rec.flops is not None and not isinstance(rec.flops, dict):
        return "flops is not an object"
    return None


def _count_problem(name: str, x, high: int = MAX_COUNT) -> str | None:
    """Why `x` is not a whole number from 1 to `high`, or None."""
    if _whole(x) and 1 <= x <= high:
        return None
    return f"{name} must be a whole number >= 1 (at most {high}), got {_shown(x)}"


def _shown(x) -> str:
    """`x` as a reason shows it: its repr, cut short."""
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def _text(x) -> bool:
    return isinstance(x, str) and x != ""


def _flag(x) -> bool:
    return isinstance(x, bool)


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def positive(x) -> bool:
    return _number(x) and x > 0


def _fraction(x) -> bool:
    return _number(x) and 0 <= x <= 1
