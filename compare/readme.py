"""`python -m compare.readme [--check]` (`make readme-tables`): the README's reference tables,
made from the committed records only.

Rewrites the part of README.md between BEGIN and END with the tables the records in REFERENCE
give (one block per machine group, as in the report); --check writes nothing and exits 1 when
the README differs. tests/compare/test_readme.py runs the check, so the tables cannot drift from
the records.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import results
from compare import ceiling, model_report, records, tables
from compare.records import Entry, Machine
from compare.render import markdown_table
from compare.tables import DASH, STAR, Table

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = (  # relative to ROOT
    "results/gpu-h200.jsonl",
    "results/gpu-h100.jsonl",
    "results/cpu-2core.jsonl",
    "results/cpu-avx2-2core.jsonl",
    "results/cpu-avx512-2core.jsonl",
)
BEGIN = "<!-- reference-results:begin (`make readme-tables` writes this part from the records) -->"
END = "<!-- reference-results:end -->"
CEILING_NOTE = (
    "ceiling: the framework's own tight-loop step of the same model on one device (`make "
    "ceiling`), per epoch; x ceiling = sec/epoch (1 dev) / ceiling sec/epoch, or, for a run "
    "that timed its ceiling after each epoch (`--ceiling`), the median of its epochs' ratios."
)
DIFFERS = "the reference tables differ from the records; run `make readme-tables`"


class ReadmeError(ValueError):
    """Records or a README the tables cannot be made from: the message is one line."""


def load(paths=REFERENCE, root: Path = ROOT) -> list[Machine]:
    """The machine groups of the reference records; every line must be a usable record."""
    warnings: list[str] = []
    entries = records.read([root / p for p in paths], warnings)
    valid, invalid = records.check(entries)
    problems = warnings + [f"{x.entry.describe()}: {x.reason}" for x in invalid]
    if problems:
        raise ReadmeError(f"{len(problems)} problem(s) in the records; first: {problems[0]}")
    kept, _ = records.newest(valid)
    machines, _ = records.machines(kept)
    if not machines:
        raise ReadmeError(f"no records in {', '.join(paths)}")
    return machines


def fragment(paths=REFERENCE, root: Path = ROOT) -> str:
    """The markdown between the markers (markers excluded)."""
    blocks = []
    for machine in load(paths, root):
        blocks.append(machine_line(machine, root))
        for workload in records.WORKLOADS:
            entries = machine.workload(workload)
            if not entries:
                continue
            if workload == "resnet50":
                blocks += [markdown_table(t) for t in r50_tables(entries)]
            else:
                mine = [c for c in machine.ceilings if c.rec.workload == workload]
                blocks.append(markdown_table(dp_table(workload, entries, mine)))
    return "\n\n".join(blocks)


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
    if e is None or e.rec.extra.get("utilization_source") != "nvml":
        return None
    return f"{tables.fmt_percent(e.rec.extra.get('utilization'))}%"


def dp_table(workload: str, entries: list[Entry], ceilings: list[Entry] = ()) -> Table:
    """lenet, resnet18: test accuracy, sec/epoch on every device count, speedup, GPU busy, and
    where a ceiling was measured, the 1-device run against it (compare/ceiling.py)."""
    rows = tables.dp_rows(entries)
    counts = tables.device_counts(rows)
    with_busy = [n for n in counts if any(busy(r.cells.get(n)) for r in rows)]
    headers = [workload_title(workload, entries), f"test acc ({' / '.join(map(str, counts))} dev)"]
    headers += [f"sec/epoch ({n} dev)" for n in counts]
    multi = [n for n in counts if n > 1]
    headers += [f"speedup ({n} dev)" for n in multi]
    headers += [f"GPU busy ({n} dev)" for n in with_busy]
    tops = [ceiling.of(row.cells.get(1), ceilings) for row in rows]
    if any(tops):
        headers += ["ceiling sec/epoch", "x ceiling (1 dev)"]
    body = []
    for row, c in zip(rows, tops, strict=True):
        found = [row.cells.get(n) for n in counts]
        cells = [f"{row.framework} {row.label}"]
        cells.append(" / ".join(tables.fmt_acc(tables.acc_of(e)) for e in found))
        cells += [tables.time_cell(e) for e in found]
        for n in multi:
            s = row.speedup(n)
            cells.append(tables.fmt_speedup(s and s[0], row.extrapolated(1, n)))
        cells += [busy(row.cells.get(n)) or DASH for n in with_busy]
        if any(tops):
            x = c and ceiling.ratio(row.cells.get(1), c)
            cells += [tables.time_cell(c), DASH if x is None else f"{x:.2f}x"]
        body.append(cells)
    notes = []
    if any(e.rec.extrapolated for e in entries):
        notes.append(f"{STAR} extrapolated: the epoch time is projected from the timed steps.")
    if with_busy:
        notes.append("GPU busy: mean NVML utilisation over the timed epochs.")
    if any(tops):
        notes.append(CEILING_NOTE)
    if any(e.diverged for e in entries):
        notes.append(tables.DIVERGED_NOTE)
    return Table(workload, headers, body, notes)


R50_COLUMNS = ("single", "model_parallel", "pipeline", "best split", "gpipe", "1f1b")


def r50_tables(entries: list[Entry]) -> list[Table]:
    """The seconds of every strategy (columns no framework ran are dropped), and where a sweep
    was measured, both models' held-out errors."""
    rows, _ = tables.r50_rows(entries)
    cells = {
        row.framework: {
            name: tables.r50_cell(row.best() if name == "best split" else row.runs.get(name))
            for name in R50_COLUMNS
        }
        for row in rows
    }
    columns = [c for c in R50_COLUMNS if any(cells[r.framework][c] != DASH for r in rows)]
    body = [[r.framework, *[cells[r.framework][c] for c in columns]] for r in rows]
    notes = [f"{STAR} extrapolated."] if any(e.rec.extrapolated for e in entries) else []
    shared = [e for e in entries if e.shares_device]
    if shared:
        notes.append(f"{tables.SHARED} {tables.shared_note(shared[0].rec.platform)}.")
    out = [Table("resnet50", [r50_title(entries), *columns], body, notes)]
    fits = [f for row in rows if (f := model_report.fit_row(row)[0]) is not None]
    if fits:
        out.append(model_report.errors_table(fits))
    return out


def r50_title(entries: list[Entry]) -> str:
    """`resnet50 (seconds per 3 batches of 120 at 128x128)`: one timed repeat, from the records."""
    e = entries[0]
    batches = e.rec.extra.get("num_batches")
    size = e.rec.extra.get("image_size")
    work = f"{batches} batches" if batches else "timed repeat"
    return (
        f"resnet50 (seconds per {work} of {e.rec.batch_size}{f' at {size}x{size}' if size else ''})"
    )


def splice(text: str, new: str) -> str:
    """`text` with the part between the markers replaced by `new`."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ReadmeError(f"the README needs one line {BEGIN} and, after it, one line {END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n\n{new}\n\n{END}{tail}"


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    p = argparse.ArgumentParser(prog="python -m compare.readme", description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="only compare; exit 1 when they differ")
    p.add_argument("--readme", type=Path, default=root / "README.md")
    args = p.parse_args(argv)
    try:
        text = args.readme.read_text(encoding="utf-8")
        new = splice(text, fragment(REFERENCE, root))
    except (ReadmeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(f"{args.readme}: {DIFFERS}", file=sys.stderr)
            return 1
        print(f"{args.readme}: the reference tables match the records")
        return 0
    if new != text:
        args.readme.write_text(new, encoding="utf-8")
    done = "rewritten" if new != text else "already up to date"
    print(f"{args.readme}: reference tables {done} from {', '.join(REFERENCE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
