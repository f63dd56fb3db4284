"""The comparison tables: one per workload, frameworks (and strategies) as rows.

lenet and resnet18: device counts as columns, with test accuracy, sec/epoch (median +- std, n),
images/s, and speedup and scaling efficiency against the same row's 1-device time.
resnet50: single / model_parallel / pipeline / best split of the sweep / gpipe / 1f1b seconds.
Figures projected from fewer steps carry a `*` and a footnote.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from compare import record_checks
from compare.records import Entry, LeftOut, environment_text, platform_text, sort_key

DASH = "–"
STAR = "*"
SHARED = "†"  # a resnet50 record whose stages shared one device


def shared_note(platform: str) -> str:
    device = "GPU" if platform == "gpu" else "device"
    return f"stages share one {device}: measures per-micro-batch overhead, not overlap"


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


# --- formatting -----------------------------------------------------------------------------------


def decimals(x: float) -> int:
    """About three significant digits: 123 -> 0, 12.3 -> 1, 1.23 -> 2, 0.123 -> 3."""
    if x <= 0 or not math.isfinite(x):
        return 2
    return min(6, max(0, 2 - math.floor(math.log10(x))))


def fmt_stats(stats: dict, star: bool = False) -> str:
    """`12.3 ± 0.4 s* (n=3)`: median, sample std, repeats; `*` marks an extrapolated figure."""
    median = float(stats["median"])
    d = decimals(median)
    std = float(stats.get("std") or 0.0)
    n = stats.get("n", "?")
    return f"{median:.{d}f} ± {std:.{d}f} s{STAR if star else ''} (n={n})"


def fmt_diverged(e: Entry) -> str:
    return f"diverged at epoch {e.diverged}"


def time_cell(e: Entry | None) -> str:
    """A record's time (median ± std, n), `diverged at epoch N`, or a dash for no record."""
    if e is None:
        return DASH
    return fmt_diverged(e) if e.diverged else fmt_stats(e.stats, e.rec.extrapolated)


def acc_of(e: Entry | None) -> float | None:
    """The test accuracy worth showing: none for a run that diverged."""
    return None if e is None or e.diverged else e.rec.test_acc


DIVERGED_NOTE = (
    "diverged at epoch N: the training loss went non-finite in epoch N and the run stopped; "
    "its figures are not shown (rerun it with a lower --lr)."
)


def fmt_rate(x: float | None, star: bool = False) -> str:
    if x is None:
        return DASH
    text = f"{x:,.0f}" if x >= 100 else f"{x:.{decimals(x)}f}"
    return text + (STAR if star else "")


def fmt_acc(x: float | None) -> str:
    return DASH if x is None else f"{x:.3f}"


def fmt_speedup(x: float | None, star: bool = False) -> str:
    return DASH if x is None else f"{x:.2f}x" + (STAR if star else "")


def fmt_efficiency(x: float | None, star: bool = False) -> str:
    return DASH if x is None else f"{100 * x:.0f}%" + (STAR if star else "")


def scaling(t1: float, tn: float, n: int) -> tuple[float, float]:
    """(speedup, efficiency) of n devices against 1: t1 / tn, and that divided by n."""
    speedup = t1 / tn
    return speedup, speedup / n


def env_cell(entries, envs: dict[str, str]) -> str:
    labels = sorted({envs[environment_text(e.rec)] for e in entries}, key=lambda s: int(s[1:]))
    return ", ".join(labels)


# --- lenet and resnet18 ---------------------------------------------------------------------------


@dataclass
class DpRow:
    framework: str
    label: str  # strategy (+ precision)
    platform: str
    virtual: bool
    preset: str
    cells: dict[int, Entry]  # devices -> record
    cores: int | None = None  # CPU cores each device had to itself; None: shared cores

    @property
    def dedicated(self) -> bool:
        """Whether each device had its own hardware: a GPU of its own, or its own CPU cores."""
        return (self.platform == "gpu" and not self.virtual) or self.cores is not None

    def unlike(self, n: int) -> str | None:
        """Why the n-device time is no speedup over this row's 1-device time: OVERHEADS (the
        devices shared the process's cores) or SEQUENTIAL (one process stepped its devices one
        after another on CPU cores); None when they are like runs."""
        if not self.dedicated:
            return OVERHEADS
        e = self.cells.get(n)
        if n > 1 and self.platform == "cpu" and e is not None and e.execution == SEQUENTIAL:
            return SEQUENTIAL
        return None

    def speedup(self, n: int) -> tuple[float, float] | None:
        """(speedup, efficiency) at n devices against this row's 1-device run, if both ran and
        are like runs (`unlike`)."""
        if 1 not in self.cells or n not in self.cells or self.unlike(n):
            return None
        if self.cells[1].diverged or self.cells[n].diverged:
            return None
        return scaling(self.cells[1].median, self.cells[n].median, n)

    def scaling_cell(self, n: int, efficiency: bool = False) -> str:
        """The speedup (or efficiency) cell at n devices: a figure, the label saying why there is
        none (`unlike`), or a dash where a run is missing or diverged."""
        ran = 1 in self.cells and n in self.cells
        timed = ran and not (self.cells[1].diverged or self.cells[n].diverged)
        if timed and self.unlike(n):
            return self.unlike(n)
        s = self.speedup(n)
        star = self.extrapolated(1, n)
        return fmt_efficiency(s and s[1], star) if efficiency else fmt_speedup(s and s[0], star)

    def extrapolated(self, *counts: int) -> bool:
        return any(self.cells[n].rec.extrapolated for n in counts if n in self.cells)


OVERHEADS, SEQUENTIAL = "overheads only", record_checks.SEQUENTIAL
UNLIKE_NOTES = {
    OVERHEADS: f"{OVERHEADS}: the devices shared the process's CPU cores, so the n-device time "
    "shows the scheme's overheads, not a speedup.",
    SEQUENTIAL: f"{SEQUENTIAL}: one process stepped its devices one after another on their own "
    "cores, so the n-device time cannot be a speedup.",
}
CORES_NOTE = (
    "cores/device: the CPU cores each device had to itself; shared: every device ran on all of "
    "the process's cores; GPU: a GPU of its own."
)


def cores_text(row: DpRow) -> str:
    """The cores/device cell: the count, `shared`, or `GPU` (a GPU of its own)."""
    if row.cores is not None:
        return str(row.cores)
    return "GPU" if row.dedicated else "shared"


def unlike_notes(rows: list[DpRow]) -> list[str]:
    """One note per label the rows' speedup cells show."""
    shown = {row.scaling_cell(n) for row in rows for n in row.cells if n > 1}
    return [note for label, note in UNLIKE_NOTES.items() if label in shown]


def dp_rows(entries: list[Entry]) -> list[DpRow]:
    """One row per framework, label and cores per device: a run pinned to its own cores and one
    on shared cores are different rows, never one speedup."""
    rows: dict[tuple, DpRow] = {}
    for e in entries:
        r = e.rec
        key = (r.framework, e.label, e.cores_per_device)
        row = rows.setdefault(
            key, DpRow(r.framework, e.label, r.platform, r.virtual, r.preset, {}, key[2])
        )
        row.cells[r.devices] = e  # one group and the newest per cell: one record per count
    if not entries:
        return []
    order = sort_key(entries[0].rec.workload)
    return [rows[k] for k in sorted(rows, key=lambda k: (*order(k), k[2] or 0))]


def device_counts(rows: list[DpRow]) -> list[int]:
    return sorted({n for row in rows for n in row.cells})


def dp_table(title: str, rows: list[DpRow], envs: dict[str, str]) -> Table:
    counts = device_counts(rows)
    headers = ["framework", "strategy", "cores/device", "platform", "preset"]
    for n in counts:
        headers += [f"test acc ({n} dev)", f"sec/epoch ({n} dev)", f"images/s ({n} dev)"]
        if n > 1:
            headers += [f"speedup ({n} dev)", f"efficiency ({n} dev)"]
    headers.append("env")
    body = []
    for row in rows:
        cells = [row.framework, row.label, cores_text(row)]
        cells += [platform_text(row.platform, row.virtual), row.preset]
        for n in counts:
            e = row.cells.get(n)
            rate = None if e is None or e.diverged else e.rec.images_per_sec
            star = e is not None and e.rec.extrapolated
            cells += [fmt_acc(acc_of(e)), time_cell(e), fmt_rate(rate, star)]
            if n > 1:
                cells += [row.scaling_cell(n), row.scaling_cell(n, efficiency=True)]
        cells.append(env_cell(row.cells.values(), envs))
        body.append(cells)
    return Table(title, headers, body, dp_notes(rows))


def dp_notes(rows: list[DpRow]) -> list[str]:
    notes = [
        "sec/epoch: median ± sample standard deviation over n epochs; speedup = sec/epoch on "
        "1 device / sec/epoch on n devices of the same row, where both are like runs; "
        "efficiency = speedup / n.",
        CORES_NOTE,
    ]
    extrapolated = [e for row in rows for e in row.cells.values() if e.rec.extrapolated]
    if extrapolated:
        steps = sorted({e.rec.steps_timed for e in extrapolated if e.rec.steps_timed})
        timed = f" ({', '.join(map(str, steps))} timed steps per epoch)" if steps else ""
        notes.append(
            f"{STAR} extrapolated: the epoch time is projected from fewer steps than an epoch"
            f"{timed}, and so is every figure derived from it."
        )
    notes += unlike_notes(rows)
    if any(e.diverged for row in rows for e in row.cells.values()):
        notes.append(DIVERGED_NOTE)
    return notes


# --- resnet50 -------------------------------------------------------------------------------------


@dataclass
class R50Row:
    framework: str
    platform: str
    virtual: bool
    preset: str
    runs: dict[str, Entry]  # strategy -> record (not the sweep)
    sweep: dict[int, Entry]  # split size -> record

    def best(self) -> Entry | None:
        """The fastest point of the sweep."""
        if not self.sweep:
            return None
        return min(self.sweep.values(), key=lambda e: (e.median, e.rec.split_size))

    def entries(self) -> list[Entry]:
        return list(self.runs.values()) + list(self.sweep.values())

    def versus_single(self, e: Entry | None) -> float | None:
        single = self.runs.get("single")
        if e is None or single is None or e.diverged or single.diverged:
            return None
        return single.median / e.median


def r50_rows(entries: list[Entry]) -> tuple[list[R50Row], list[LeftOut]]:
    """One row per framework (and precision); where several records would fill one cell
    (other device counts or split sizes), the newest is shown and the others left out."""
    left: list[LeftOut] = []
    rows: dict[str, R50Row] = {}
    newest_first = sorted(entries, key=lambda e: (e.time, e.order), reverse=True)
    sweep_devices: dict[str, int] = {}
    for e in newest_first:
        r = e.rec
        amp = e.label[len(r.strategy) :]
        key = r.framework + amp
        row = rows.setdefault(key, R50Row(key, r.platform, r.virtual, r.preset, {}, {}))
        if e.sweep and e.diverged:  # a sweep point without a time: nothing to fit or plot
            left.append(LeftOut(e, fmt_diverged(e)))
        elif e.sweep:
            n = sweep_devices.setdefault(key, r.devices)
            if n != r.devices:
                left.append(LeftOut(e, f"the table shows the newer sweep on {n} device(s)"))
            else:
                row.sweep[r.split_size] = e
        elif r.strategy in row.runs:
            shown = row.runs[r.strategy]
            left.append(
                LeftOut(
                    e,
                    f"the table shows the newer {r.strategy} record "
                    f"({shown.rec.devices} device(s), split {shown.rec.split_size})",
                )
            )
        else:
            row.runs[r.strategy] = e
    order = sort_key("resnet50")
    return [rows[k] for k in sorted(rows, key=lambda k: order((k.split("+")[0], k)))], left


def r50_table(title: str, rows: list[R50Row], envs: dict[str, str]) -> Table:
    headers = [
        "framework",
        "platform",
        "preset",
        "devices",
        "single",
        "model_parallel",
        "pipeline",
        "pipeline, best split",
        "best split size",
        "gpipe",
        "1f1b",
        "model_parallel vs single",
        "best split vs single",
        "env",
    ]
    body = []
    for row in rows:
        devices = sorted({e.rec.devices for e in row.entries() if e.rec.strategy != "single"})
        cells = [
            row.framework,
            platform_text(row.platform, row.virtual),
            row.preset,
            ", ".join(map(str, devices)) or DASH,
        ]
        for name in ("single", "model_parallel", "pipeline"):
            cells.append(r50_cell(row.runs.get(name)))
        best = row.best()
        cells.append(r50_cell(best, split=False))
        cells.append(DASH if best is None else str(best.rec.split_size))
        for name in ("gpipe", "1f1b"):
            cells.append(r50_cell(row.runs.get(name)))
        mp = row.runs.get("model_parallel")
        cells.append(fmt_speedup(row.versus_single(mp)))
        cells.append(fmt_speedup(row.versus_single(best)))
        cells.append(env_cell(row.entries(), envs))
        body.append(cells)
    notes = [
        "seconds: one timed repeat of the preset's num_batches training steps, median ± sample "
        "standard deviation over n repeats; `vs single` = single seconds / that column's seconds.",
        "pipeline, best split: the fastest point of the split_size sweep.",
    ]
    if any(e.rec.extrapolated for row in rows for e in row.entries()):
        notes.append(f"{STAR} extrapolated: projected from fewer steps than measured.")
    shared = [e for row in rows for e in row.entries() if e.shares_device]
    if shared:
        notes.append(f"{SHARED} {shared_note(shared[0].rec.platform)}.")
    if any(e.diverged for row in rows for e in row.entries()):
        notes.append(DIVERGED_NOTE)
    return Table(title, headers, body, notes)


def r50_cell(e: Entry | None, split: bool = True) -> str:
    if e is None or e.diverged:
        return time_cell(e)
    text = fmt_stats(e.stats, e.rec.extrapolated)
    if split and e.rec.split_size is not None:
        text += f", split {e.rec.split_size}"
    return text + (f" {SHARED}" if e.shares_device else "")
