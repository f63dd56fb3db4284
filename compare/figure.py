"""The README's figure (`make readme-tables` writes it): seconds per epoch of every framework and
path on one device of one machine group, each bar with its ceiling marked, paired as the
README's tables pair them (compare/ceiling.py).

What the figure shows is kept as data twice: in a sidecar JSON next to the PNG, and in a text
chunk of the PNG itself. `python -m compare.readme --check` compares both with what the records
give, never the pixels, which differ between matplotlib versions; so a committed picture that no
longer matches the records, or a picture drawn from other data than its sidecar, fails the
check.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

from compare import ceiling, tables
from compare.records import Entry, Machine

WORKLOADS = ("resnet18", "lenet")  # the panels, top to bottom
KEY = "comparison-data"  # the PNG text chunk that holds the data
DIGITS = 4  # significant digits kept: more than a bar or its label can show


def _round(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.{DIGITS}g}")


def bar(e: Entry, c: Entry | None) -> dict:
    """One 1-device training record and its ceiling (None without one)."""
    x = None if c is None else ceiling.ratio(e, c)
    measured = None if c is None else "apart"
    if c is not None and c.rec.extra.get(ceiling.SAME_RUN):
        measured = "in the run"
    return {
        "label": f"{e.rec.framework} {e.label}",
        "framework": e.rec.framework,
        "sec_per_epoch": _round(e.median),
        "std": _round(e.std),
        "n": e.stats.get("n"),
        "extrapolated": bool(e.rec.extrapolated),
        "ceiling_sec_per_epoch": None if c is None else _round(c.median),
        "x_ceiling": _round(x),
        "ceiling_measured": measured,
    }


def panel(workload: str, machine: Machine) -> dict | None:
    """The bars of one workload, in the tables' order; None without a 1-device record."""
    entries = machine.workload(workload)
    ceilings = [c for c in machine.ceilings if c.rec.workload == workload]
    ones = [row.cells[1] for row in tables.dp_rows(entries) if 1 in row.cells]
    shown = [e for e in ones if not e.diverged]
    if not shown:
        return None
    epochs = sorted({e.rec.epochs for e in shown if e.rec.epochs})
    return {
        "workload": workload,
        "epochs": epochs,
        "bars": [bar(e, ceiling.of(e, ceilings)) for e in shown],
    }


def data(machine: Machine, sources: list[str]) -> dict:
    """Everything the figure shows, from the records of `machine` (read from `sources`)."""
    panels = [p for w in WORKLOADS if (p := panel(w, machine)) is not None]
    return {
        "machine": machine.title,
        "preset": machine.preset,
        "sources": sorted(sources),
        "panels": panels,
    }


def encode(figure: dict) -> str:
    """The sidecar's text, and the PNG chunk's: stable key order, ASCII only."""
    return json.dumps(figure, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def png_text(path: Path) -> dict[str, str]:
    """The text chunks (tEXt, zTXt, iTXt) of a PNG file; empty for a file that is not one."""
    raw = Path(path).read_bytes()
    if not raw.startswith(b"\x89PNG\r\n\x1a\n"):
        return {}
    found, i = {}, 8
    while i + 8 <= len(raw):
        length, kind = struct.unpack(">I4s", raw[i : i + 8])
        body = raw[i + 8 : i + 8 + length]
        i += 12 + length  # length, type, data, CRC
        if kind in (b"tEXt", b"zTXt", b"iTXt") and b"\0" in body:
            key, rest = body.split(b"\0", 1)
            found[key.decode("latin-1")] = _chunk_text(kind, rest)
    return found


def _chunk_text(kind: bytes, rest: bytes) -> str:
    if kind == b"tEXt":
        return rest.decode("latin-1")
    if kind == b"zTXt":  # compression method byte, then zlib data
        return zlib.decompress(rest[1:]).decode("latin-1")
    compressed, rest = rest[0], rest[2:]  # iTXt: flag, method, language\0, keyword\0, text
    text = rest.split(b"\0", 2)[-1]
    return (zlib.decompress(text) if compressed else text).decode("utf-8")


def stale(figure: dict, png: Path, sidecar: Path) -> list[tuple[Path, str]]:
    """(file, why) for each committed file of the figure that does not show `figure`."""
    want = encode(figure)
    reasons = []
    if not sidecar.is_file():
        reasons.append((sidecar, "missing"))
    elif sidecar.read_text(encoding="utf-8") != want:
        reasons.append((sidecar, "the figure's data differs from the records"))
    if not png.is_file():
        reasons.append((png, "missing"))
    elif png_text(png).get(KEY) != want:
        reasons.append((png, "drawn from other data than the records give"))
    return reasons


def write(figure: dict, png: Path, sidecar: Path) -> None:
    """Draw the PNG with its data inside, then the sidecar next to it."""
    from compare import plots  # matplotlib only when a figure is drawn

    text = encode(figure)
    plots.comparison(png, figure, metadata={KEY: text})
    sidecar.parent.mkdir(parents=True, exist_ok=True)
    sidecar.write_text(text, encoding="utf-8")
