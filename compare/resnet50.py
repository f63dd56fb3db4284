"""resnet50's tables: the seconds of every strategy per framework (the split_size sweep's best
point among them), and the pipeline's bubble measured against GPipe's formula."""

from __future__ import annotations

import math
from dataclasses import dataclass

from common import results
from compare import render, tables
from compare.records import Entry, LeftOut, platform_text, rank
from compare.tables import DASH, SHARED, STAR, Table, fmt_stats, time_cell

STRATEGIES = ("single", "model_parallel", "pipeline", "best split", "gpipe", "1f1b")
BUBBLE_EXPLANATION = (
    "torch's pipelining engine (`gpipe`, `1f1b`: a process per stage) at m micro-batches. "
    "**measured**: each stage's busy share of the timed repeats, the seconds the schedule spent "
    "computing its micro-batches (each forward and backward as the engine runs it) over the wall "
    "time. **with imbalance**: the schedule played out with each stage's own measured forward "
    "and backward per micro-batch and nothing else (no link, no engine): each computation starts "
    "once its stage is free and its input is there, and stage s computes m (f_s + b_s) of that "
    "span (for GPipe the span is the sum of f_s + b_s plus m - 1 times the slowest forward and "
    "the slowest backward). **balanced**: 1 - (p - 1) / (m + p - 1), equal stages. The wall "
    "time is the schedule's span, what the step takes beyond it (the sends and receives, the "
    "engine's work between spans: the loss, merging, scaling the gradients) and what comes "
    "outside the step (the optimizer, the repeat's barrier): measured busy = with imbalance x "
    "the span's share. The span is played out with the stages' mean times: where their times "
    "vary, the step may take a little less."
)
NO_1F1B_BELOW_P = (
    "No 1f1b row with fewer micro-batches than stages (m = 1 on two): the engine's 1F1B needs at "
    "least one micro-batch per stage."
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


def stage_order(strategy: str, m: int, p: int, s: int) -> list[tuple[str, int]]:
    """Stage s's computations in the order torch's engine runs them, ("F" or "B", micro-batch):
    GPipe all forwards, then all backwards; 1F1B p - s forwards, then a backward and a forward
    in turn, then the backwards left."""
    if strategy == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(m, p - s)
    order = [("F", i) for i in range(warm)]
    for i in range(m):
        order += [("B", i)] + ([("F", warm + i)] if warm + i < m else [])
    return order


def schedule_span(strategy: str, m: int, forward: list[float], backward: list[float]) -> float:
    """The time m micro-batches take through stages that spend forward[s] and backward[s] on
    each, and nothing else: each computation starts once its stage is free and its input is
    there (a forward: the stage before's forward of the micro-batch; a backward: the stage
    after's backward)."""
    p = len(forward)
    orders = [stage_order(strategy, m, p, s) for s in range(p)]
    end: dict[tuple[str, int, int], float] = {}
    free, at = [0.0] * p, [0] * p
    while any(at[s] < len(orders[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while at[s] < len(orders[s]):
                kind, i = orders[s][at[s]]
                edge = s == 0 if kind == "F" else s == p - 1
                needs = (kind, s - 1 if kind == "F" else s + 1, i)
                if not edge and needs not in end:
                    break
                start = max(free[s], 0.0 if edge else end[needs])
                free[s] = end[(kind, s, i)] = start + (forward if kind == "F" else backward)[s]
                at[s], moved = at[s] + 1, True
        if not moved:
            raise ValueError(f"{strategy} at m = {m} waits on itself")
    return max(free)


def predicted_busy(strategy: str, m: int, forward: list[float], backward: list[float]):
    """Each stage's busy share of `schedule_span`: m (f_s + b_s) over the span."""
    span = schedule_span(strategy, m, forward, backward)
    return [m * (f + b) / span for f, b in zip(forward, backward, strict=True)]


@dataclass(frozen=True)
class Bubble:
    """One gpipe or 1f1b record's stage spans (torch_impl/pipelining.py, `stage_spans`)."""

    strategy: str
    m: int
    entry: Entry
    forward: list[float]  # seconds per micro-batch, per stage
    backward: list[float]
    busy: list[float]  # measured: compute spans over the wall time
    span: float  # the schedule's span over the timed repeats, predicted from forward, backward
    step: float  # seconds in the schedule's step (the longest stage's)
    wall: float  # seconds of the timed repeats (the longest stage's: they end at one barrier)


def bubble_of(e: Entry) -> Bubble | None:
    """The record's stage spans, or None without them. Records of the stages' CPU time
    (`stage_busy`, made before the spans) are not read: CPU time counts gloo's polling and
    leaves out what a stage waits for inside its computation, so it is no schedule's busy time."""
    r, spans = e.rec, e.extra.get("stage_spans")
    if r.strategy not in ("gpipe", "1f1b") or not r.split_size or not isinstance(spans, list):
        return None
    keys = ("forward", "backward", "step", "wall", "micro_batches")
    if len(spans) < 2 or not all(isinstance(x, dict) and _numbers(x, keys) for x in spans):
        return None
    m, count = micro_batches(r.batch_size, r.split_size), spans[0]["micro_batches"]
    if count <= 0 or count % m or any(x["micro_batches"] != count for x in spans):
        return None
    forward = [x["forward"] / count for x in spans]
    backward = [x["backward"] / count for x in spans]
    wall = max(x["wall"] for x in spans)
    busy = [(x["forward"] + x["backward"]) / wall for x in spans]
    span = count // m * schedule_span(r.strategy, m, forward, backward)
    step = max(x["step"] for x in spans)
    return Bubble(r.strategy, m, e, forward, backward, busy, span, step, wall)


def _numbers(x: dict, keys) -> bool:
    return all(type(x.get(k)) in (int, float) and x[k] >= 0 for k in keys) and x["wall"] > 0


def bubble_runs(entries: list[Entry]) -> dict[tuple[str, int], Bubble]:
    """The newest record with stage spans of each strategy and micro-batch count."""
    runs: dict[tuple[str, int], Bubble] = {}
    for e in sorted(entries, key=lambda e: (e.time, e.order)):
        if (b := bubble_of(e)) is not None:
            runs[(b.strategy, b.m)] = b
    return dict(sorted(runs.items(), key=lambda kv: (kv[0][0] != "gpipe", kv[0][1])))


def bubble_table(entries: list[Entry]) -> Table | None:
    """gpipe and 1f1b records that carry their stages' compute spans, a row per strategy and
    micro-batch count (the newest), beside the schedule with the stages' imbalance and with
    balanced stages; None without two counts."""
    runs = bubble_runs(entries)
    if len({m for _, m in runs}) < 2:
        return None

    def each(values, form="{:.2f}") -> str:
        return " / ".join(form.format(v) for v in values)

    body = []
    for (strategy, m), b in runs.items():
        p = len(b.busy)
        predicted = predicted_busy(strategy, m, b.forward, b.backward)
        compute = [1e3 * (f + g) for f, g in zip(b.forward, b.backward, strict=True)]
        shares = (b.span, b.step - b.span, b.wall - b.step)
        body.append(
            [strategy, str(m), str(b.entry.rec.split_size), each(b.busy), each(predicted)]
            + [f"{1 - bubble_fraction(m, p):.2f}", each(compute, "{:.0f}")]
            + [f"{x / b.wall:.2f}" for x in shares]
        )
    headers = ["strategy", "micro-batches m", "split size", "busy, measured (stage 0 / 1 ...)"]
    headers += ["busy, with imbalance", "busy, balanced", "compute per micro-batch, ms"]
    headers += [
        "wall: the schedule's span",
        "wall: in the step beyond it",
        "wall: outside the step",
    ]
    notes = [NO_1F1B_BELOW_P] if any(s == "1f1b" for s, _ in runs) else []
    return Table("resnet50: the pipeline's bubble", headers, body, notes)


def bubble_markdown(entries: list[Entry], source: str) -> str | None:
    """The bubble table as a page shows it (the docs hook), and where its records come from."""
    table = bubble_table(entries)
    if table is None:
        return None
    shown = [b.entry.rec for b in bubble_runs(entries).values()]
    hw, first = shown[0].hardware, shown[0]
    versions = ", ".join(dict.fromkeys(f"torch {r.versions.get('torch')}" for r in shown))
    commits = ", ".join(dict.fromkeys(results.short_commit(r.git_commit) for r in shown))
    where = (
        f"{hw.get('cpu')} ({hw.get('cpu_isa')}), {hw.get('cpu_count')} cores, preset "
        f"{first.preset}, {first.extra.get('num_batches')} batches a repeat; {versions}; commit "
        f"{commits}; shares of the timed repeats' wall time, each stage's spans summed over them."
    )
    return f"{render.markdown_table(table)}\n\n`{source}`: {render.escape(where)}"
