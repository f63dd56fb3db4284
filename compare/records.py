"""The records a report is made of: read, checked (compare/checks.py), the newest kept per
cell, and sorted into machine groups (preset, platform, virtual or not, hardware model); what
is left out keeps its reason."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from common import checks, results
from common.results import Record
from compare.checks import CEILING, SHARED_DEVICE, parse_time, positive, problem

FRAMEWORK_ORDER = results.FRAMEWORKS  # the tables' order: the records' own list
STRATEGY_ORDER = {
    "lenet": ("scratch",),
    "resnet18": ("ddp", "dataparallel", "sharding", "shard_map", "pmap", "gluon"),
    "resnet50": ("single", "model_parallel", "pipeline", "gpipe", "1f1b"),
    "zero": (
        "ddp",
        "zero1",
        "zero2",
        "zero3",
        "sharding",
        "fsdp",
        "fsdp_explicit",
        "dist",
        "server",
    ),
}
NO_TRAINING = "a ceiling with no training record of its machine group to compare it with"


def batch_norm(rec: Record) -> str | None:
    """A resnet18 record's BatchNorm: "per-device" or "sync" (--sync-bn). Records from before the
    field: JAX's normalised the whole batch (sync), torch's and MXNet's each device's share."""
    if rec.workload != "resnet18":
        return None
    extra = rec.extra if isinstance(rec.extra, dict) else {}
    return extra.get("batch_norm", "sync" if rec.framework == "jax" else "per-device")


class Entry:
    """One record, its file, and its place among the records read (the tie-breaker between
    equal timestamps), with what the report reads of it worked out once. Any field may be of the
    wrong type until `problem` has passed it."""

    def __init__(self, rec: Record, source: str, order: int):
        self.rec, self.source, self.order = rec, source, order
        self.extra = extra = rec.extra if isinstance(rec.extra, dict) else {}
        amp, link = extra.get("amp"), extra.get("link")
        # The precision past float32, and torch.compile: eager and compiled are rows of their own.
        self.tier = (f"+{amp}" if amp and amp != "off" else "") + (
            "+compiled" if extra.get("compiled") is True else ""
        )
        # BatchNorm over the whole batch of several devices computes something else than each
        # device's share: a row of its own. On one device the two are the same.
        self.sync_bn = batch_norm(rec) == "sync" and rec.devices != 1
        self.label = str(rec.strategy) + self.tier + ("+sync-bn" if self.sync_bn else "")
        # JAX's explicit collectives, packed into one buffer or not (--unbucketed): records
        # from before the field ran unbucketed.
        packs = checks.packs_buckets(rec.framework, rec.workload, rec.strategy)
        self.unbucketed = packs and not extra.get("bucketed", False)
        self.label += "+unbucketed" if self.unbucketed else ""
        self.cores_per_device = extra.get("cores_per_device")  # None: the devices shared cores
        self.execution = extra.get("execution")
        self.nodes = extra.get("nodes")  # None: no cluster run
        self.link_name = link.get("name") if isinstance(link, dict) else None
        self.sweep, self.shares_device = bool(extra.get("sweep")), extra.get(SHARED_DEVICE) is True
        self.ceiling = rec.strategy == CEILING
        self.diverged = rec.diverged_at_epoch  # the epoch whose loss went non-finite
        self.stats = rec.seconds if rec.workload == "resnet50" else rec.sec_per_epoch
        self.time = parse_time(rec.timestamp)
        self.machine = (rec.preset, rec.platform, bool(rec.virtual), hardware_key(rec))
        # Records of the same cell measure the same thing: the newest one is shown.
        what = (rec.framework, rec.workload, self.label, rec.devices, rec.split_size, self.sweep)
        where = (self.shares_device, self.cores_per_device, self.nodes, self.link_name)
        self.cell = (*what, *where, *self.machine)

    @property
    def median(self) -> float:
        return float(self.stats["median"])

    @property
    def std(self) -> float:
        return float(self.stats.get("std") or 0.0)

    def describe(self) -> str:
        r, cores = self.rec, self.cores_per_device
        split = f", split {r.split_size}" if r.split_size is not None else ""
        shared = ", stages share one device" if self.shares_device else ""
        shared += "" if cores is None else f", {cores} core(s) per device"
        if self.nodes is not None:
            shared += f", {self.nodes} node(s) over link {self.link_name or '?'}"
        return (
            f"{r.framework} {r.workload} {self.label}{' (sweep)' if self.sweep else ''}{split}, "
            f"{r.devices} device(s){shared}, {platform_text(r.platform, r.virtual)}, "
            f"preset {r.preset}, {r.timestamp or 'no timestamp'} ({self.source})"
        )


@dataclass(frozen=True)
class LeftOut:
    entry: Entry
    reason: str


def platform_text(platform: str, virtual: bool) -> str:
    return f"{platform} (virtual)" if virtual else platform


def hardware_key(rec: Record) -> tuple:
    """The hardware model: the GPUs' names on a GPU, else the CPU, its core count and ISA."""
    hw = rec.hardware if isinstance(rec.hardware, dict) else {}
    if rec.platform == "gpu":
        return ("gpu", tuple(sorted(gpu_names(hw))))
    cores = hw.get("cpu_count")
    return ("cpu", str(hw.get("cpu") or "unknown CPU"), cores if positive(cores) else None, isa(hw))


def gpu_names(hw: dict) -> list[str]:
    gpus = hw.get("gpus") if isinstance(hw.get("gpus"), list) else []
    return [str(g.get("name", "?")) if isinstance(g, dict) else str(g) for g in gpus]


def isa(hw: dict) -> str | None:
    """`AVX512_BF16`, `AVX512_BF16 capped at AVX2`; None for records made before they said."""
    if not isinstance(hw.get("cpu_isa"), str):
        return None
    caps = hw.get("isa_caps") if isinstance(hw.get("isa_caps"), dict) else {}
    capped = "/".join(sorted({str(c).upper() for c in caps.values()}))
    return hw["cpu_isa"].upper() + (f" capped at {capped}" if capped else "")


def hardware_text(key: tuple, devices: int, virtual: bool) -> str:
    """`1 x NVIDIA H100 80GB HBM3` or `2 virtual devices on 2 CPU cores (AMD EPYC, AVX2)`."""
    if key[0] == "gpu":
        return ", ".join(f"{n} x {name}" for name, n in Counter(key[1]).items()) or "unknown GPU"
    _, cpu, cores, isa_name = key
    cpu = f"{cpu}, {isa_name}" if isa_name else cpu
    where = f"{cores} CPU cores ({cpu})" if cores else cpu
    return f"{devices} virtual device{'s' if devices != 1 else ''} on {where}" if virtual else where


@dataclass
class Machine:
    """The records of one preset, platform and hardware model: one section of the report."""

    key: tuple  # Entry.machine
    entries: list[Entry]  # training records
    slug: str = ""  # a file-name-safe name, unique among the report's machines
    ceilings: list[Entry] = field(default_factory=list)

    preset = property(lambda self: self.key[0])
    platform = property(lambda self: self.key[1])
    virtual = property(lambda self: self.key[2])
    devices = property(lambda self: max(e.rec.devices for e in self.entries))
    hardware = property(lambda self: hardware_text(self.key[3], self.devices, self.virtual))
    title = property(lambda self: f"{self.hardware}, preset {self.preset}")
    # The runs of the cluster in one box (extra.nodes), of every workload: a section of their own.
    cluster = property(lambda self: [e for e in self.entries if e.nodes is not None])

    def workload(self, name: str) -> list[Entry]:
        return [e for e in self.entries if e.rec.workload == name and e.nodes is None]


def read(paths, warnings: list[str]) -> list[Entry]:
    """Every record in `paths`; a missing file, unreadable file or bad line becomes a warning."""
    entries: list[Entry] = []
    for path in map(Path, paths):
        if not path.is_file():
            warnings.append(f"{path}: no such results file")
            continue
        try:
            recs = results.load(path, skip_bad=True, warnings=warnings)
        except (results.ResultsError, OSError) as e:
            warnings.append(f"{path}: cannot read ({str(e).splitlines()[0][:200]})")
            continue
        entries += [Entry(r, str(path), len(entries) + i) for i, r in enumerate(recs)]
    return entries


def check(entries: list[Entry]) -> tuple[list[Entry], list[LeftOut]]:
    reasons = [(e, problem(e.rec)) for e in entries]
    return [e for e, why in reasons if why is None], [LeftOut(e, y) for e, y in reasons if y]


def newest(entries: list[Entry]) -> tuple[list[Entry], list[LeftOut]]:
    """The newest record of every cell (by timestamp, then file order); the older ones apart."""
    cells: dict[tuple, list[Entry]] = {}
    for e in entries:
        cells.setdefault(e.cell, []).append(e)
    kept, older = [], []
    for same in cells.values():
        *old, new = sorted(same, key=lambda e: (e.time, e.order))
        kept.append(new)
        older += [LeftOut(e, f"superseded by the newer record of {new.rec.timestamp}") for e in old]
    return sorted(kept, key=lambda e: e.order), older


def machines(entries: list[Entry], preset=None, platform=None) -> tuple[list[Machine], list]:
    """The machine groups, in the order their first records were read; records of another
    preset or platform than asked for are left out. Ceiling records join their machine's group
    apart from its training records (left out without one)."""
    asked = [x for x in (preset and f"preset {preset}", platform and f"platform {platform}") if x]
    left, groups, ceilings = [], {}, []
    for e in sorted(entries, key=lambda e: e.order):
        if (preset and e.rec.preset != preset) or (platform and e.rec.platform != platform):
            left.append(LeftOut(e, f"not {', '.join(asked)}"))
        else:
            (ceilings if e.ceiling else groups.setdefault(e.machine, [])).append(e)
    out = {key: Machine(key, group) for key, group in groups.items()}
    for e in ceilings:
        if e.machine in out:
            out[e.machine].ceilings.append(e)
        else:
            left.append(LeftOut(e, NO_TRAINING))
    slugs: set[str] = set()
    for m in out.values():
        base = re.sub(r"[^a-z0-9]+", "-", m.title.lower()).strip("-") or "machine"
        m.slug, i = base, 1
        while m.slug in slugs:  # two titles alike (an unnamed GPU, say): keep the files apart
            i += 1
            m.slug = f"{base}-{i}"
        slugs.add(m.slug)
    return list(out.values()), left


def rank(workload: str, framework: str, label: str) -> tuple:
    """Where a row goes: frameworks in a fixed order, then strategies in STRATEGY_ORDER's."""
    strategies, base = STRATEGY_ORDER.get(workload, ()), label.split("+")[0]
    known = FRAMEWORK_ORDER.index(framework) if framework in FRAMEWORK_ORDER else 99
    return known, strategies.index(base) if base in strategies else 99, label


def environments(entries: list[Entry]) -> dict[str, str]:
    """A short label (E1, E2, ...) for every distinct environment, keyed by its description."""
    texts = dict.fromkeys(environment_text(e.rec) for e in sorted(entries, key=lambda e: e.order))
    return {text: f"E{i}" for i, text in enumerate(texts, start=1)}


def environment_text(rec: Record) -> str:
    hw = rec.hardware if isinstance(rec.hardware, dict) else {}
    isa_name = isa(hw)
    cpu = (hw.get("cpu") or "unknown CPU") + (f", {isa_name}" if isa_name else "")
    cores = f" ({hw['cpu_count']} cores)" if hw.get("cpu_count") else ""
    versions = rec.versions if isinstance(rec.versions, dict) else {}
    first = [rec.framework] if rec.framework in versions else []
    order = first + sorted(k for k in versions if k != rec.framework)
    version_text = ", ".join(f"{k} {versions[k]}" for k in order) or "versions unknown"
    gpus = ", ".join(gpu_names(hw)) or "no GPU"
    return f"{cpu}{cores}; {gpus}; {version_text}; commit {results.short_commit(rec.git_commit)}"
