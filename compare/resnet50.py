"""resnet50's tables: the seconds of every strategy per framework (the split_size sweep's best
point among them), and the pipeline's bubble measured against GPipe's formula."""

from __future__ import annotations

import math
from dataclasses import dataclass

from compare import tables
from compare.records import Entry, LeftOut, platform_text, rank
from compare.tables import DASH, SHARED, STAR, Table, fmt_stats, time_cell

STRATEGIES = ("single", "model_parallel", "pipeline", "best split", "gpipe", "1f1b")
BUBBLE_EXPLANATION = (
    "torch's pipelining engine (`gpipe`, `1f1b`: a process per stage, a core each) at m "
    "micro-batches: each stage's **measured** busy share of the timed repeats (its CPU time over "
    "the time), beside **balanced** 1 - (p - 1) / (m + p - 1) and **with imbalance**: the stages' "
    "micro-batch times in the ratio of their busy shares at m = 1 (one micro-batch: the stages "
    "take turns), a batch taking the first micro-batch through every stage and m - 1 more slots "
    "of the slowest, stage s busy m t_s of it. Both are predictions, not measurements."
)


@dataclass
class R50Row:
    framework: str  # and the precision past float32 (`jax+bf16`)
    platform: str
    virtual: bool
    preset: str
    runs: dict[str, Entry]  # strategy -> record (not the sweep)
    sweep: dict[int, Entry]  # split size -> record

    def best(self) -> Entry | None:
        return min(self.sweep.values(), key=lambda e: (e.median, e.rec.split_size), default=None)

    def get(self, name: str) -> Entry | None:
        """A strategy's record, or the fastest point of the sweep for `best split`."""
        return self.best() if name == "best split" else self.runs.get(name)

    def entries(self) -> list[Entry]:
        return list(self.runs.values()) + list(self.sweep.values())

    def versus_single(self, e: Entry | None) -> float | None:
        single = self.runs.get("single")
        if e is None or single is None or e.diverged or single.diverged:
            return None
        return single.median / e.median


def rows_of(entries: list[Entry]) -> tuple[list[R50Row], list[LeftOut]]:
    """A row per framework (and precision); where several records would fill one cell (other
    device counts or split sizes), the newest is shown and the others left out."""
    left: list[LeftOut] = []
    rows: dict[str, R50Row] = {}
    sweep_devices: dict[str, int] = {}
    for e in sorted(entries, key=lambda e: (e.time, e.order), reverse=True):
        r, key = e.rec, e.rec.framework + e.tier
        row = rows.setdefault(key, R50Row(key, r.platform, r.virtual, r.preset, {}, {}))
        shown = row.runs.get(r.strategy)
        if e.sweep and e.diverged:  # a sweep point without a time: nothing to fit or plot
            left.append(LeftOut(e, tables.fmt_diverged(e)))
        elif e.sweep and sweep_devices.setdefault(key, r.devices) != r.devices:
            n = sweep_devices[key]
            left.append(LeftOut(e, f"the table shows the newer sweep on {n} device(s)"))
        elif e.sweep:
            row.sweep[r.split_size] = e
        elif shown is not None:
            what = f"{shown.rec.devices} device(s), split {shown.rec.split_size}"
            left.append(LeftOut(e, f"the table shows the newer {r.strategy} record ({what})"))
        else:
            row.runs[r.strategy] = e
    return [rows[k] for k in sorted(rows, key=lambda k: rank("resnet50", k.split("+")[0], k))], left


def cell(e: Entry | None, split: bool = True) -> str:
    if e is None or e.diverged:
        return time_cell(e)
    text = fmt_stats(e.stats, e.rec.extrapolated)
    if split and e.rec.split_size is not None:
        text += f", split {e.rec.split_size}"
    return text + (f" {SHARED}" if e.shares_device else "")


def table(title: str, rows: list[R50Row], envs: dict[str, str]) -> Table:
    headers = ["framework", "platform", "preset", "devices", *STRATEGIES[:3]]
    headers += ["pipeline, best split", "best split size", *STRATEGIES[4:]]
    headers += ["model_parallel vs single", "best split vs single", "env"]
    body = []
    for row in rows:
        devices = sorted({e.rec.devices for e in row.entries() if e.rec.strategy != "single"})
        best = row.best()
        cells = [row.framework, platform_text(row.platform, row.virtual), row.preset]
        cells += [", ".join(map(str, devices)) or DASH, *(cell(row.get(s)) for s in STRATEGIES[:3])]
        cells += [cell(best, split=False), DASH if best is None else str(best.rec.split_size)]
        cells += [cell(row.get(s)) for s in STRATEGIES[4:]]
        versus = (row.versus_single(row.get(s)) for s in ("model_parallel", "best split"))
        body.append(
            [*cells, *map(tables.fmt_speedup, versus), tables.env_cell(row.entries(), envs)]
        )
    notes = [
        "seconds: one timed repeat of the preset's num_batches training steps, median ± sample "
        "standard deviation over n repeats; `vs single` = single seconds / that column's seconds.",
        "pipeline, best split: the fastest point of the split_size sweep.",
    ]
    entries = [e for row in rows for e in row.entries()]
    if any(e.rec.extrapolated for e in entries):
        notes.append(f"{STAR} extrapolated: projected from fewer steps than measured.")
    return Table(title, headers, body, notes + tables.shared_diverged_notes(entries))


def micro_batches(batch_size: int, split_size: int) -> int:
    return math.ceil(batch_size / split_size)


def bubble_fraction(m: int, p: int) -> float:
    """GPipe's idle share of p balanced stages at m micro-batches: (p - 1) / (m + p - 1)."""
    return (p - 1) / (m + p - 1)


def busy_fractions(m: int, stage_work) -> list[float]:
    """Each stage's busy share of a batch of m micro-batches through stages whose micro-batch
    times are in the ratio of `stage_work`: the batch takes the first micro-batch through every
    stage, then m - 1 slots of the slowest, and stage s works m t_s of it."""
    span = sum(stage_work) + (m - 1) * max(stage_work)
    return [m * t / span for t in stage_work]


def bubble_table(entries: list[Entry]) -> Table | None:
    """gpipe and 1f1b records that carry their stages' busy shares, a row per strategy and
    micro-batch count (the newest), against the two formulas; None without two counts."""
    runs: dict[tuple[str, int], Entry] = {}
    for e in sorted(entries, key=lambda e: (e.time, e.order)):
        r, busy = e.rec, e.extra.get("stage_busy")
        if r.strategy in ("gpipe", "1f1b") and isinstance(busy, list) and r.split_size:
            runs[(r.strategy, micro_batches(r.batch_size, r.split_size))] = e
    if len({m for _, m in runs}) < 2:
        return None
    one = runs.get(("gpipe", 1))  # its stages take turns: their work in the ratio of their shares
    work = one.extra["stage_busy"] if one is not None else None
    body = []
    for (strategy, m), e in sorted(runs.items()):
        busy = e.extra["stage_busy"]
        shares = [busy, None if work is None else busy_fractions(m, work)]
        shown = [DASH if x is None else " / ".join(f"{b:.2f}" for b in x) for x in shares]
        balanced = f"{1 - bubble_fraction(m, len(busy)):.2f}"
        body.append([strategy, str(m), str(e.rec.split_size), *shown, balanced, cell(e, False)])
    headers = ["strategy", "micro-batches m", "split size", "measured busy (stage 0 / 1 ...)"]
    headers += ["with imbalance", "balanced", "seconds"]
    return Table("resnet50: the pipeline's bubble", headers, body)
