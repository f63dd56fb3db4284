"""Whether a record read from a results file can be shown: every field the report reads is
checked here, so a hand-edited or foreign record is left out with its reason, never a traceback."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

from common import cores, results

WORKLOADS = ("lenet", "resnet18", "resnet50", "zero")
# A resnet50 record whose stages all ran on one device: it measures overhead, not overlap.
SHARED_DEVICE = "stages_share_device"
CEILING = "ceiling"  # a ceiling record's strategy: shown against the training, not in its tables
# One process stepping its CPU devices one after another: no speedup, whatever its cores.
EXECUTIONS, SEQUENTIAL = cores.EXECUTIONS, "sequential"
MAX_DEVICES = 1 << 16  # far past any machine's devices: a larger count is junk, not a run
MAX_COUNT = 1 << 31  # likewise for batch sizes, epochs, steps, split sizes and repeats
GPUS = "hardware.gpus must be a list of GPUs, each with a name"
BATCH_NORMS = ("per-device", "sync")
EXTRA_TYPES = (
    ("amp", "a string"),
    ("compiled", "true or false"),
    ("sweep", "true or false"),
    (SHARED_DEVICE, "true or false"),
    ("utilization_source", "a string"),
    ("memory_source", "a string"),
)


def problem(rec) -> str | None:
    """Why a well-formed record still cannot be shown, or None. Each check may rely on the
    ones before it: the first reason ends the checking."""
    return next((why for why in _problems(rec) if why), None)


def _problems(rec):
    if not whole(rec.schema) or rec.schema != results.SCHEMA_VERSION:
        yield (
            f"schema {shown(rec.schema)} is not one this report reads "
            f"(schema {results.SCHEMA_VERSION}); read it with the code that wrote it"
        )
    yield from _run(rec)
    if rec.diverged_at_epoch is None:  # a diverged run is shown as diverged, not its figures
        name = "seconds" if rec.workload == "resnet50" else "sec_per_epoch"
        yield from _stats(name, getattr(rec, name))
        yield from _measured(rec)
    extra = rec.extra
    if not isinstance(extra, dict):
        yield "extra is not an object"
    yield from _extra(rec, extra)
    yield from _cores(extra)
    if rec.workload == "zero":
        yield from _zero(rec, extra)
    if extra.get("nodes") is not None:
        yield from _cluster(rec, extra)
    yield from _origin(rec)


def _run(rec):
    if rec.workload not in WORKLOADS:
        yield f"unknown workload {shown(rec.workload)}"
    if not (text(rec.strategy) and text(rec.preset)):
        yield "strategy and preset must be strings"
    if rec.platform not in ("cpu", "gpu"):
        yield f"unknown platform {shown(rec.platform)}"
    for name in ("virtual", "extrapolated"):
        if not isinstance(getattr(rec, name), bool):
            yield f"{name} must be true or false, got {shown(getattr(rec, name))}"
    diverged = rec.diverged_at_epoch
    if diverged is not None and count("", diverged):
        yield f"diverged_at_epoch must be a whole number >= 1 or null, got {shown(diverged)}"
    yield count("devices", rec.devices, MAX_DEVICES)
    yield count("batch_size", rec.batch_size)
    for name in ("epochs", "steps_timed", "split_size"):
        yield optional_count(name, getattr(rec, name))
    if rec.strategy == CEILING and (rec.devices != 1 or rec.workload == "resnet50"):
        yield "a ceiling record is of lenet or resnet18 on 1 device"


def _stats(name: str, stats):
    """Timing statistics: {"median", "std", "n", ...}."""
    if not isinstance(stats, dict):
        yield f"no {name} statistics"
    if not positive(stats.get("median")):
        yield f"{name} has no positive median (got {shown(stats.get('median'))})"
    std = stats.get("std")
    if std is not None and not number(std, 0):
        yield f"{name} std must be a number >= 0, got {shown(std)}"
    if "n" in stats:
        yield count(f"{name} n", stats["n"])


def _measured(rec):
    if rec.test_acc is not None and not number(rec.test_acc, 0, 1):
        yield f"test_acc must be a number from 0 to 1, got {shown(rec.test_acc)}"
    rate = rec.images_per_sec
    if rate is not None and not number(rate, 0):
        yield f"images_per_sec must be a number >= 0, got {shown(rate)}"
    accs = rec.test_acc_per_epoch
    if not isinstance(accs, list) or not all(number(a, 0, 1) for a in accs):
        yield "test_acc_per_epoch is not a list of numbers from 0 to 1"


def _extra(rec, extra: dict):
    for name, wanted in EXTRA_TYPES:
        ok = text if wanted == "a string" else lambda x: isinstance(x, bool)
        if extra.get(name) is not None and not ok(extra[name]):
            yield f"extra.{name} must be {wanted}, got {shown(extra[name])}"
    for name in ("num_batches", "image_size", "repeats"):
        yield optional_count(f"extra.{name}", extra.get(name))
    if extra.get("batch_norm") not in (None, *BATCH_NORMS):
        yield f"extra.batch_norm must be per-device or sync, got {shown(extra['batch_norm'])}"
    if extra.get("sweep") and rec.split_size is None:
        yield "a sweep's record (extra.sweep) needs its split_size"
    c = extra.get("ceiling")
    if c is None or (isinstance(c, dict) and c.get("sec_per_epoch") is None):
        return  # no ceiling measured in the run (one without times is not shown)
    if not isinstance(c, dict):
        yield "extra.ceiling is not an object"
    yield from _stats("extra.ceiling.sec_per_epoch", c["sec_per_epoch"])
    yield optional_count("extra.ceiling.steps_timed", c.get("steps_timed"))


# A step's collectives (compare/memory.py's OPS): XLA may also pass shards round a ring.
ZERO_OPS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "collective_permute")
ZERO_OPS += ("push", "pull")
ZERO_KINDS = ("params", "grads", "opt_state")


def _zero(rec, extra: dict):
    """Lesson 4's fields: its stage, Ψ, each device's state bytes, the peak and the collectives
    (compare/memory.py reads them)."""
    if extra.get("zero_stage") not in (0, 1, 2, 3) or isinstance(extra.get("zero_stage"), bool):
        yield f"extra.zero_stage must be 0, 1, 2 or 3, got {shown(extra.get('zero_stage'))}"
    if extra.get("state_on", "devices") not in ("devices", "servers"):
        yield f"extra.state_on must be devices or servers, got {shown(extra['state_on'])}"
    yield count("extra.parameters", extra.get("parameters"))
    rows = extra.get("state_bytes")
    ok = isinstance(rows, list) and len(rows) == rec.devices
    if not (
        ok
        and all(
            isinstance(r, dict) and all(nonnegative(r.get(k)) for k in ZERO_KINDS) for r in rows
        )
    ):
        yield "extra.state_bytes must be a list of {params, grads, opt_state} bytes, one per device"
    peak = extra.get("peak_bytes")
    if peak is not None and not (
        isinstance(peak, dict)
        and isinstance(peak.get("bytes"), list)
        and all(nonnegative(b) for b in peak["bytes"])
        and text(peak.get("source"))
        and text(peak.get("includes"))
    ):
        yield "extra.peak_bytes must be {bytes: a list of whole numbers, source, includes}"
    ops = extra.get("step_collectives")
    if ops is not None and not (
        isinstance(ops, list)
        and all(
            isinstance(c, dict)
            and c.get("op") in ZERO_OPS
            and nonnegative(c.get("count"))
            and nonnegative(c.get("bytes"))
            for c in ops
        )
    ):
        ops = ", ".join(ZERO_OPS)
        yield f"extra.step_collectives must be a list of {{op ({ops}), count, bytes}}"
    if extra.get("collectives_source") is not None and not text(extra["collectives_source"]):
        yield f"extra.collectives_source must be a string, got {shown(extra['collectives_source'])}"


def _cores(extra: dict):
    yield optional_count("extra.cores_per_device", extra.get("cores_per_device"), MAX_DEVICES)
    used = extra.get("cores_used")
    if used is not None and not (isinstance(used, list) and all(whole(c) and c >= 0 for c in used)):
        yield f"extra.cores_used must be a list of CPU numbers (>= 0), got {shown(used)}"
    execution = extra.get("execution")
    if execution is not None and execution not in EXECUTIONS:
        yield f"extra.execution must be one of {', '.join(EXECUTIONS)}, got {shown(execution)}"


def _cluster(rec, extra: dict):
    nodes, link, counts = extra["nodes"], extra.get("link"), extra.get("link_bytes")
    yield count("extra.nodes", nodes, MAX_DEVICES)
    if whole(rec.devices) and nodes > rec.devices:
        yield f"extra.nodes ({nodes}) is more than the run's {rec.devices} device(s)"
    if link is None and nodes != 1:  # a run on one node needs no link
        yield f"a run on {nodes} nodes needs extra.link"
    if link is not None and not isinstance(link, dict):
        yield "extra.link is not an object"
    if link is not None and not text(link.get("name")):
        yield f"extra.link.name must be a string, got {shown(link.get('name'))}"
    for name in ("rate_bps", "measured_bps"):
        if (value := (link or {}).get(name)) is not None and not positive(value):
            yield f"extra.link.{name} must be a number > 0 or null, got {shown(value)}"
    if (latency := (link or {}).get("latency_s")) is not None and not number(latency, 0):
        yield f"extra.link.latency_s must be a number >= 0 or null, got {shown(latency)}"
    if counts is not None and not isinstance(counts, dict):
        yield "extra.link_bytes is not an object"
    for name in ("tx", "rx") if counts is not None else ():
        if not (whole(value := counts.get(name)) and value >= 0):
            yield f"extra.link_bytes.{name} must be a whole number >= 0, got {shown(value)}"
    if counts is not None:
        yield count("extra.link_bytes.steps", counts.get("steps"))
    grad = extra.get("gradient_bytes")
    if grad is not None and not (whole(grad) and grad >= 1):
        yield f"extra.gradient_bytes must be a whole number >= 1, got {shown(grad)}"
    if extra.get("engine") is not None and not text(extra["engine"]):
        yield f"extra.engine must be a string, got {shown(extra['engine'])}"


def _origin(rec):
    versions, hw = rec.versions, rec.hardware
    if not isinstance(versions, dict) or not all(text(v) for v in versions.values()):
        yield "versions must be an object of strings"
    if not isinstance(hw, dict):
        yield "hardware is not an object"
    for name in ("cpu", "cpu_isa"):
        if hw.get(name) is not None and not text(hw[name]):
            yield f"hardware.{name} must be a string, got {shown(hw[name])}"
    yield optional_count("hardware.cpu_count", hw.get("cpu_count"))
    if hw.get("isa_caps") is not None and not isinstance(hw["isa_caps"], dict):
        yield "hardware.isa_caps is not an object"
    gpus = hw.get("gpus")
    if gpus is not None and not isinstance(gpus, list):
        yield GPUS
    if not all(text(g.get("name") if isinstance(g, dict) else g) for g in gpus or []):
        yield GPUS
    if rec.git_commit is not None and not text(rec.git_commit):
        yield f"git_commit must be a string, got {shown(rec.git_commit)}"
    if not isinstance(rec.timestamp, str):
        yield f"timestamp must be a string, got {shown(rec.timestamp)}"
    elif parse_time(rec.timestamp) > datetime.now(timezone.utc) + timedelta(days=1):
        # It would hide every later run of its cell; clocks of machines may differ by hours.
        yield f"timestamp {shown(rec.timestamp)} is in the future: fix the record"
    if rec.flops is not None and not isinstance(rec.flops, dict):
        yield "flops is not an object"


def count(name: str, x, high: int = MAX_COUNT) -> str | None:
    """Why `x` is not a whole number from 1 to `high`, or None."""
    if whole(x) and 1 <= x <= high:
        return None
    return f"{name} must be a whole number >= 1 (at most {high}), got {shown(x)}"


def nonnegative(x) -> bool:
    return whole(x) and x >= 0


def optional_count(name: str, x, high: int = MAX_COUNT) -> str | None:
    return None if x is None else count(name, x, high)


def shown(x) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def text(x) -> bool:
    return isinstance(x, str) and x != ""


def whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def number(x, low: float = -math.inf, high: float = math.inf) -> bool:
    real = isinstance(x, int | float) and not isinstance(x, bool)
    return real and math.isfinite(x) and low <= x <= high


def positive(x) -> bool:
    return number(x) and x > 0


def parse_time(text) -> datetime:
    try:
        t = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return datetime.min.replace(tzinfo=timezone.utc)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
