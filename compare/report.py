"""`python -m compare.report [--results PATH ...] [--out reports/] [--html]`

Reads results files (docs/design.md) and nothing else; writes `report.md` (and with --html a
self-contained `report.html`) and PNG plots into --out, and prints the main tables.
Only comparable records stand side by side; the report lists every record it left out and why.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from compare import pipeline_model, records, render, tables
from compare.records import Entry, LeftOut
from compare.render import Doc
from compare.tables import R50Row, Table

EXIT_NO_RESULTS = 1
EXIT_BAD_INPUT = 2
PROJECTED_STAGES = (4, 8)
MAX_WARNINGS_SHOWN = 10
HEADINGS = {
    "lenet": "lenet: data parallel from scratch (d2l 13.5)",
    "resnet18": "resnet18: concise data parallel (d2l 13.6)",
    "resnet50": "resnet50: model parallel and pipelined (PyTorch tutorial)",
}
TITLE = "Multi-device training side by side: PyTorch, JAX, MXNet"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m compare.report", description=__doc__.split("\n")[2])
    p.add_argument(
        "--results",
        nargs="+",
        action="extend",
        help="results file(s) (default: results/results.jsonl)",
    )
    p.add_argument("--out", default="reports", help="directory for report.md and plots")
    p.add_argument("--html", action="store_true", help="also write a self-contained report.html")
    p.add_argument("--preset", default=None, help="show this preset (default: the most complete)")
    p.add_argument(
        "--platform",
        default=None,
        choices=("auto", "cpu", "gpu"),
        help="show this platform (default auto: the most complete)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    platform = None if args.platform in (None, "auto") else args.platform
    try:
        return build(
            args.results or ["results/results.jsonl"], args.out, args.html, args.preset, platform
        )
    except OSError as e:
        print(f"error: cannot write the report: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


@dataclass
class Section:
    workload: str
    group: tuple | None
    entries: list[Entry]
    table: Table | None = None
    terminal: Table | None = None
    figures: list[tuple[Path, str]] = field(default_factory=list)


def build(paths, out, write_html=False, preset=None, platform=None, echo=print) -> int:
    out = Path(out)
    warnings: list[str] = []
    entries = records.read(paths, warnings)
    valid, invalid = records.check(entries)
    if not valid:
        problems = warnings + [f"{x.entry.describe()}: {x.reason}" for x in invalid]
        why = f"{len(problems)} problem(s); first: {problems[0]}" if problems else "no records"
        print(
            f"error: no usable results in {', '.join(map(str, paths))} ({why}); "
            "run `make compare` or `make bench` first",
            file=sys.stderr,
        )
        return EXIT_NO_RESULTS
    kept, superseded = records.newest(valid)
    envs = records.environments(kept)
    doc = Doc()
    doc.heading(1, TITLE)
    doc.para(
        f"Generated {datetime.now(UTC).isoformat(timespec='seconds')} from "
        f"{', '.join(f'`{p}`' for p in paths)}: {len(entries)} record(s) read, "
        f"{len(superseded)} superseded by newer ones, {len(invalid)} unusable, "
        f"{len(warnings)} warning(s). Environments (E1, ...) are listed at the end."
    )
    left: list[LeftOut] = []
    sections = []
    for workload in records.WORKLOADS:
        group, chosen, other = records.choose_group(kept, workload, preset, platform)
        left += other
        section = Section(workload, group, chosen)
        if workload == "resnet50":
            left += resnet50_section(doc, section, out, envs)
        else:
            dp_section(doc, section, out, envs)
        sections.append(section)
    environment_section(doc, kept, envs)
    left_out_section(doc, warnings, invalid, superseded, left)

    out.mkdir(parents=True, exist_ok=True)
    md = out / "report.md"
    md.write_text(doc.markdown(out), encoding="utf-8")
    written = [md]
    if write_html:
        page = out / "report.html"
        page.write_text(doc.html(TITLE), encoding="utf-8")
        written.append(page)
    for s in sections:
        if s.terminal is None:
            continue
        _, shown_preset, shown_platform, virtual = s.group
        where = records.platform_text(shown_platform, virtual)
        echo(f"\n{s.workload} (preset {shown_preset}, {where})")
        echo(render.text_table(s.terminal))
    for warning in warnings[:MAX_WARNINGS_SHOWN]:
        echo(f"warning: {warning}")
    if len(warnings) > MAX_WARNINGS_SHOWN:
        echo(f"warning: ... and {len(warnings) - MAX_WARNINGS_SHOWN} more (see the report)")
    plots = sum(len(s.figures) for s in sections)
    echo(
        f"\nwrote {', '.join(map(str, written))} and {plots} plot(s); "
        f"{len(left) + len(invalid) + len(superseded)} record(s) left out, "
        f"{len(warnings)} warning(s) (listed in the report)"
    )
    return 0


def figure_caption(what: str, used: list[Entry], envs: dict[str, str]) -> str:
    return f"{what}. Environment: {tables.env_cell(used, envs)}."


def dp_section(doc: Doc, s: Section, out: Path, envs: dict[str, str]) -> None:
    doc.heading(2, HEADINGS[s.workload])
    if s.group is None:
        doc.para(f"No comparable {s.workload} records.")
        return
    rows = tables.dp_rows(s.entries)
    s.table = tables.dp_table(s.workload, rows, envs)
    s.terminal = tables.dp_terminal(rows)
    doc.para(f"Comparable group: {records.group_text(s.group)}.")
    doc.table(s.table)
    extras = tables.extras_table(f"{s.workload} memory and utilisation", rows)
    if extras is not None:
        doc.heading(3, "Memory and utilisation")
        doc.table(extras)
    name = s.workload
    figures = [
        (plots().sec_bars, f"{name}_sec_per_epoch.png", f"{name}: sec/epoch, median ± std"),
        (plots().scaling, f"{name}_scaling.png", f"{name}: speedup vs 1 device, ideal dashed"),
        (plots().accuracy, f"{name}_accuracy.png", f"{name}: test accuracy per epoch"),
    ]
    for draw, file, what in figures:
        path = draw(out / file, what, rows)
        if path is not None:
            caption = figure_caption(what, s.entries, envs)
            s.figures.append((path, caption))
            doc.image(path, caption)


def resnet50_section(doc: Doc, s: Section, out: Path, envs: dict[str, str]) -> list[LeftOut]:
    doc.heading(2, HEADINGS[s.workload])
    if s.group is None:
        doc.para("No comparable resnet50 records.")
        return []
    rows, left = tables.r50_rows(s.entries)
    s.table = tables.r50_table(s.workload, rows, envs)
    s.terminal = tables.r50_terminal(s.table)
    doc.para(f"Comparable group: {records.group_text(s.group)}.")
    doc.table(s.table)
    shown = [e for row in rows for e in row.entries()]
    for draw, file, what in (
        (plots().r50_bars, "resnet50_strategies.png", "resnet50: seconds per timed repeat"),
        (plots().sweep, "resnet50_split_size.png", "resnet50: the split_size tradeoff"),
    ):
        path = draw(out / file, what, rows)
        if path is not None:
            caption = figure_caption(what, shown, envs)
            s.figures.append((path, caption))
            doc.image(path, caption)
    model_section(doc, s, rows, out, envs)
    return left


def model_section(doc: Doc, s: Section, rows: list[R50Row], out: Path, envs) -> None:
    doc.heading(3, "Pipeline model (GPipe) beside the measured sweep")
    doc.para(
        "With p stages and m micro-batches a batch takes about (m + p - 1) / m slowest-stage times "
        "(bubble (p - 1) / (m + p - 1)) plus a fixed overhead per micro-batch: "
        "`T = a * (m + p - 1) / m * max_stage + m * overhead`. `max_stage` is measured (each stage "
        "alone, one whole batch, forward and backward); `a` (ideally the number of batches per "
        "timed repeat) and `overhead` are fitted to two sweep points (the fewest and the most "
        "micro-batches); the other points test the model. **Projections** to more stages assume "
        "the same total stage work and imbalance, and the same overhead: they are not measured."
    )
    fits = []
    for row in rows:
        model, text = fit_row(row)
        if model is None:
            doc.para(f"{row.framework}: {text}")
            continue
        fits.append((row, model))
        doc.para(f"**{row.framework}**: {text}")
        doc.table(model_table(row, model))
        doc.table(projection_table(row, model))
    if fits:
        path = plots().model_plot(
            out / "resnet50_pipeline_model.png", "resnet50: GPipe model", fits, PROJECTED_STAGES
        )
        used = [e for row, _ in fits for e in row.sweep.values()]
        caption = figure_caption(
            "resnet50: GPipe model vs measured sweep, and projections to "
            + " and ".join(map(str, PROJECTED_STAGES))
            + " stages (projections, not measured)",
            used,
            envs,
        )
        s.figures.append((path, caption))
        doc.image(path, caption)


def fit_row(row: R50Row) -> tuple[pipeline_model.Model | None, str]:
    """The fitted model of one framework's sweep, and a sentence about it (or why not)."""
    if len(row.sweep) < 2:
        return None, "no split_size sweep with two or more points; no model."
    batch_sizes = {e.rec.batch_size for e in row.sweep.values()}
    if len(batch_sizes) != 1:
        return None, f"the sweep mixes batch sizes {sorted(batch_sizes)}; no model."
    candidates = [row.runs.get("pipeline"), row.runs.get("model_parallel")]
    candidates += [row.sweep[k] for k in sorted(row.sweep)]
    source = next((e for e in candidates if e is not None and stage_seconds(e)), None)
    if source is None:
        return None, "no record carries per-stage times (extra['stage_seconds']); no model."
    stages = stage_seconds(source)
    measured = {k: e.median for k, e in row.sweep.items()}
    model = pipeline_model.fit(stages, batch_sizes.pop(), measured)
    if model is None:
        return None, "the sweep's points all have the same number of micro-batches; no model."
    held = pipeline_model.held_out_error(model, measured)
    error = (
        f"error on the {len(measured) - 2} other point(s): mean {100 * held[0]:.1f}%, "
        f"max {100 * held[1]:.1f}%"
        if held
        else "no point left to test the model"
    )
    where = f"split {source.rec.split_size}" if source.rec.split_size else "no split"
    batches = source.rec.extra.get("num_batches")
    expected = f" (num_batches {batches})" if batches else ""
    constrained = (
        " The exact fit gave a negative parameter, so one is held at 0: the points do not follow "
        "the model."
        if model.constrained
        else ""
    )
    return model, (
        f"stage times {', '.join(f'{t:.4g}' for t in stages)} s from the {source.label} record "
        f"({where}); fitted at split sizes {model.fit_splits[0]} and {model.fit_splits[1]}: "
        f"a = {model.scale:.3g}{expected}, overhead = {fmt_overhead(model.overhead)} per "
        f"micro-batch; {error}.{constrained}"
    )


def fmt_overhead(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds >= 1 else f"{1000 * seconds:.3g} ms"


def stage_seconds(e: Entry) -> list[float] | None:
    value = e.rec.extra.get("stage_seconds")
    if (
        isinstance(value, list)
        and len(value) >= 2
        and all(isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0 for t in value)
    ):
        return [float(t) for t in value]
    return None


def model_table(row: R50Row, model: pipeline_model.Model) -> Table:
    errors = pipeline_model.errors(model, {k: e.median for k, e in row.sweep.items()})
    body = []
    for split in sorted(row.sweep):
        e = row.sweep[split]
        m = pipeline_model.micro_batches(model.batch_size, split)
        body.append(
            [
                str(split) + (" (fit)" if split in model.fit_splits else ""),
                str(m),
                f"{100 * pipeline_model.bubble_fraction(m, model.stages):.0f}%",
                tables.fmt_stats(e.stats, e.rec.extrapolated),
                f"{model.predict(split):.{tables.decimals(model.predict(split))}f} s",
                f"{round(100 * errors[split], 1) + 0.0:+.1f}%",  # no "-0.0%"
            ]
        )
    headers = ["split size", "micro-batches", "bubble", "measured", "model", "error"]
    return Table(f"{row.framework} model", headers, body)


def projection_table(row: R50Row, model: pipeline_model.Model) -> Table:
    stages = [model.stages, *[p for p in PROJECTED_STAGES if p > model.stages]]
    headers = ["split size", "micro-batches"] + [
        f"{p} stages ({'model' if p == model.stages else 'PROJECTION'})" for p in stages
    ]
    body = []
    for split in sorted(row.sweep):
        m = pipeline_model.micro_batches(model.batch_size, split)
        cells = [str(split), str(m)]
        for p in stages:
            t = model.predict(split, p)
            cells.append(f"{t:.{tables.decimals(t)}f} s")
        body.append(cells)
    best = [str(pipeline_model.best_split(model, row.sweep, p)) for p in stages]
    body.append(["best split", DASH, *best])
    return Table(
        f"{row.framework} projection",
        headers,
        body,
        [
            f"{row.framework}: stage counts above {model.stages} are projections of the model, "
            "not measurements."
        ],
    )


DASH = tables.DASH


def environment_section(doc: Doc, kept: list[Entry], envs: dict[str, str]) -> None:
    doc.heading(2, "Environment")
    used: dict[str, set[str]] = {}
    for e in kept:
        used.setdefault(records.environment_text(e.rec), set()).add(
            f"{e.rec.framework} {e.rec.workload}"
        )
    body = [[label, text, ", ".join(sorted(used.get(text, ())))] for text, label in envs.items()]
    doc.table(Table("environments", ["env", "hardware; versions; commit", "used by"], body))


def left_out_section(doc: Doc, warnings, invalid, superseded, left) -> None:
    doc.heading(2, "Left out")
    if not (warnings or invalid or superseded or left):
        doc.para("Nothing: every record read is shown.")
        return
    if warnings:
        doc.heading(3, "Unreadable lines and files")
        doc.items(warnings)
    if invalid:
        doc.heading(3, "Unusable records")
        doc.items([f"{x.entry.describe()}: {x.reason}" for x in invalid])
    if superseded:
        doc.heading(3, "Older records of the same cell (the newest is shown)")
        doc.items([f"{x.entry.describe()}: {x.reason}" for x in superseded])
    if left:
        doc.heading(3, "Not comparable, or another record shown in its place")
        doc.items([f"{x.entry.describe()}: {x.reason}" for x in left])


def plots():
    """matplotlib is imported only when a report is drawn."""
    from compare import plots as module

    return module


if __name__ == "__main__":
    sys.exit(main())
