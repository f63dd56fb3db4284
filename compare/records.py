"""The records a report is made of: read them, check them, keep the newest per cell, and sort
them into comparable groups: one machine group per preset, platform (virtual or not) and hardware
model, and within it one group per workload.

Everything left out is kept with the reason, so the report can say what it did not show.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from common import results
from common.results import Record
from compare.record_checks import CEILING, SHARED_DEVICE, positive, problem
from compare.record_checks import EXECUTIONS as EXECUTIONS  # where the others look for it
from compare.record_checks import WORKLOADS as WORKLOADS  # where the others look for it

FRAMEWORK_ORDER = ("torch", "jax", "mxnet")
STRATEGY_ORDER = {
    "lenet": ("scratch",),
    "resnet18": ("ddp", "dataparallel", "sharding", "shard_map", "pmap", "gluon"),
    "resnet50": ("single", "model_parallel", "pipeline", "gpipe", "1f1b"),
}
_OLDEST = datetime.min.replace(tzinfo=timezone.utc)


@dataclass(frozen=True, eq=False)
class Entry:
    """One record and where it came from."""

    rec: Record
    source: str  # the results file
    order: int  # position in the files read: a tie-breaker between equal timestamps

    @property
    def label(self) -> str:
        """The strategy, plus the precision when it is not the default float32, plus `compiled`
        for a torch run with --compile (torch.compile): eager and compiled are separate rows."""
        extra = self.rec.extra if isinstance(self.rec.extra, dict) else {}
        amp = extra.get("amp")
        # (str(): an unusable record's strategy, a number say, is still named when left out)
        label = str(self.rec.strategy) + (f"+{amp}" if amp and amp != "off" else "")
        return label + ("+compiled" if extra.get("compiled") is True else "")

    @property
    def cores_per_device(self) -> int | None:
        """The CPU cores each device had to itself (extra.cores_per_device); None: the devices
        shared the process's cores."""
        return self._extra().get("cores_per_device")

    @property
    def execution(self) -> str | None:
        """How the devices ran (extra.execution): one of EXECUTIONS, or None (not said)."""
        return self._extra().get("execution")

    @property
    def nodes(self) -> int | None:
        """The cluster's node count (extra.nodes); None for a run that is no cluster run."""
        return self._extra().get("nodes")

    @property
    def link_name(self) -> str | None:
        """The name of the link between the cluster's nodes (extra.link.name), if any."""
        link = self._extra().get("link")
        return link.get("name") if isinstance(link, dict) else None

    def _extra(self) -> dict:
        return self.rec.extra if isinstance(self.rec.extra, dict) else {}

    @property
    def stats(self) -> dict:
        """The timing statistics: `seconds` (resnet50, per repeat) or `sec_per_epoch`."""
        if self.rec.workload == "resnet50":
            return self.rec.seconds
        return self.rec.sec_per_epoch

    @property
    def diverged(self) -> int | None:
        """The epoch whose loss went non-finite (training stopped there), or None: such a
        record is shown as diverged, never as a time."""
        return self.rec.diverged_at_epoch

    @property
    def median(self) -> float:
        return float(self.stats["median"])

    @property
    def std(self) -> float:
        return float(self.stats.get("std") or 0.0)

    @property
    def sweep(self) -> bool:
        return isinstance(self.rec.extra, dict) and bool(self.rec.extra.get("sweep"))

    @property
    def time(self) -> datetime:
        return parse_time(self.rec.timestamp)

    @property
    def cell(self) -> tuple:
        """Records with the same cell measure the same thing: the newest one is shown."""
        r = self.rec
        return (
            r.framework,
            r.workload,
            self.label,
            r.devices,
            r.platform,
            r.virtual,
            r.preset,
            r.split_size,
            self.sweep,
            self.shares_device,
            self.cores_per_device,
            self.nodes,
            self.link_name,
            hardware_key(r),
        )

    @property
    def machine(self) -> tuple:
        """(preset, platform, virtual, hardware model): the records of one machine group; within
        it, the records of one workload are comparable side by side."""
        r = self.rec
        return (r.preset, r.platform, bool(r.virtual), hardware_key(r))

    @property
    def ceiling(self) -> bool:
        return self.rec.strategy == CEILING

    @property
    def shares_device(self) -> bool:
        return isinstance(self.rec.extra, dict) and self.rec.extra.get(SHARED_DEVICE) is True

    def describe(self) -> str:
        r = self.rec
        split = f", split {r.split_size}" if r.split_size is not None else ""
        sweep = " (sweep)" if self.sweep else ""
        shared = ", stages share one device" if self.shares_device else ""
        cores = self.cores_per_device
        shared += "" if cores is None else f", {cores} core(s) per device"
        if self.nodes is not None:
            shared += f", {self.nodes} node(s) over link {self.link_name or '?'}"
        return (
            f"{r.framework} {r.workload} {self.label}{sweep}{split}, "
            f"{r.devices} device(s){shared}, "
            f"{platform_text(r.platform, r.virtual)}, preset {r.preset}, "
            f"{r.timestamp or 'no timestamp'} ({self.source})"
        )


@dataclass(frozen=True)
class LeftOut:
    entry: Entry
    reason: str


def platform_text(platform: str, virtual: bool) -> str:
    return f"{platform} (virtual)" if virtual else platform


def hardware_key(rec: Record) -> tuple:
    """The hardware model: the GPUs' names on a GPU, else the CPU and its core count."""
    hw = rec.hardware if isinstance(rec.hardware, dict) else {}
    if rec.platform == "gpu":
        gpus = hw.get("gpus") if isinstance(hw.get("gpus"), list) else []
        names = (g.get("name", "?") if isinstance(g, dict) else str(g) for g in gpus)
        return ("gpu", tuple(sorted(map(str, names))))
    cores = hw.get("cpu_count")
    cpu = str(hw.get("cpu") or "unknown CPU")
    return ("cpu", cpu, cores if positive(cores) else None, isa_text(hw))


def isa_text(hw: dict) -> str | None:
    """`AVX512_BF16`, `AVX512_BF16 capped at AVX2`; None for records made before they said."""
    isa = hw.get("cpu_isa")
    if not isinstance(isa, str):
        return None
    caps = hw.get("isa_caps") if isinstance(hw.get("isa_caps"), dict) else {}
    capped = sorted({str(c).upper() for c in caps.values()})
    return isa.upper() + (f" capped at {'/'.join(capped)}" if capped else "")


def hardware_text(key: tuple, devices: int, virtual: bool) -> str:
    """A title such as `1 x NVIDIA H100 80GB HBM3` or `2 virtual devices on 2 CPU cores (AMD
    EPYC, AVX2)`: a machine's devices, counted from its records."""
    if key[0] == "gpu":
        counts = Counter(key[1])
        return ", ".join(f"{n} x {name}" for name, n in counts.items()) or "unknown GPU"
    _, cpu, cores, isa = key
    cpu = f"{cpu}, {isa}" if isa else cpu
    where = f"{cores} CPU cores ({cpu})" if cores else cpu
    if not virtual:
        return where
    return f"{devices} virtual device{'s' if devices != 1 else ''} on {where}"


@dataclass
class Machine:
    """The records of one preset, platform and hardware model: one section of the report."""

    key: tuple  # Entry.machine
    entries: list[Entry]  # training records
    slug: str = ""  # a file-name-safe name, unique among the report's machines
    ceilings: list[Entry] = field(default_factory=list)  # ceiling records (CEILING)

    @property
    def preset(self) -> str:
        return self.key[0]

    @property
    def platform(self) -> str:
        return self.key[1]

    @property
    def virtual(self) -> bool:
        return self.key[2]

    @property
    def hardware(self) -> str:
        devices = max(e.rec.devices for e in self.entries)
        return hardware_text(self.key[3], devices, self.virtual)

    @property
    def title(self) -> str:
        return f"{self.hardware}, preset {self.preset}"

    def workload(self, name: str) -> list[Entry]:
        """The records of one workload on one machine; the cluster's runs (extra.nodes) have a
        section of their own, so they are not among them."""
        return [e for e in self.entries if e.rec.workload == name and e.nodes is None]

    @property
    def cluster(self) -> list[Entry]:
        """The runs of the cluster in one box (extra.nodes), of every workload."""
        return [e for e in self.entries if e.nodes is not None]


def machines(
    entries: list[Entry], preset: str | None = None, platform: str | None = None
) -> tuple[list[Machine], list[LeftOut]]:
    """The machine groups, in the order their first records were read; records of another
    preset or platform than the one asked for are left out, with the reason. Ceiling records
    join the group of their machine, apart from its training records (left out without one)."""
    asked = ", ".join(
        x for x in (preset and f"preset {preset}", platform and f"platform {platform}") if x
    )
    groups: dict[tuple, list[Entry]] = {}
    left, ceilings = [], []
    for e in sorted(entries, key=lambda e: e.order):
        if (preset and e.rec.preset != preset) or (platform and e.rec.platform != platform):
            left.append(LeftOut(e, f"not {asked}"))
        elif e.ceiling:
            ceilings.append(e)
        else:
            groups.setdefault(e.machine, []).append(e)
    out = [Machine(key, group) for key, group in groups.items()]
    by_key = {m.key: m for m in out}
    for e in ceilings:
        if e.machine in by_key:
            by_key[e.machine].ceilings.append(e)
        else:
            left.append(LeftOut(e, NO_TRAINING))
    slugs: set[str] = set()
    for m in out:
        base = re.sub(r"[^a-z0-9]+", "-", m.title.lower()).strip("-") or "machine"
        m.slug, i = base, 1
        while m.slug in slugs:  # two titles alike (an unnamed GPU, say): keep the files apart
            i += 1
            m.slug = f"{base}-{i}"
        slugs.add(m.slug)
    return out, left


NO_TRAINING = "a ceiling with no training record of its machine group to compare it with"


def parse_time(text: str) -> datetime:
    try:
        t = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return _OLDEST
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


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
        entries.extend(Entry(r, str(path), len(entries) + i) for i, r in enumerate(recs))
    return entries


def check(entries: list[Entry]) -> tuple[list[Entry], list[LeftOut]]:
    good, bad = [], []
    for e in entries:
        reason = problem(e.rec)
        if reason is None:
            good.append(e)
        else:
            bad.append(LeftOut(e, reason))
    return good, bad


def newest(entries: list[Entry]) -> tuple[list[Entry], list[LeftOut]]:
    """The newest record of every cell (by timestamp, then file order); the older ones apart."""
    cells: dict[tuple, list[Entry]] = {}
    for e in entries:
        cells.setdefault(e.cell, []).append(e)
    kept, older = [], []
    for same in cells.values():
        same.sort(key=lambda e: (e.time, e.order))
        kept.append(same[-1])
        for e in same[:-1]:
            older.append(LeftOut(e, f"superseded by the newer record of {same[-1].rec.timestamp}"))
    kept.sort(key=lambda e: e.order)
    return kept, older


def sort_key(workload: str):
    """Frameworks in a fixed order, then strategies in the order of STRATEGY_ORDER."""
    strategies = STRATEGY_ORDER.get(workload, ())

    def key(item):
        framework, label = item[0], item[1]
        base = label.split("+")[0]
        return (
            FRAMEWORK_ORDER.index(framework) if framework in FRAMEWORK_ORDER else 99,
            strategies.index(base) if base in strategies else 99,
            label,
        )

    return key


def environments(entries: list[Entry]) -> dict[str, str]:
    """A short label (E1, E2, ...) for every distinct environment, keyed by its description."""
    labels: dict[str, str] = {}
    for e in sorted(entries, key=lambda e: e.order):
        text = environment_text(e.rec)
        if text not in labels:
            labels[text] = f"E{len(labels) + 1}"
    return labels


def environment_text(rec: Record) -> str:
    hw = rec.hardware if isinstance(rec.hardware, dict) else {}
    gpus = hw.get("gpus") or []
    gpu_text = (
        ", ".join(g.get("name", "?") if isinstance(g, dict) else str(g) for g in gpus) or "no GPU"
    )
    isa = isa_text(hw)
    cpu = (hw.get("cpu") or "unknown CPU") + (f", {isa}" if isa else "")
    cores = f" ({hw['cpu_count']} cores)" if hw.get("cpu_count") else ""
    versions = rec.versions if isinstance(rec.versions, dict) else {}
    first = [rec.framework] if rec.framework in versions else []
    order = first + sorted(k for k in versions if k != rec.framework)
    version_text = ", ".join(f"{k} {versions[k]}" for k in order) or "versions unknown"
    commit = results.short_commit(rec.git_commit)
    return f"{cpu}{cores}; {gpu_text}; {version_text}; commit {commit}"
