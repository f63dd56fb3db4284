"""resnet50's tables: the seconds of every strategy per framework, the split_size sweep against
the two timing models of compare/pipeline_model.py (fits, held-out errors, the model the data
supports and its projection to more stages), and the pipeline's bubble."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from compare import pipeline_model as pm
from compare import tables
from compare.checks import positive
from compare.records import Entry, LeftOut, platform_text, rank
from compare.tables import DASH, SHARED, STAR, Table, decimals, fmt_stats, time_cell

PROJECTED_STAGES = (4, 8)
STRATEGIES = ("single", "model_parallel", "pipeline", "best split", "gpipe", "1f1b")
EXPLANATION = (
    "A timed repeat runs `a` batches (ideally num_batches) of m micro-batches through p stages, "
    "and every micro-batch costs a fixed overhead `o`. Two models: **pipelined** (GPipe: the "
    "stages overlap, bubble (p - 1) / (m + p - 1)), `T = a * (m + p - 1) / m * max_stage + m * o`; "
    "**serial** (nothing overlaps, the stage times add), `T = a * sum(stages) + m * o`. The stage "
    "times are measured (each stage alone, one whole batch, forward and backward: the median over "
    "the records that carry them); `a` and `o` are fitted to the sweep (least squares on the "
    "relative error, both >= 0). **Held-out error**: each split size left out of the fit in turn "
    "and predicted by the rest. The model with the smaller mean held-out error is used if that "
    f"error is at most {pm.FIT_LIMIT:.0%}; otherwise neither is, and none is drawn. "
    "**Projections** to more stages come from the model used only (same total stage work and "
    "imbalance, same overhead): they are not measured."
)
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


@dataclass
class RowFit:
    row: R50Row
    stage_seconds: list[float]  # the median per stage
    stage_records: int  # how many records the medians are of
    measured: dict[int, float]  # split size -> seconds
    selection: pm.Selection


def median_stages(row: R50Row) -> tuple[list[float], int] | None:
    """The median of every stage's time over the sweep's records (else the pipeline and
    model_parallel ones), among those with as many stages as the first."""
    sweep = [row.sweep[k] for k in sorted(row.sweep)]
    for candidates in (sweep, [row.runs.get("pipeline"), row.runs.get("model_parallel")]):
        found = [e.extra.get("stage_seconds") for e in candidates if e is not None]
        found = [t for t in found if isinstance(t, list) and len(t) >= 2 and all(map(positive, t))]
        same = [list(map(float, t)) for t in found if len(t) == len(found[0])] if found else []
        if same:
            return [statistics.median(ts) for ts in zip(*same, strict=True)], len(same)
    return None


def fit_row(row: R50Row) -> tuple[RowFit | None, str]:
    """Both models fitted to one framework's sweep, or why not."""
    if len(row.sweep) < 2:
        return None, "no split_size sweep with two or more points; no model."
    batch_sizes = {e.rec.batch_size for e in row.sweep.values()}
    if len(batch_sizes) != 1:
        return None, f"the sweep mixes batch sizes {sorted(batch_sizes)}; no model."
    stages = median_stages(row)
    if stages is None:
        return None, "no record carries per-stage times (extra['stage_seconds']); no model."
    measured = {k: e.median for k, e in row.sweep.items()}
    selection = pm.select(stages[0], batch_sizes.pop(), measured)
    if selection is None:
        return None, "the sweep's points all have the same number of micro-batches; no model."
    return RowFit(row, *stages, measured, selection), ""


def fmt_error(fit: pm.Fit | None) -> str:
    """`6.5% / 11.9%`: mean / max held-out error."""
    if fit is None or fit.mean_error is None:
        return DASH
    return f"{100 * fit.mean_error:.1f}% / {100 * fit.max_error:.1f}%"


def verdict(f: RowFit) -> str:
    sel = f.selection
    if sel.chosen is not None:
        return (
            f"**{sel.chosen}** (mean held-out error {100 * sel.fits[sel.chosen].mean_error:.1f}%)"
        )
    if sel.best is None:
        return "neither: too few split sizes to hold one out"
    return (
        f"**neither fits**: the better, {sel.best}, misses held-out split sizes by "
        f"{100 * sel.fits[sel.best].mean_error:.1f}% on average (limit {pm.FIT_LIMIT:.0%})"
    )


def describe(f: RowFit) -> str:
    """A paragraph: the stage times, both fits and the verdict."""
    e = next(iter(f.row.sweep.values()))
    batches = e.extra.get("num_batches")
    fits = []
    for kind, fit in ((k, f.selection.fits.get(k)) for k in pm.KINDS):
        if fit is not None:
            m, o = fit.model, fit.model.overhead
            o = f"{o:.3g} s" if o >= 1 else f"{1000 * o:.3g} ms"
            zero = ", a parameter held at 0" if m.constrained else ""
            fits.append(
                f"{kind}: a = {m.scale:.3g}, o = {o} per micro-batch{zero}; "
                f"held-out error (mean / max) {fmt_error(fit)}"
            )
    shared = any(e.shares_device for e in f.row.sweep.values())
    return (
        f"stage times {', '.join(f'{t:.3g}' for t in f.stage_seconds)} s (median of "
        f"{f.stage_records} record(s)); {len(f.measured)} split sizes, batch {e.rec.batch_size}"
        + (f", num_batches {batches}" if batches else "")
        + f". {'; '.join(fits)}. Model used: {verdict(f)}."
        + (f" Here {tables.shared_note(f.row.platform)}." if shared else "")
    )


def model_table(f: RowFit) -> Table:
    """Every sweep point: measured, both models' values, and their held-out errors."""
    kinds = [k for k in pm.KINDS if k in f.selection.fits]
    headers = ["split size", "micro-batches", "bubble (pipelined)", "measured"]
    for kind in kinds:
        used = " (used)" if kind == f.selection.chosen else ""
        headers += [kind + used, f"{kind}: held-out error"]
    body = []
    for split in sorted(f.measured):
        e = f.row.sweep[split]
        m = pm.micro_batches(e.rec.batch_size, split)
        bubble = pm.bubble_fraction(m, len(f.stage_seconds))
        cells = [str(split), str(m), f"{100 * bubble:.0f}%", fmt_stats(e.stats, e.rec.extrapolated)]
        for fit in (f.selection.fits[k] for k in kinds):
            t, err = fit.model.predict(split), fit.held_out.get(split)
            held = DASH if err is None else f"{round(100 * err, 1) + 0.0:+.1f}%"  # + 0.0: no -0.0
            cells += [f"{t:.{decimals(t)}f} s", held]
        body.append(cells)
    return Table(f"{f.row.framework} models", headers, body)


def errors_table(fits: list[RowFit]) -> Table:
    """A line per framework: both models' held-out errors and the verdict."""
    headers = ["resnet50 sweep", "pipelined: held-out error", "serial: held-out error"]
    body = [
        [f.row.framework, *(fmt_error(f.selection.fits.get(k)) for k in (pm.PIPELINED, pm.SERIAL))]
        + [f.selection.chosen or "neither fits"]
        for f in fits
    ]
    note = (
        "held-out error: mean / max of |predicted - measured| / measured over the split sizes, "
        "each predicted by the fit to the others; a model is used when its mean is at most "
        f"{pm.FIT_LIMIT:.0%}."
    )
    return Table("resnet50 sweep models", [*headers, "model used"], body, [note])


def projection(f: RowFit) -> Table | str | None:
    """The used model projected to more stages: a table (pipelined), a sentence (serial: more
    stages that do not overlap change nothing), or None (no model used)."""
    model = f.selection.model
    if model is None:
        return None
    if model.kind == pm.SERIAL:
        return (
            f"{f.row.framework}: the serial model projects the same times to "
            + " and ".join(map(str, PROJECTED_STAGES))
            + " stages (PROJECTION): stages that do not overlap add up to the same work."
        )
    stages = [model.stages, *[p for p in PROJECTED_STAGES if p > model.stages]]
    headers = ["split size", "micro-batches"]
    headers += [f"{p} stages ({'model' if p == model.stages else 'PROJECTION'})" for p in stages]
    body = []
    for split in sorted(f.measured):
        times = [model.predict(split, p) for p in stages]
        m = pm.micro_batches(model.batch_size, split)
        body.append([str(split), str(m), *(f"{t:.{decimals(t)}f} s" for t in times)])
    body.append(["best split", DASH, *[str(pm.best_split(model, f.measured, p)) for p in stages]])
    note = f"{f.row.framework}: stage counts above {model.stages} are projections, not measured."
    return Table(f"{f.row.framework} projection", headers, body, [note])


def bubble_table(entries: list[Entry]) -> Table | None:
    """gpipe and 1f1b records that carry their stages' busy shares, a row per strategy and
    micro-batch count (the newest), against the two formulas; None without two counts."""
    runs: dict[tuple[str, int], Entry] = {}
    for e in sorted(entries, key=lambda e: (e.time, e.order)):
        r, busy = e.rec, e.extra.get("stage_busy")
        if r.strategy in ("gpipe", "1f1b") and isinstance(busy, list) and r.split_size:
            runs[(r.strategy, pm.micro_batches(r.batch_size, r.split_size))] = e
    if len({m for _, m in runs}) < 2:
        return None
    one = runs.get(("gpipe", 1))  # its stages take turns: their work in the ratio of their shares
    work = one.extra["stage_busy"] if one is not None else None
    body = []
    for (strategy, m), e in sorted(runs.items()):
        busy = e.extra["stage_busy"]
        shares = [busy, None if work is None else pm.busy_fractions(m, work)]
        shown = [DASH if x is None else " / ".join(f"{b:.2f}" for b in x) for x in shares]
        balanced = f"{1 - pm.bubble_fraction(m, len(busy)):.2f}"
        body.append([strategy, str(m), str(e.rec.split_size), *shown, balanced, cell(e, False)])
    headers = ["strategy", "micro-batches m", "split size", "measured busy (stage 0 / 1 ...)"]
    headers += ["with imbalance", "balanced", "seconds"]
    return Table("resnet50: the pipeline's bubble", headers, body)
