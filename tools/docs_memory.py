"""Lesson 4's tables on its page (tools/docs_hook.py): `--8<-- "results/X.jsonl:zero:KIND"`
draws compare/memory.py's table of that kind from the records, as the report draws it:

    holds    the idea: what one of 2 devices holds at each ZeRO stage, closed forms beside runs
    memory   each run's bytes per device against its closed form and its peak, at each N
    bytes    each run's collectives per step on 2 devices, in units of Ψ beside the textbook
    time     seconds per epoch at each device count, a core per device
"""

from __future__ import annotations

from compare import memory
from compare.render import escape

# A page's tables fit its width and height: the memory table folded into a column per device
# count, the collectives of 2 devices (which `make compare` runs; their bytes do not change
# with N).
KINDS = {
    "holds": lambda entries: memory.holds_table(entries, 2),
    "memory": memory.memory_grid,
    "bytes": lambda entries: memory.bytes_table(entries, 2),
    "time": memory.time_table,
}


def table(entries, kind: str) -> str:
    """The Markdown of `kind`'s table of `entries` (their text escaped), its notes below it."""
    if kind not in KINDS:
        raise LookupError(f"no zero table {kind!r}; choose from {', '.join(KINDS)}")
    found = KINDS[kind](entries)
    if found is None:
        raise LookupError(f"no zero runs for the {kind} table")
    cells = [
        [escape(str(c)).replace("|", "\\|") for c in row] for row in [found.headers, *found.rows]
    ]
    lines = ["| " + " | ".join(row) + " |" for row in cells]
    lines.insert(1, "| " + " | ".join("---" for _ in found.headers) + " |")
    # The extrapolated mark is the provenance line's to explain (tools/docs_hook.py).
    notes = [escape(n) for n in found.notes if not n.startswith("* ")]
    return "\n".join([*lines, "", " ".join(notes)])
