"""`make readme-tables`: the reference tables and the README's figure, from the records only.

`python -m compare.readme [--check]`: the tables of each machine group of REFERENCE (the
README: README_SOURCES' groups; docs/results.md: the others, and each committed cluster records
file as the report's "Scaling across nodes" shows it), and the figure of the README's GPU group
(compare/figure.py). --check writes nothing and exits 1 when any differs from the records.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from common import results
from compare import collectives, figure, memory, records, resnet50, scaling_report, tables
from compare.checks import WORKLOADS
from compare.records import Entry, Machine
from compare.render import escape, markdown_table, quoted
from compare.tables import DASH, STAR, Table

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = (  # relative to ROOT
    "results/gpu-h200.jsonl",
    "results/gpu-h100.jsonl",
    "results/cpu-2core.jsonl",
    "results/cpu-avx2-2core.jsonl",
    "results/cpu-avx512-2core.jsonl",
    "results/cpu-xeon-avx512-2core-cores.jsonl",
    "results/cpu-xeon-avx512-2core.jsonl",
    "results/zero-cpu-epyc-avx512-2core.jsonl",
)
# The README's groups: the fastest GPU, its records all of one clean commit; the CPU of one clean
# `make compare` of the whole plan, each 2-device run on cores of its own beside a 1-device run;
# lesson 4's on a CPU, its plan's runs and the same strategies on 4 and 8 devices.
README_SOURCES = (
    "results/gpu-h200.jsonl",
    "results/cpu-xeon-avx512-2core.jsonl",
    "results/zero-cpu-epyc-avx512-2core.jsonl",
)
FIGURE = "docs/comparison.png"
FIGURE_DATA = "docs/comparison.json"
BEGIN = "<!-- reference-results:begin (`make readme-tables` writes this part from the records) -->"
END = "<!-- reference-results:end -->"
OTHERS_BEGIN, OTHERS_END = (
    BEGIN.replace("reference-results", "other-machines"),
    "<!-- other-machines:end -->",
)
SCALING_BEGIN, SCALING_END = BEGIN.replace("reference-results", "scaling"), "<!-- scaling:end -->"
COLLECTIVES_FIGURE = "docs/collectives.png"  # every engine's all-reduce time against its size
COLLECTIVES_DATA = "docs/collectives.json"  # what it was drawn from
COLLECTIVES_FIGURE_LINK = "collectives.png"  # from docs/results.md
CLUSTER_FILES = "results/cluster-*.jsonl"  # the committed records of `make cluster`, by name
NO_CLUSTER = (
    "No cluster records are committed yet: `make cluster RESULTS=results/cluster-NAME.jsonl` "
    f"writes them, and every `{CLUSTER_FILES}` committed is shown here."
)
# The 1-GPU records the predictions start from: the H100's, the card the GPU targets are set for.
PREDICTIONS_SOURCE = "results/gpu-h100.jsonl"
PREDICTIONS_LABEL = (
    "**Predictions, not measurements**, for interconnects the project has not been lent: the "
    f"1-GPU record in `{PREDICTIONS_SOURCE}` of each engine the cluster ran (the H100, the "
    "project's target card) as the compute, with the gradient bytes of the runs above."
)
CEILING_NOTE = (
    "ceiling: the framework's own tight-loop step of the same model on one device (`make "
    "ceiling`), per epoch; x ceiling = sec/epoch (1 dev) / ceiling sec/epoch, or, for a run "
    "that timed its ceiling after each epoch (`--ceiling`), the median of its epochs' ratios."
)


@dataclass(frozen=True)
class Part:
    """A generated part of a Markdown file: the text between two marker lines."""

    path: str  # relative to ROOT
    begin: str
    end: str
    what: str


README = Part("README.md", BEGIN, END, "the reference tables")
OTHERS = Part("docs/results.md", OTHERS_BEGIN, OTHERS_END, "the other machines' tables")
SCALING = Part("docs/results.md", SCALING_BEGIN, SCALING_END, "the scaling tables")


class ReadmeError(ValueError):
    """Records or a README the tables cannot be made from (one line)."""


def load(paths=REFERENCE, root: Path = ROOT) -> list[Machine]:
    """The machine groups of each file apart (two files of one machine are two tables); every
    line must be a usable record."""
    machines: list[Machine] = []
    for path in paths:
        warnings: list[str] = []
        entries = records.read([root / path], warnings)
        valid, invalid = records.check(entries)
        problems = warnings + [f"{x.entry.describe()}: {x.reason}" for x in invalid]
        if problems:
            raise ReadmeError(f"{len(problems)} problem(s) in the records; first: {problems[0]}")
        # A committed table names the commit it ran: one of a tree with uncommitted changes
        # (`-dirty`) names no code anyone can check out, so it is left out of them.
        kept, _ = records.newest([e for e in valid if not dirty(e.rec.git_commit)])
        machines += records.machines(kept)[0]
    if not machines:
        raise ReadmeError(f"no records in {', '.join(paths)}")
    return machines


def dirty(commit: str | None) -> bool:
    return str(commit or "").endswith("-dirty")


def split(machines: list[Machine], root: Path) -> tuple[list[Machine], list[Machine]]:
    """(the README's groups: all their records from README_SOURCES, docs/results.md's)."""
    shown, others = [], []
    for m in machines:
        files = {shown_path(e.source, root) for e in m.entries + m.ceilings}
        (shown if files <= set(README_SOURCES) else others).append(m)
    if not any(m.platform == "gpu" for m in shown):
        raise ReadmeError(f"no GPU machine group in {', '.join(README_SOURCES)} for the figure")
    return shown, others


def render(machines: list[Machine], root: Path) -> str:
    """A generated part (markers excluded): per group its line and tables, then the notes."""
    items = [x for m in machines for x in (machine_line(m, root), *machine_tables(m))]
    return "\n\n".join(with_notes(items))


def with_notes(items: list[Table | str]) -> list[str]:
    """The blocks of `items` (tables without their notes), then every table's notes once."""
    notes = list(dict.fromkeys(n for item in items if isinstance(item, Table) for n in item.notes))
    blocks = [x if isinstance(x, str) else markdown_table(x, notes=False) for x in items]
    return blocks + ([quoted(notes)] if notes else [])


def machine_tables(machine: Machine) -> list[Table]:
    out = []
    for workload in WORKLOADS:
        entries = machine.workload(workload)
        if not entries:
            continue
        if workload == "resnet50":
            out += r50_tables(entries)
        else:
            mine = [c for c in machine.ceilings if c.rec.workload == workload]
            out.append(dp_table(workload, entries, mine))
        if workload == "zero" and (held := memory.memory_grid(entries)) is not None:
            out.append(held)  # lesson 4: each device's state bytes beside ZeRO's closed forms
    return out


def fragments(root: Path = ROOT) -> tuple[dict[Part, str], dict]:
    """The generated text of each part, and the figure's data."""
    reference = load(REFERENCE, root)
    shown, others = split(reference, root)
    gpu = next(m for m in shown if m.platform == "gpu")
    sources = sorted({shown_path(e.source, root) for e in gpu.entries + gpu.ceilings})
    parts = {README: render(shown, root), OTHERS: render(others, root)}
    parts[SCALING] = scaling_part(reference, root)
    return parts, figure.data(gpu, sources)


def cluster_files(root: Path) -> list[str]:
    return sorted(shown_path(str(p), root) for p in root.glob(CLUSTER_FILES))


def scaling_part(reference: list[Machine], root: Path) -> str:
    """Per cluster records file, each machine group's line, the scaling tables and their notes,
    then the predictions; NO_CLUSTER without such a file."""
    paths = cluster_files(root)
    if not paths:
        return NO_CLUSTER
    gpus = [
        e for m in reference for e in m.entries if shown_path(e.source, root) == PREDICTIONS_SOURCE
    ]
    blocks = []
    for path in paths:
        groups = [m for m in load([path], root) if m.cluster]
        if not groups:
            blocks.append(f"`{path}`: no runs of the cluster in one box.")
        reduced = collectives.latest(collectives.load([root / path]))
        fits = collectives.fits(reduced)
        for machine in groups:
            measured, predicted = scaling_report.docs_items(machine.cluster, gpus, fits)
            blocks += [machine_line(machine, root), *with_notes(measured), PREDICTIONS_LABEL]
            blocks += with_notes(predicted)
        if reduced:
            blocks += [allreduce_line(path, reduced), *with_notes([collectives.fit_table(reduced)])]
            blocks.append(f"![time per all-reduce against its size]({COLLECTIVES_FIGURE_LINK})")
    return "\n\n".join(blocks)


def allreduce_line(path: str, reduced: list[dict]) -> str:
    """`**Each engine's all-reduce alone** (file; versions; commits)`, from the records."""
    order = records.FRAMEWORK_ORDER
    found = {(r["framework"], str(r.get("versions", {}).get(r["framework"]))) for r in reduced}
    versions = [escape(f"{fw} {v}") for fw, v in sorted(found, key=lambda x: order.index(x[0]))]
    commits = sorted({escape(results.short_commit(r.get("git_commit"))) for r in reduced})
    return (
        f"**Each engine's all-reduce alone** (`{path}`; {', '.join(versions)}; "
        f"commit {', '.join(commits)}; the plot: `{COLLECTIVES_FIGURE}`)"
    )


def collectives_figure(root: Path) -> tuple[list[dict], dict]:
    """The all-reduce records of every committed cluster file (the newest of each run) and the
    data the plot of them shows (figure.stale and the sidecar compare it)."""
    reduced = collectives.latest(collectives.load([root / p for p in cluster_files(root)]))
    keys = ("framework", "ranks", "link", "rows", "collective")
    return reduced, {"runs": [{k: r.get(k) for k in keys} for r in reduced]}


def shown_path(source: str, root: Path) -> str:
    try:
        return Path(source).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return source


def machine_line(machine: Machine, root: Path) -> str:
    """`**title** (files; versions; commits)`, all from the records."""
    files = sorted({shown_path(e.source, root) for e in machine.entries})
    versions = []
    for framework in records.FRAMEWORK_ORDER:
        mine = [e for e in machine.entries if e.rec.framework == framework]
        found = sorted({framework_version(e) for e in mine})
        if found:
            versions.append(" / ".join(found))
    commits = sorted({results.short_commit(e.rec.git_commit) for e in machine.entries})
    return (
        f"**{machine.title}** ({', '.join(f'`{f}`' for f in files)}; {', '.join(versions)}; "
        f"commit{'s' if len(commits) > 1 else ''} {', '.join(commits)})"
    )


def framework_version(e: Entry) -> str:
    v = e.rec.versions if isinstance(e.rec.versions, dict) else {}
    text = f"{e.rec.framework} {v.get(e.rec.framework, '?')}"
    if e.rec.platform == "gpu" and v.get("cuda"):
        text += f" (CUDA {v['cuda']})"
    return text


def workload_title(workload: str, entries: list[Entry]) -> str:
    """`resnet18 (3 epochs of 10 timed steps)`, from what the records say."""
    epochs = sorted({e.rec.epochs for e in entries if e.rec.epochs})
    steps = sorted({e.rec.steps_timed for e in entries if e.rec.extrapolated and e.rec.steps_timed})
    text = f"{'/'.join(map(str, epochs))} epochs" if epochs else ""
    if steps:
        text += f" of {'/'.join(map(str, steps))} timed steps"
    return f"{workload} ({text})" if text else workload


def busy(e: Entry | None) -> str | None:
    """The GPU's utilisation (NVML) of a record, if it has one."""
    if e is None or e.extra.get("utilization_source") != "nvml":
        return None
    return f"{tables.fmt_each(e.extra.get('utilization'))}%"


def dp_table(workload: str, entries: list[Entry], ceilings: list[Entry] = ()) -> Table:
    """lenet, resnet18: test accuracy, sec/epoch, speedup of like runs, GPU busy, and the
    1-device run against its ceiling; a column only where some row has a figure for it."""
    rows = tables.dp_rows(entries)
    counts = tables.device_counts(rows)
    pinned = any(row.cores is not None for row in rows)  # a cores/device column only then
    lines = []
    for row in rows:
        top = tables.ceiling_of(row.cells.get(1), ceilings)
        cells = {n: row.measures(n) for n in counts}
        line = {workload_title(workload, entries): f"{row.framework} {row.label}"}
        line["cores/device"] = tables.cores_text(row) if pinned else None
        line[f"test acc ({' / '.join(map(str, counts))} dev)"] = " / ".join(
            cells[n]["test acc"] for n in counts
        )
        line |= {f"sec/epoch ({n} dev)": cells[n]["sec/epoch"] for n in counts}
        line |= {f"speedup ({n} dev)": cells[n]["speedup"] for n in counts if n > 1}
        line |= {f"GPU busy ({n} dev)": busy(row.cells.get(n)) for n in counts}
        x = top and tables.ceiling_ratio(row.cells.get(1), top)
        line["ceiling sec/epoch"] = top and tables.time_cell(top)
        line["x ceiling (1 dev)"] = top and (DASH if x is None else f"{x:.2f}x")
        lines.append(line)
    frame = pd.DataFrame(lines).dropna(axis=1, how="all")
    with_busy = any(c.startswith("GPU busy") for c in frame)
    notes = dp_notes(entries, rows, with_busy, "ceiling sec/epoch" in frame, pinned)
    return Table.of(workload, frame.where(frame.notna(), DASH), notes)


def dp_notes(entries, rows, with_busy: bool, tops: bool, pinned: bool) -> list[str]:
    notes = []
    if any(e.rec.extrapolated for e in entries):
        notes.append(f"{STAR} extrapolated: the epoch time is projected from the timed steps.")
    if pinned:
        notes.append(tables.CORES_NOTE)
    notes += tables.unlike_notes(rows)
    if with_busy:
        notes.append("GPU busy: mean NVML utilisation over the timed epochs.")
    if tops:
        notes.append(CEILING_NOTE)
    if any(e.diverged for e in entries):
        notes.append(tables.DIVERGED_NOTE)
    return notes


def r50_tables(entries: list[Entry]) -> list[Table]:
    """The seconds of every strategy (columns no framework ran are dropped)."""
    rows, _ = resnet50.rows_of(entries)
    frame = pd.DataFrame(
        {r50_title(entries): row.framework}
        | {name: resnet50.cell(row.get(name)) for name in resnet50.STRATEGIES}
        for row in rows
    )
    notes = [f"{STAR} extrapolated."] if any(e.rec.extrapolated for e in entries) else []
    notes += tables.shared_diverged_notes(entries, diverged=False)
    return [Table.of("resnet50", frame.loc[:, (frame != DASH).any()], notes)]


def r50_title(entries: list[Entry]) -> str:
    """`resnet50 (seconds per 3 batches of 120 at 128x128)`: one timed repeat, from the records."""
    e = entries[0]
    batches = e.rec.extra.get("num_batches")
    size = e.rec.extra.get("image_size")
    work = f"{batches} batches" if batches else "timed repeat"
    return (
        f"resnet50 (seconds per {work} of {e.rec.batch_size}{f' at {size}x{size}' if size else ''})"
    )


def splice(text: str, new: str, part: Part = README) -> str:
    """`text` with the part between the markers replaced by `new`."""
    begin, end = part.begin, part.end
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ReadmeError(f"{part.path} needs one line {begin} and, after it, one line {end}")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n\n{new}\n\n{end}{tail}"


def rewrites(root: Path) -> tuple[list[tuple[Part, str, str]], dict]:
    """(part, the file's text, its text with the part from the records) of each part, and the
    figure's data; ReadmeError or OSError when they cannot be made. Parts of one file follow
    one another: each starts from the text the one before it left, so the last is the file's."""
    parts, data = fragments(root)
    out, texts = [], {}
    for part, new in parts.items():
        if part.path not in texts:
            texts[part.path] = (root / part.path).read_text(encoding="utf-8")
        old = texts[part.path]
        texts[part.path] = splice(old, new, part)
        out.append((part, old, texts[part.path]))
    return out, data


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    p = argparse.ArgumentParser(prog="python -m compare.readme", description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="only compare; exit 1 when they differ")
    args = p.parse_args(argv)
    try:
        texts, data = rewrites(root)
    except (ReadmeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    png, sidecar = root / FIGURE, root / FIGURE_DATA
    stale = [(p.path, f"{p.what} differ from the records") for p, old, new in texts if new != old]
    stale += [(shown_path(str(f), root), why) for f, why in figure.stale(data, png, sidecar)]
    reduced, drawn = collectives_figure(root)
    plot, plot_data = root / COLLECTIVES_FIGURE, root / COLLECTIVES_DATA
    plot_stale = figure.stale(drawn, plot, plot_data) if reduced else []
    stale += [(shown_path(str(f), root), why) for f, why in plot_stale]
    if args.check:
        for path, why in stale:
            print(f"{path}: {why}; run `make readme-tables`", file=sys.stderr)
        if not stale:
            print(f"{README.path}, {OTHERS.path} and {FIGURE} match the records")
        return 1 if stale else 0
    for part, old, new in texts:  # in order: a file's later part holds its earlier ones
        if new != old:
            (root / part.path).write_text(new, encoding="utf-8")
    if figure.stale(data, png, sidecar):
        figure.write(data, png, sidecar)
    if plot_stale:
        collectives.plot(plot, reduced, metadata={figure.KEY: figure.encode(drawn)})
        plot_data.write_text(figure.encode(drawn), encoding="utf-8")
    if stale:
        done = ", ".join(dict.fromkeys(path for path, _ in stale))
        print(f"rewritten from {', '.join([*REFERENCE, *cluster_files(root)])}: {done}")
    else:
        print(f"{README.path}, {OTHERS.path} and {FIGURE} already match the records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
