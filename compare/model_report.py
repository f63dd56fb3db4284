"""The resnet50 split_size sweep against the two timing models of compare.pipeline_model: for each
framework both fits, their errors on held-out split sizes, the model the data supports (if any),
and that model's projection to more stages."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from compare import pipeline_model as pm
from compare.records import Entry
from compare.tables import DASH, R50Row, Table, decimals, fmt_stats, shared_note

PROJECTED_STAGES = (4, 8)

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


@dataclass
class RowFit:
    row: R50Row
    stage_seconds: list[float]  # the median per stage
    stage_records: int  # how many records the medians are of
    measured: dict[int, float]  # split size -> seconds
    selection: pm.Selection

    @property
    def shared(self) -> bool:
        """Whether some sweep record ran both stages on one device."""
        return any(e.shares_device for e in self.row.sweep.values())


def stage_seconds(e: Entry) -> list[float] | None:
    value = e.rec.extra.get("stage_seconds")
    if (
        isinstance(value, list)
        and len(value) >= 2
        and all(isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0 for t in value)
    ):
        return [float(t) for t in value]
    return None


def median_stages(row: R50Row) -> tuple[list[float], int] | None:
    """The median of every stage's time over the sweep's records (else the pipeline and
    model_parallel ones), among those with as many stages as the first."""
    sweep = [row.sweep[k] for k in sorted(row.sweep)]
    others = [row.runs.get("pipeline"), row.runs.get("model_parallel")]
    for candidates in (sweep, others):
        found = [t for e in candidates if e is not None and (t := stage_seconds(e))]
        if found:
            same = [t for t in found if len(t) == len(found[0])]
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
    return RowFit(row, stages[0], stages[1], measured, selection), ""


def fmt_seconds(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds >= 1 else f"{1000 * seconds:.3g} ms"


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
    batches = e.rec.extra.get("num_batches")
    fits = []
    for kind in pm.KINDS:
        fit = f.selection.fits.get(kind)
        if fit is None:
            continue
        m = fit.model
        held = "held-out error (mean / max) " + fmt_error(fit)
        zero = ", a parameter held at 0" if m.constrained else ""
        o = fmt_seconds(m.overhead)
        fits.append(f"{kind}: a = {m.scale:.3g}, o = {o} per micro-batch{zero}; {held}")
    note = shared_note(f.row.platform)
    shared = f" Here {note}." if f.shared else ""
    return (
        f"stage times {', '.join(f'{t:.3g}' for t in f.stage_seconds)} s (median of "
        f"{f.stage_records} record(s)); {len(f.measured)} split sizes, batch {e.rec.batch_size}"
        + (f", num_batches {batches}" if batches else "")
        + ". "
        + "; ".join(fits)
        + f". Model used: {verdict(f)}.{shared}"
    )


def model_table(f: RowFit) -> Table:
    """Every sweep point: measured, both models' values, and their held-out errors."""
    chosen = f.selection.chosen
    kinds = [k for k in pm.KINDS if k in f.selection.fits]
    headers = ["split size", "micro-batches", "bubble (pipelined)", "measured"]
    for kind in kinds:
        headers += [kind + (" (used)" if kind == chosen else ""), f"{kind}: held-out error"]
    body = []
    for split in sorted(f.measured):
        e = f.row.sweep[split]
        m = pm.micro_batches(e.rec.batch_size, split)
        cells = [str(split), str(m), f"{100 * pm.bubble_fraction(m, len(f.stage_seconds)):.0f}%"]
        cells.append(fmt_stats(e.stats, e.rec.extrapolated))
        for kind in kinds:
            fit = f.selection.fits[kind]
            t = fit.model.predict(split)
            err = fit.held_out.get(split)
            cells += [f"{t:.{decimals(t)}f} s", DASH if err is None else fmt_percent(err)]
        body.append(cells)
    return Table(f"{f.row.framework} models", headers, body)


def fmt_percent(x: float) -> str:
    return f"{round(100 * x, 1) + 0.0:+.1f}%"  # + 0.0: no "-0.0%"


def errors_table(fits: list[RowFit]) -> Table:
    """One line per framework: both models' held-out errors and the verdict."""
    headers = [
        "resnet50 sweep",
        "pipelined: held-out error",
        "serial: held-out error",
        "model used",
    ]
    body = [
        [f.row.framework]
        + [fmt_error(f.selection.fits.get(k)) for k in (pm.PIPELINED, pm.SERIAL)]
        + [f.selection.chosen or "neither fits"]
        for f in fits
    ]
    notes = [
        "held-out error: mean / max of |predicted - measured| / measured over the split sizes, "
        "each predicted by the fit to the others; a model is used when its mean is at most "
        f"{pm.FIT_LIMIT:.0%}."
    ]
    return Table("resnet50 sweep models", headers, body, notes)


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
    headers = ["split size", "micro-batches"] + [
        f"{p} stages ({'model' if p == model.stages else 'PROJECTION'})" for p in stages
    ]
    body = []
    for split in sorted(f.measured):
        cells = [str(split), str(pm.micro_batches(model.batch_size, split))]
        for p in stages:
            t = model.predict(split, p)
            cells.append(f"{t:.{decimals(t)}f} s")
        body.append(cells)
    body.append(["best split", DASH, *[str(pm.best_split(model, f.measured, p)) for p in stages]])
    note = f"{f.row.framework}: stage counts above {model.stages} are projections, not measured."
    return Table(f"{f.row.framework} projection", headers, body, [note])
