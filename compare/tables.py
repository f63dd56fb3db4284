"""The cells every table shares; the data-parallel tables (lenet, resnet18): a row per framework,
strategy and cores per device, a column per device count, with speedups only between like runs;
and each 1-device training loop against its framework's ceiling (common/ceiling.py)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import pandas as pd

from compare.checks import CEILING, SEQUENTIAL, positive
from compare.records import Entry, environment_text, platform_text, rank

DASH, STAR = "–", "*"
SHARED = "†"  # a resnet50 record whose stages shared one device
DIVERGED_NOTE = (
    "diverged at epoch N: the training loss went non-finite in epoch N and the run stopped; "
    "its figures are not shown (rerun it with a lower --lr)."
)
OVERHEADS = "overheads only"
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
CEILING_EXPLANATION = (
    "The ceiling (`python -m <framework>_impl.ceiling`, `make ceiling`) is how fast the framework "
    "itself steps the same model on this machine: the workload module's own model and training "
    "step in a tight loop on one device, one fixed batch already on the device, the framework's "
    "barrier only at the end of each timed repeat; no batch indexing, loss bookkeeping, "
    "evaluation or data-parallel wrapper. Its seconds per step times an epoch's steps is its "
    "sec/epoch (extrapolated). x ceiling = training sec/epoch (1 device) / ceiling sec/epoch: "
    "1.00x is a loop as fast as its framework can step; the target on GPUs is at most 1.10x. "
    "A run with `--ceiling` (as `make compare` runs every 1-device lenet and resnet18 run) times "
    "one repeat of the ceiling after each of its epochs, in the same process: its x ceiling is "
    "the median of the epochs' ratios to the repeats beside them, so the drift of a shared "
    "machine moves both sides of each ratio alike."
)
SAME_RUN = "same_run"  # in a ceiling Entry made from a training record's extra.ceiling


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, title: str, frame: pd.DataFrame, notes=()) -> Table:
        return cls(title, [str(c) for c in frame.columns], frame.values.tolist(), list(notes))


def shared_note(platform: str) -> str:
    device = "GPU" if platform == "gpu" else "device"
    return f"stages share one {device}: measures per-micro-batch overhead, not overlap"


def shared_diverged_notes(entries: list[Entry], diverged: bool = True) -> list[str]:
    """The notes of the `†` mark and of diverged runs, where `entries` show them."""
    shared = [e for e in entries if e.shares_device]
    notes = [f"{SHARED} {shared_note(shared[0].rec.platform)}."] if shared else []
    return notes + ([DIVERGED_NOTE] if diverged and any(e.diverged for e in entries) else [])


def decimals(x: float) -> int:
    """About three significant digits: 123 -> 0, 12.3 -> 1, 1.23 -> 2, 0.123 -> 3."""
    if x <= 0 or not math.isfinite(x):
        return 2
    return min(6, max(0, 2 - math.floor(math.log10(x))))


def fmt_stats(stats: dict, star: bool = False) -> str:
    """`12.3 ± 0.4 s* (n=3)`: median, sample std, repeats; `*` marks an extrapolated figure."""
    median, std = float(stats["median"]), float(stats.get("std") or 0.0)
    d = decimals(median)
    return f"{median:.{d}f} ± {std:.{d}f} s{STAR if star else ''} (n={stats.get('n', '?')})"


def fmt_diverged(e: Entry) -> str:
    return f"diverged at epoch {e.diverged}"


def time_cell(e: Entry | None) -> str:
    if e is None:
        return DASH
    return fmt_diverged(e) if e.diverged else fmt_stats(e.stats, e.rec.extrapolated)


def fmt_rate(x: float | None, star: bool = False) -> str:
    if x is None:
        return DASH
    return (f"{x:,.0f}" if x >= 100 else f"{x:.{decimals(x)}f}") + (STAR if star else "")


def fmt_speedup(x: float | None, star: bool = False) -> str:
    return DASH if x is None else f"{x:.2f}x" + (STAR if star else "")


def fmt_efficiency(x: float | None, star: bool = False) -> str:
    return DASH if x is None else f"{100 * x:.0f}%" + (STAR if star else "")


def scaling(t1: float, tn: float, n: int) -> tuple[float, float]:
    """(speedup, efficiency) of n devices against 1: t1 / tn, and that divided by n."""
    return t1 / tn, t1 / tn / n


def env_cell(entries, envs: dict[str, str]) -> str:
    labels = {envs[environment_text(e.rec)] for e in entries}
    return ", ".join(sorted(labels, key=lambda s: int(s[1:])))


@dataclass
class DpRow:
    """One framework, label and cores per device; its records by device count."""

    framework: str
    label: str  # strategy (+ precision, + compiled)
    platform: str
    virtual: bool
    preset: str
    cells: dict[int, Entry]
    cores: int | None = None  # CPU cores each device had to itself; None: shared cores

    @property
    def dedicated(self) -> bool:
        """Whether each device had its own hardware: a GPU of its own, or its own CPU cores."""
        return (self.platform == "gpu" and not self.virtual) or self.cores is not None

    def unlike(self, n: int) -> str | None:
        """Why the n-device time is no speedup over the 1-device one (OVERHEADS, SEQUENTIAL),
        or None for like runs."""
        if not self.dedicated:
            return OVERHEADS
        e = self.cells.get(n)
        if n > 1 and self.platform == "cpu" and e is not None and e.execution == SEQUENTIAL:
            return SEQUENTIAL
        return None

    def speedup(self, n: int) -> tuple[float, float] | None:
        """(speedup, efficiency) at n devices against 1, if both ran, alike and timed."""
        if 1 not in self.cells or n not in self.cells or self.unlike(n):
            return None
        if self.cells[1].diverged or self.cells[n].diverged:
            return None
        return scaling(self.cells[1].median, self.cells[n].median, n)

    def scaling_cell(self, n: int, efficiency: bool = False) -> str:
        """A figure, why there is none (`unlike`), or a dash for a run missing or diverged."""
        ran = 1 in self.cells and n in self.cells
        if ran and not (self.cells[1].diverged or self.cells[n].diverged) and self.unlike(n):
            return self.unlike(n)
        s, star = self.speedup(n), self.extrapolated(1, n)
        return fmt_efficiency(s and s[1], star) if efficiency else fmt_speedup(s and s[0], star)

    def extrapolated(self, *counts: int) -> bool:
        return any(self.cells[n].rec.extrapolated for n in counts if n in self.cells)

    def measures(self, n: int) -> dict[str, str]:
        """The row's cells at n devices by measure (dashes where it did not run)."""
        e = self.cells.get(n)
        ok = e is not None and not e.diverged
        cells = {"test acc": DASH if not ok or e.rec.test_acc is None else f"{e.rec.test_acc:.3f}"}
        cells["sec/epoch"] = time_cell(e)
        cells["images/s"] = fmt_rate(
            e.rec.images_per_sec if ok else None, ok and e.rec.extrapolated
        )
        if n > 1:
            cells |= {"speedup": self.scaling_cell(n), "efficiency": self.scaling_cell(n, True)}
        return cells


def cores_text(row: DpRow) -> str:
    """The cores/device cell: the count, `shared`, or `GPU` (a GPU of its own)."""
    if row.cores is not None:
        return str(row.cores)
    return "GPU" if row.dedicated else "shared"


def unlike_notes(rows: list[DpRow]) -> list[str]:
    shown = {row.scaling_cell(n) for row in rows for n in row.cells if n > 1}
    return [note for label, note in UNLIKE_NOTES.items() if label in shown]


def dp_rows(entries: list[Entry]) -> list[DpRow]:
    """A row per framework, label and cores per device: a run pinned to its own cores and one
    on shared cores are never one speedup."""
    rows: dict[tuple, DpRow] = {}
    for e in entries:
        r = e.rec
        key = (r.framework, e.label, e.cores_per_device)
        row = rows.setdefault(key, DpRow(*key[:2], r.platform, r.virtual, r.preset, {}, key[2]))
        row.cells[r.devices] = e  # one group and the newest per cell: one record per count
    for (fw, label, cores), row in rows.items():
        # On one device BatchNorm is the same either way: a +sync-bn row's speedup is over the
        # plain row's 1-device run.
        plain = rows.get((fw, label.removesuffix("+sync-bn"), cores))
        if label.endswith("+sync-bn") and plain and 1 in plain.cells:
            row.cells.setdefault(1, plain.cells[1])
    workload = entries[0].rec.workload if entries else None
    return [rows[k] for k in sorted(rows, key=lambda k: (*rank(workload, *k[:2]), k[2] or 0))]


def device_counts(rows: list[DpRow]) -> list[int]:
    return sorted({n for row in rows for n in row.cells})


def dp_table(title: str, rows: list[DpRow], envs: dict[str, str]) -> Table:
    """The report's table: every measure at every device count, side by side."""
    counts = device_counts(rows)
    wide = pd.DataFrame(
        {
            "framework": row.framework,
            "strategy": row.label,
            "cores/device": cores_text(row),
            "platform": platform_text(row.platform, row.virtual),
            "preset": row.preset,
            **{f"{k} ({n} dev)": v for n in counts for k, v in row.measures(n).items()},
            "env": env_cell(row.cells.values(), envs),
        }
        for row in rows
    )
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
    return Table.of(title, wide, notes)


def dp_terminal(rows: list[DpRow]) -> Table:
    """The terminal's view of the same figures: one line per row and device count."""
    lines = []
    for row in rows:
        for n in sorted(row.cells):
            cells = {"framework": row.framework, "strategy": row.label}
            cells |= {"cores/device": cores_text(row), "devices": str(n), **row.measures(n)}
            lines.append(cells | {k: cells.get(k, DASH) for k in ("speedup", "efficiency")})
    return Table.of("terminal", pd.DataFrame(lines))


def extras_table(title: str, rows: list[DpRow]) -> Table | None:
    """Peak memory and utilisation (per device or process), where the runs recorded them."""
    body = []
    for row in rows:
        for n, e in sorted(row.cells.items()):
            mem, util = e.extra.get("peak_memory_bytes"), e.extra.get("utilization")
            if mem is None and util is None:
                continue
            source = e.extra.get("utilization_source") or DASH
            if e.extra.get("memory_source"):
                source += f"; memory: {e.extra['memory_source']}"
            cells = [row.framework, row.label, cores_text(row), str(n), fmt_each(mem, 2**20)]
            body.append([*cells, fmt_each(util), source])
    if not body:
        return None
    headers = ["framework", "strategy", "cores/device", "devices"]
    headers += ["peak memory (MiB)", "utilization (%)", "source"]
    return Table(title, headers, body, ["Several values: one per device or process."])


def fmt_each(x, unit: float = 1) -> str:
    """A number (in `unit`s), or one per device or process: `700 / 710`."""
    if isinstance(x, int | float) and not isinstance(x, bool):
        return f"{x / unit:,.0f}"
    if isinstance(x, list):
        return " / ".join(fmt_each(v, unit) for v in x)
    return DASH if x is None else str(x)


def in_run(e: Entry | None) -> Entry | None:
    """The ceiling a 1-device training record timed in its own run (extra.ceiling), as a
    ceiling Entry of the training's framework and tier."""
    c = e.extra.get("ceiling") if e is not None and e.rec.devices == 1 else None
    stats = c.get("sec_per_epoch") if isinstance(c, dict) else None
    if not isinstance(stats, dict) or "median" not in stats:
        return None
    rec = dataclasses.replace(
        e.rec,
        strategy=CEILING,
        sec_per_epoch=c["sec_per_epoch"],
        extrapolated=True,  # always: its steps of one batch, projected to an epoch
        steps_timed=c.get("steps_timed"),
        diverged_at_epoch=None,
        extra={**e.extra, **c, SAME_RUN: True},
    )
    return Entry(rec, e.source, e.order)


def ceiling_of(training: Entry | None, ceilings: list[Entry]) -> Entry | None:
    """A 1-device training record's ceiling: its own, else a ceiling record of its framework
    and tier, else None."""
    if training is None or training.rec.devices != 1:
        return None
    same = (
        c for c in ceilings if (c.rec.framework, c.tier) == (training.rec.framework, training.tier)
    )
    return in_run(training) or next(same, None)


def ceiling_ratio(training: Entry | None, ceiling: Entry) -> float | None:
    """x ceiling: timed in the run, the median of its epochs' ratios; else the ratio of the
    two medians; None without a time."""
    if training is None or training.diverged:
        return None
    if ceiling.extra.get(SAME_RUN):
        x = ceiling.extra.get("x_ceiling")
        return float(x) if positive(x) else None
    return training.median / ceiling.median


def ceiling_pairs(workload: str, entries: list[Entry], ceilings: list[Entry]) -> list[tuple]:
    """(1-device training record or None, its ceiling), in the tables' order; a ceiling record
    with no training record of its framework and tier gets a row of its own."""
    ones = [e for e in entries if e.rec.devices == 1 and e.rec.workload == workload]
    found = [(e, c) for e in ones if (c := in_run(e)) is not None]
    paired = {e.order for e, _ in found}
    for c in (c for c in ceilings if c.rec.workload == workload):
        same = [e for e in ones if (e.rec.framework, e.tier) == (c.rec.framework, c.tier)]
        found += [(e, c) for e in same if e.order not in paired] or ([] if same else [(None, c)])
    return sorted(found, key=lambda p: rank(workload, p[1].rec.framework, (p[0] or p[1]).label))


def ceiling_marks(entries: list[Entry], ceilings: list[Entry], workload: str) -> dict:
    """(framework, label) of each 1-device training row -> its ceiling's sec/epoch (plots)."""
    found = ceiling_pairs(workload, entries, ceilings)
    return {(t.rec.framework, t.label): c.median for t, c in found if t is not None}


def ceiling_table(workload: str, entries: list[Entry], ceilings: list[Entry], envs) -> Table | None:
    found = ceiling_pairs(workload, entries, ceilings)
    if not found:
        return None
    headers = ["framework", "strategy", "sec/epoch (1 dev)", "ceiling sec/epoch"]
    headers += ["ceiling s/step", "x ceiling", "measured", "env"]
    body = []
    for training, c in found:
        x, per_step = ceiling_ratio(training, c), c.extra.get("s_per_step")
        steps = f"{c.extra.get('repeats', '?')} x {c.rec.steps_timed} steps"
        strategy = f"{DASH} ({c.tier})" if c.tier else DASH  # a ceiling with no training row
        if training is not None:
            cores = training.cores_per_device  # the same label on shared cores: another row
            strategy = training.label + ("" if cores is None else f" ({cores} core(s)/device)")
        body.append(
            [c.rec.framework, strategy, time_cell(training), time_cell(c)]
            + [f"{per_step:.{decimals(per_step)}f} s ({steps})" if positive(per_step) else DASH]
            + [
                DASH if x is None else f"{x:.2f}x",
                "in the run" if c.extra.get(SAME_RUN) else "apart",
            ]
            + [env_cell([e for e in (training, c) if e is not None], envs)]
        )
    notes = [
        f"ceiling sec/epoch: {STAR} always, projected from its timed steps of one batch; n "
        "counts its timed repeats. x ceiling: in the run, the median of the per-epoch ratios; "
        "apart (a ceiling record of its own), the ratio of the two medians."
    ]
    return Table(f"{workload}: training loop vs ceiling", headers, body, notes)
