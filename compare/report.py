"""`python -m compare.report [--results PATH ...] [--out reports/] [--html]`

Reads results files (docs/design.md) and nothing else; writes `report.md` (and with --html a
self-contained `report.html`) and PNG plots into --out, and prints the main tables.
Records of every machine are shown: a summary of the best times on each, then a section per
comparable group (preset, platform, hardware); the report lists every record it left out and why.
"""

# ruff: noqa: E402 (a stop while the modules import is handled before they import)
from __future__ import annotations

from common import signals

if __name__ == "__main__":
    signals.before_imports()

import argparse
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from common import config, devices
from compare import (
    collectives,
    memory,
    records,
    render,
    resnet50,
    scaling_report,
    summary,
    tables,
)
from compare.checks import WORKLOADS
from compare.records import Entry, LeftOut, Machine
from compare.render import Doc, check_out  # check_out: compare.run's too
from compare.tables import Table

EXIT_NO_RESULTS, EXIT_BAD_INPUT = 1, 2
MAX_WARNINGS_SHOWN = 10
HEADINGS = {
    "lenet": "lenet: data parallel from scratch (d2l 13.5)",
    "resnet18": "resnet18: concise data parallel (d2l 13.6)",
    "resnet50": "resnet50: model parallel and pipelined (PyTorch tutorial)",
    "zero": "zero: sharded data parallel (ZeRO-1, -2, -3 and FSDP), AdamW",
}
TITLE = "Multi-device training side by side: PyTorch, JAX, MXNet"
THROUGHPUT = "Throughput: TFLOP/s and % of peak"


def main(argv: list[str] | None = None) -> int:
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
    every = "show only this {} (default{}: every one)"
    p.add_argument("--preset", choices=config.PRESETS, help=every.format("preset", ""))
    p.add_argument("--platform", choices=devices.PLATFORMS, help=every.format("platform", " auto"))
    args = p.parse_args(argv)
    platform = None if args.platform in (None, "auto") else args.platform
    try:
        check_out(Path(args.out))  # before any work, not after the plots
        paths = args.results or ["results/results.jsonl"]
        return build(paths, args.out, args.html, args.preset, platform)
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
    machines: list[Machine]
    kept: list[Entry]

    def left_out(self) -> int:
        return len(self.invalid) + len(self.superseded) + len(self.left)


def load(paths, preset=None, platform=None, out: Path | None = None) -> Loaded | None:
    """Every record of `paths` in machine groups; None (and one line on stderr) when nothing
    can be shown: then nothing is written, and a report already in `out` stays."""
    warnings: list[str] = []
    entries = records.read(paths, warnings)
    valid, invalid = records.check(entries)
    kept, superseded = records.newest(valid)
    machines, left = records.machines(kept, preset, platform)
    if machines:
        return Loaded(entries, warnings, invalid, superseded, left, machines, kept)
    files = ", ".join(map(str, paths))
    unasked = [x for x in left if x.reason != records.NO_TRAINING]
    if unasked:
        asked = unasked[0].reason.removeprefix("not ")
        there = sorted({f"preset {x.entry.rec.preset} on {x.entry.rec.platform}" for x in unasked})
        why = f"none of the {len(unasked)} usable record(s) in {files} is {asked} (there are: "
        why += f"{'; '.join(there)}); choose one of those"
    else:
        problems = warnings + [f"{x.entry.describe()}: {x.reason}" for x in invalid + left]
        first = f"{len(problems)} problem(s); first: {problems[0]}" if problems else "no records"
        why = f"no usable results in {files} ({first}); run `make compare` or `make bench` first"
    print(f"error: {why}{render.unchanged(out)}", file=sys.stderr)
    return None


def build(paths, out, write_html=False, preset=None, platform=None, echo=print, notes=()) -> int:
    """The report of the records in `paths`; `notes`: lines for its top (a framework not set up).
    Every file is written into a folder of its own in `out` first and moved into place only
    when all are written: a failure (a full disk, a Ctrl-C) leaves the previous report whole."""
    out = Path(out)
    data = load(paths, preset, platform, out)
    if data is None:
        return EXIT_NO_RESULTS
    for note in notes:
        echo(f"note: {note}")
    try:
        with render.staged(out) as stage, render.literal_plot_text():
            report = Report(Doc(), stage, data, records.environments(data.kept))
            report.compose(paths, notes)
            written = render.write(report.doc, stage, TITLE if write_html else None)
    except OSError as e:
        print(f"error: {render.not_written(out, e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for title, table in report.terminal:
        echo(f"\n{title}")
        echo(render.text_table(table))
    warnings = data.warnings
    for warning in warnings[:MAX_WARNINGS_SHOWN]:
        echo(f"warning: {render.plain(warning)}")
    if len(warnings) > MAX_WARNINGS_SHOWN:
        echo(f"warning: ... and {len(warnings) - MAX_WARNINGS_SHOWN} more (see the report)")
    echo(
        f"\nwrote {', '.join(str(out / p.relative_to(stage)) for p in written)} and "
        f"{report.plots} plot(s) for {len(data.machines)} machine group(s); {data.left_out()} "
        f"record(s) left out, {len(warnings)} warning(s) (listed in the report)"
    )
    return 0


@dataclass
class Report:
    """The document, composed section by section, its plots drawn into `out`, and the tables
    the terminal shows once it is written."""

    doc: Doc
    out: Path
    data: Loaded
    envs: dict[str, str]
    terminal: list[tuple[str, Table]] = field(default_factory=list)
    plots: int = 0
    fits: dict = field(default_factory=dict)  # compare.collectives.fits: the step model's

    def compose(self, paths, notes) -> None:
        doc, data = self.doc, self.data
        doc.heading(1, TITLE)
        doc.para(
            f"Generated {datetime.now(timezone.utc).isoformat(timespec='seconds')} from "
            f"{', '.join(f'`{p}`' for p in paths)}: {len(data.read)} record(s) read, "
            f"{len(data.superseded)} superseded by newer ones, {len(data.invalid)} unusable, "
            f"{len(data.warnings)} warning(s); {len(data.machines)} machine group(s). "
            "Environments (E1, ...) are listed at the end."
        )
        doc.items(list(notes))
        doc.para(summary.COMPILED_NOTE)
        doc.heading(2, "Summary: the best time on each machine")
        doc.table(best := summary.summary_table(data.machines))
        if len(data.machines) > 1:
            self.terminal.append(("the best time on each machine", best))
        reduced = collectives.load(paths, data.warnings)  # the step model's input too
        self.fits = collectives.fits(reduced)
        for machine in data.machines:
            self.machine(machine)
        collectives.section(doc, reduced, self.out)
        self.environments()
        self.left_out()

    def machine(self, m: Machine) -> None:
        self.doc.heading(2, m.title)
        sources = ", ".join(f"`{s}`" for s in sorted({e.source for e in m.entries}))
        self.doc.para(
            f"Comparable group: preset {m.preset}, {records.platform_text(m.platform, m.virtual)}"
            f", {m.hardware}; {len(m.entries)} record(s) from {sources}."
        )
        for workload in WORKLOADS:
            self.doc.heading(3, HEADINGS[workload])
            entries = m.workload(workload)
            if not entries:
                self.doc.para(f"No {workload} records in this group.")
            elif workload == "resnet50":
                self.resnet50(m, entries)
            else:
                self.data_parallel(m, workload, entries)
            if workload == "zero" and entries:
                self.zero(entries)
        if m.cluster:

            def draw(workload: str, lines, used: list[Entry]) -> None:
                what = f"{workload}: seconds per step against the link's rate, dashed: the model"
                self.figure(m, "nodes", f"{workload}_nodes.png", what, used, lines)

            scaling_report.section(self.doc, m.cluster, self.data.kept, draw, self.fits)

    def figure(self, m: Machine, plot: str, file: str, what: str, used: list[Entry], *args) -> None:
        """A plot of the group (none where there is nothing to draw), with its caption."""
        from compare import plots  # matplotlib only when a report is drawn

        path = getattr(plots, plot)(self.out / m.slug / file, f"{what}\n{m.title}", *args)
        if path is not None:
            self.plots += 1
            envs = tables.env_cell(used, self.envs)
            self.doc.image(path, f"{what}; {m.title}. Environment: {envs}.")

    def table(self, heading: str, table: Table | str | None, text: str | None = None) -> None:
        """A table of its own under a heading (and a paragraph), where there is one."""
        if table is not None:
            self.doc.heading(4, heading)
            if text:
                self.doc.para(text)
            self.doc.table(table)

    def data_parallel(self, m: Machine, workload: str, entries: list[Entry]) -> None:
        rows = tables.dp_rows(entries)
        self.doc.table(tables.dp_table(workload, rows, self.envs))
        self.terminal.append((f"{workload} on {render.plain(m.title)}", tables.dp_terminal(rows)))
        found = tables.ceiling_table(workload, entries, m.ceilings, self.envs)
        self.table("Training loop vs its framework's ceiling", found, tables.CEILING_EXPLANATION)
        self.table(THROUGHPUT, summary.flops_table(workload, entries))
        extras = tables.extras_table(f"{workload} memory and utilisation", rows)
        self.table("Memory and utilisation", extras)
        marks = tables.ceiling_marks(entries, m.ceilings, workload)
        what = f"{workload}: sec/epoch, median ± std" + (", black line: ceiling" if marks else "")
        self.figure(m, "sec_bars", f"{workload}_sec_per_epoch.png", what, entries, rows, marks)
        what = f"{workload}: speedup vs 1 device, ideal dashed"
        self.figure(m, "scaling", f"{workload}_scaling.png", what, entries, rows)
        what = f"{workload}: test accuracy per epoch"
        self.figure(m, "accuracy", f"{workload}_accuracy.png", what, entries, rows)

    def zero(self, entries: list[Entry]) -> None:
        """Lesson 4: each device's state bytes beside ZeRO's closed forms, and what a step moves
        beside the textbook (compare/memory.py)."""
        what = "Memory per device: state bytes against ZeRO's closed forms"
        self.table(what, memory.memory_table(entries))
        self.table("What a step moves, against the textbook", memory.bytes_table(entries))
        what = "Seconds per epoch, a core per device, against plain data parallel on 1 device"
        self.table(what, memory.time_table(entries))

    def resnet50(self, m: Machine, entries: list[Entry]) -> None:
        rows, left = resnet50.rows_of(entries)
        self.data.left += left
        self.doc.table(table := resnet50.table("resnet50", rows, self.envs))
        keep = [i for i, h in enumerate(table.headers) if h not in ("platform", "preset", "env")]
        cut = [[row[i] for i in keep] for row in table.rows]
        terminal = Table("terminal", [table.headers[i] for i in keep], cut)
        self.terminal.append((f"resnet50 on {render.plain(m.title)}", terminal))
        shown = [e for row in rows for e in row.entries()]
        self.table(THROUGHPUT, summary.flops_table("resnet50", shown))
        what = "resnet50: seconds per timed repeat"
        self.figure(m, "r50_bars", "resnet50_strategies.png", what, shown, rows)
        what = "resnet50: the split_size tradeoff"
        self.figure(m, "sweep", "resnet50_split_size.png", what, shown, rows)
        bubble = resnet50.bubble_table(entries)
        self.table("The pipeline's bubble, swept", bubble, resnet50.BUBBLE_EXPLANATION)

    def environments(self) -> None:
        self.doc.heading(2, "Environment")
        used: dict[str, set[str]] = {}
        for e in self.data.kept:
            what = f"{e.rec.framework} {e.rec.workload}"
            used.setdefault(records.environment_text(e.rec), set()).add(what)
        body = [[label, text, ", ".join(sorted(used[text]))] for text, label in self.envs.items()]
        self.doc.table(
            Table("environments", ["env", "hardware; versions; commit", "used by"], body)
        )

    def left_out(self) -> None:
        doc, data = self.doc, self.data
        doc.heading(2, "Left out")
        if not (data.warnings or data.left_out()):
            doc.para("Nothing: every record read is shown.")
        for heading, items in (
            ("Unreadable lines and files", data.warnings),
            ("Unusable records", data.invalid),
            ("Older records of the same cell (the newest is shown)", data.superseded),
            ("Not asked for, or another record shown in its place", data.left),
        ):
            if items:
                doc.heading(3, heading)
                doc.items(
                    [
                        x if isinstance(x, str) else f"{x.entry.describe()}: {x.reason}"
                        for x in items
                    ]
                )


if __name__ == "__main__":
    sys.exit(signals.main(main))  # a Ctrl-C while it reads or writes: one line
