"""The records a page of the site draws (tools/docs_hook.py): read and checked as the report
reads them, chosen by its rule (clean commits, the newest record of each cell, one machine
group), and their text escaped as the report escapes it."""

from __future__ import annotations

import json
from pathlib import Path

from common import results
from compare import checks, records
from compare.readme import dirty
from compare.records import Entry
from compare.render import escape

ROOT = Path(__file__).resolve().parent.parent
# Fashion-MNIST's ten classes: a guess is right one time in ten. A run under twice that has
# learnt next to nothing (a few steps of a preset made for speed).
GUESS = 0.1


def drawn(path: str, workload: str) -> list[Entry]:
    """The runs of `workload` in `path` that a table may draw: of clean commits, the newest of
    each cell, not a cluster's, all of one machine group (compare/records.py's rule)."""
    kept, _ = records.newest([e for e in entries(path) if not dirty(e.rec.git_commit)])
    groups = [g for m in records.machines(kept)[0] if (g := m.workload(workload))]
    if len(groups) > 1:
        raise LookupError(
            f"{path} holds {workload} runs of {len(groups)} machine groups (preset, platform, "
            "hardware): a table draws one; keep each group's records in a file of its own"
        )
    return groups[0] if groups else []


def entries(path: str) -> list[Entry]:
    """Every record of `path`, checked as the report checks it; a bad line, or a record the
    report would leave out (a field of the wrong type, say), is a ResultsError naming the line."""
    file = ROOT / path
    try:
        recs = results.load(file)
    except results.ResultsError as e:
        raise results.ResultsError(str(e).replace(str(file), path, 1)) from None
    lines = record_lines(file)
    entries = [Entry(rec, path, i) for i, rec in enumerate(recs)]
    for e in entries:
        if why := checks.problem(e.rec):
            raise results.ResultsError(f"{path}:{lines[e.order]}: {why}")
    return entries


def record_lines(file: Path) -> list[int]:
    """The line of each record results.load read from `file`, in its order (it skips blank
    lines and other kinds of record; every line is a JSON object once it has read them)."""
    with file.open("rb") as f:
        lines = [(n, raw) for n, raw in enumerate(f, start=1) if raw.strip()]
    return [n for n, raw in lines if json.loads(raw).get("workload") not in results.OTHER_KINDS]


def accuracy(acc: float | None) -> str:
    """A test accuracy as a cell shows it: one at chance says so."""
    if acc is None:
        return "–"
    return f"{acc:.3f}" + (" (chance)" if chance(acc) else "")


def chance(acc: float) -> bool:
    """Whether `acc` is what guessing scores, near enough: the run learnt next to nothing."""
    return acc < 2 * GUESS


def text(value) -> str:
    """A record's text as a table cell shows it, literally (as the report escapes it)."""
    return escape(str(value)).replace("|", "\\|")
