"""`python -m compare.report [--results PATH ...] [--out reports/] [--html]`

Reads results files (docs/design.md) and nothing else; writes `report.md` (and with --html a
self-contained `report.html`) and PNG plots into --out, and prints the main tables.
Records of every machine are shown: a summary of the best times on each, then a section per
comparable group (preset, platform, hardware); the report lists every record it left out and why.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

from common import config, devices
from compare import (
    ceiling,
    model_report,
    records,
    render,
    scaling_report,
    side_tables,
    summary,
    tables,
    throughput,
)
from compare.records import Entry, LeftOut, Machine
from compare.render import Doc, check_out, not_written, unchanged
from compare.tables import R50Row, Table

EXIT_NO_RESULTS = 1
EXIT_BAD_INPUT = 2
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
    # choices: a typo (`--preset smok`) is an error, not an empty report
    p.add_argument(
        "--preset",
        default=None,
        choices=config.PRESETS,
        help="show only this preset (default: every one)",
    )
    p.add_argument(
        "--platform",
        default=None,
        choices=devices.PLATFORMS,
        help="show only this platform (default auto: every one)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    platform = None if args.platform in (None, "auto") else args.platform
    try:
        check_out(Path(args.out))  # before any work, not after the plots
        return build(
            args.results or ["results/results.jsonl"], args.out, args.html, args.preset, platform
        )
    except OSError as e:
        print(f"error: cannot write the report: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


@dataclass
class Loaded:
    """The records read, and what became of each: shown (in a machine group) or left out."""

    read: list[Entry]
    warnings: list[str]
    invalid: list[LeftOut]
    superseded: list[LeftOut]
    left: list[LeftOut]  # not asked for (--preset, --platform), or another record in its place
    kept: list[Entry]
    machines: list[Machine]
    envs: dict[str, str]

    def left_out(self) -> int:
        return len(self.invalid) + len(self.superseded) + len(self.left)


def load(paths, preset=None, platform=None, out: Path | None = None) -> Loaded | None:
    """Every record of `paths`, sorted into machine groups; None (and one line on stderr) when
    nothing can be shown: then nothing is written, and a report already in `out` stays."""
    warnings: list[str] = []
    entries = records.read(paths, warnings)
    valid, invalid = records.check(entries)
    kept, superseded = records.newest(valid)
    machines, left = records.machines(kept, preset, platform)
    files = ", ".join(map(str, paths))
    unasked = [x for x in left if x.reason != records.NO_TRAINING]
    if not machines and unasked:
        asked = unasked[0].reason.removeprefix("not ")
        there = sorted({f"preset {x.entry.rec.preset} on {x.entry.rec.platform}" for x in unasked})
        print(
            f"error: none of the {len(unasked)} usable record(s) in {files} is {asked} "
            f"(there are: {'; '.join(there)}); choose one of those{unchanged(out)}",
            file=sys.stderr,
        )
        return None
    if not machines:
        problems = warnings + [f"{x.entry.describe()}: {x.reason}" for x in invalid + left]
        why = f"{len(problems)} problem(s); first: {problems[0]}" if problems else "no records"
        print(
            f"error: no usable results in {files} ({why}); "
            f"run `make compare` or `make bench` first{unchanged(out)}",
            file=sys.stderr,
        )
        return None
    envs = records.environments(kept)
    return Loaded(entries, warnings, invalid, superseded, left, kept, machines, envs)


@dataclass
class Section:
    machine: Machine
    workload: str
    entries: list[Entry]
    table: Table | None = None
    terminal: Table | None = None
    figures: list[tuple[Path, str]] = field(default_factory=list)


def build(paths, out, write_html=False, preset=None, platform=None, echo=print, notes=()) -> int:
    """The report of the records in `paths`; `notes`: lines for its top (a framework not set up).
    Every file is written into a folder of its own in `out` first and moved into place only
    when all are written: a failure (a full disk, a Ctrl-C) leaves the previous report whole."""
    out = Path(out)
    data = load(paths, preset, platform, out)
    if data is None:
        return EXIT_NO_RESULTS
    try:
        with render.staged(out) as stage, render.literal_plot_text():
            doc, best, sections = compose(paths, data, stage, notes, echo)
            written = render.write(doc, stage, TITLE if write_html else None)
    except OSError as e:
        print(f"error: {not_written(out, e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if len(data.machines) > 1:
        echo("\nthe best time on each machine")
        echo(render.text_table(best))
    terminal(sections, data, [out / p.relative_to(stage) for p in written], echo)
    return 0


def compose(paths, data: Loaded, out: Path, notes, echo) -> tuple[Doc, Table, list[Section]]:
    """The report's document, its summary table and its sections, the plots drawn into `out`."""
    doc = Doc()
    doc.heading(1, TITLE)
    doc.para(
        f"Generated {datetime.now(timezone.utc).isoformat(timespec='seconds')} from "
        f"{', '.join(f'`{p}`' for p in paths)}: {len(data.read)} record(s) read, "
        f"{len(data.superseded)} superseded by newer ones, {len(data.invalid)} unusable, "
        f"{len(data.warnings)} warning(s); {len(data.machines)} machine group(s). "
        "Environments (E1, ...) are listed at the end."
    )
    doc.items(list(notes))
    doc.para(throughput.COMPILED_NOTE)
    for note in notes:
        echo(f"note: {note}")
    doc.heading(2, "Summary: the best time on each machine")
    best = summary.summary_table(data.machines)
    doc.table(best)
    sections = []
    for machine in data.machines:
        sections += machine_section(doc, machine, out, data)
    environment_section(doc, data.kept, data.envs)
    left_out_section(doc, data)
    return doc, best, sections


def terminal(sections: list[Section], data: Loaded, written: list[Path], echo) -> None:
    """The main tables, the first warnings, and what was written."""
    for s in sections:
        if s.terminal is not None:
            echo(f"\n{s.workload} on {render.plain(s.machine.title)}")
            echo(render.text_table(s.terminal))
    warnings = data.warnings
    for warning in warnings[:MAX_WARNINGS_SHOWN]:
        echo(f"warning: {render.plain(warning)}")
    if len(warnings) > MAX_WARNINGS_SHOWN:
        echo(f"warning: ... and {len(warnings) - MAX_WARNINGS_SHOWN} more (see the report)")
    plots = sum(len(s.figures) for s in sections)
    echo(
        f"\nwrote {', '.join(map(str, written))} and {plots} plot(s) for "
        f"{len(data.machines)} machine group(s); {data.left_out()} record(s) left out, "
        f"{len(warnings)} warning(s) (listed in the report)"
    )


def machine_section(doc: Doc, machine: Machine, out: Path, data: Loaded) -> list[Section]:
    """A machine group's heading, then every workload's tables and plots."""
    doc.heading(2, machine.title)
    sources = sorted({e.source for e in machine.entries})
    doc.para(
        f"Comparable group: preset {machine.preset}, "
        f"{records.platform_text(machine.platform, machine.virtual)}, {machine.hardware}; "
        f"{len(machine.entries)} record(s) from {', '.join(f'`{s}`' for s in sources)}."
    )
    sections = []
    for workload in records.WORKLOADS:
        s = Section(machine, workload, machine.workload(workload))
        if workload == "resnet50":
            data.left += resnet50_section(doc, s, out / machine.slug, data.envs)
        else:
            dp_section(doc, s, out / machine.slug, data.envs)
        sections.append(s)
    if machine.cluster:
        s = Section(machine, "nodes", machine.cluster)
        draw = partial(nodes_plot, doc, s, out / machine.slug, data.envs)
        scaling_report.section(doc, s.entries, data.kept, draw)
        sections.append(s)
    return sections


def nodes_plot(doc: Doc, s: Section, out: Path, envs, workload: str, lines, used) -> None:
    """The cluster's plot of one workload (scaling_report.section draws it after its table)."""
    what = f"{workload}: seconds per step against the link's rate, dashed: the model"
    path = plots().nodes(out / f"{workload}_nodes.png", f"{what}\n{s.machine.title}", lines)
    add_figure(doc, s, path, what, used, envs)


def dp_section(doc: Doc, s: Section, out: Path, envs: dict[str, str]) -> None:
    doc.heading(3, HEADINGS[s.workload])
    if not s.entries:
        doc.para(f"No {s.workload} records in this group.")
        return
    rows = tables.dp_rows(s.entries)
    s.table = tables.dp_table(s.workload, rows, envs)
    s.terminal = side_tables.dp_terminal(rows)
    doc.table(s.table)
    ceiling_table = ceiling.ceiling_table(s.workload, s.entries, s.machine.ceilings, envs)
    if ceiling_table is not None:
        doc.heading(4, "Training loop vs its framework's ceiling")
        doc.para(ceiling.EXPLANATION)
        doc.table(ceiling_table)
    flops_section(doc, s.workload, s.entries)
    extras = side_tables.extras_table(f"{s.workload} memory and utilisation", rows)
    if extras is not None:
        doc.heading(4, "Memory and utilisation")
        doc.table(extras)
    name = s.workload
    marks = ceiling.sec_per_epoch(s.entries, s.machine.ceilings, name)
    bars = f"{name}: sec/epoch, median ± std" + (", black line: ceiling" if marks else "")
    figures = [
        (partial(plots().sec_bars, ceilings=marks), f"{name}_sec_per_epoch.png", bars),
        (plots().scaling, f"{name}_scaling.png", f"{name}: speedup vs 1 device, ideal dashed"),
        (plots().accuracy, f"{name}_accuracy.png", f"{name}: test accuracy per epoch"),
    ]
    for draw, file, what in figures:
        add_figure(
            doc, s, draw(out / file, f"{what}\n{s.machine.title}", rows), what, s.entries, envs
        )


def flops_section(doc: Doc, workload: str, entries: list[Entry]) -> None:
    table = throughput.flops_table(workload, entries)
    if table is not None:
        doc.heading(4, "Throughput: TFLOP/s and % of peak")
        doc.table(table)


def add_figure(doc: Doc, s: Section, path, what: str, used: list[Entry], envs) -> None:
    """A drawn plot (path None: nothing to draw) with its caption: what, where, environments."""
    if path is not None:
        caption = f"{what}; {s.machine.title}. Environment: {tables.env_cell(used, envs)}."
        s.figures.append((path, caption))
        doc.image(path, caption)


def resnet50_section(doc: Doc, s: Section, out: Path, envs: dict[str, str]) -> list[LeftOut]:
    doc.heading(3, HEADINGS[s.workload])
    if not s.entries:
        doc.para("No resnet50 records in this group.")
        return []
    rows, left = tables.r50_rows(s.entries)
    s.table = tables.r50_table(s.workload, rows, envs)
    s.terminal = side_tables.r50_terminal(s.table)
    doc.table(s.table)
    shown = [e for row in rows for e in row.entries()]
    flops_section(doc, s.workload, shown)
    for draw, file, what in (
        (plots().r50_bars, "resnet50_strategies.png", "resnet50: seconds per timed repeat"),
        (plots().sweep, "resnet50_split_size.png", "resnet50: the split_size tradeoff"),
    ):
        add_figure(doc, s, draw(out / file, f"{what}\n{s.machine.title}", rows), what, shown, envs)
    if any(row.sweep for row in rows):
        model_section(doc, s, rows, out, envs)
    return left


def model_section(doc: Doc, s: Section, rows: list[R50Row], out: Path, envs) -> None:
    doc.heading(4, "Pipelined or serial: the sweep against two timing models")
    doc.para(model_report.EXPLANATION)
    fits = []
    for row in rows:
        fitted, why = model_report.fit_row(row)
        if fitted is None:
            doc.para(f"{row.framework}: {why}")
            continue
        fits.append(fitted)
        doc.para(f"**{row.framework}**: {model_report.describe(fitted)}")
        doc.table(model_report.model_table(fitted))
        projected = model_report.projection(fitted)
        if isinstance(projected, Table):
            doc.table(projected)
        elif projected:
            doc.para(projected)
    if not fits:
        return
    doc.table(model_report.errors_table(fits))
    stages = model_report.PROJECTED_STAGES
    what = "resnet50: measured sweep and the model it supports (none drawn where neither fits)"
    if any(f.selection.chosen == "pipelined" for f in fits):
        what += ", projected to " + " and ".join(map(str, stages)) + " stages (not measured)"
    path = plots().model_plot(
        out / "resnet50_sweep_models.png", f"resnet50 sweep models\n{s.machine.title}", fits, stages
    )
    add_figure(doc, s, path, what, [e for f in fits for e in f.row.sweep.values()], envs)


def environment_section(doc: Doc, kept: list[Entry], envs: dict[str, str]) -> None:
    doc.heading(2, "Environment")
    used: dict[str, set[str]] = {}
    for e in kept:
        used.setdefault(records.environment_text(e.rec), set()).add(
            f"{e.rec.framework} {e.rec.workload}"
        )
    body = [[label, text, ", ".join(sorted(used.get(text, ())))] for text, label in envs.items()]
    doc.table(Table("environments", ["env", "hardware; versions; commit", "used by"], body))


def left_out_section(doc: Doc, data: Loaded) -> None:
    doc.heading(2, "Left out")
    if not (data.warnings or data.left_out()):
        doc.para("Nothing: every record read is shown.")
        return
    if data.warnings:
        doc.heading(3, "Unreadable lines and files")
        doc.items(data.warnings)
    for heading, outs in (
        ("Unusable records", data.invalid),
        ("Older records of the same cell (the newest is shown)", data.superseded),
        ("Not asked for, or another record shown in its place", data.left),
    ):
        if outs:
            doc.heading(3, heading)
            doc.items([f"{x.entry.describe()}: {x.reason}" for x in outs])


def plots():
    """matplotlib is imported only when a report is drawn."""
    from compare import plots as module

    return module


if __name__ == "__main__":
    sys.exit(main())
