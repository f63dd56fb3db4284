"""The README's figure (`make readme-tables` draws it): seconds per epoch of every framework and
path on one device of one machine group, each bar with its ceiling marked. What it shows is kept
as data twice, in a sidecar JSON and in a text chunk of the PNG: `python -m compare.readme
--check` compares both with the records, never the pixels (they differ between matplotlib
versions)."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from compare import tables
from compare.records import Entry, Machine

WORKLOADS = ("resnet18", "lenet")  # the panels, top to bottom
KEY = "comparison-data"  # the PNG text chunk that holds the data


def rounded(x: float | None) -> float | None:
    """4 significant digits: more than a bar or its label can show."""
    return None if x is None else float(f"{x:.4g}")


def bar(e: Entry, c: Entry | None) -> dict:
    """One 1-device training record and its ceiling (None without one)."""
    measured = None if c is None else "in the run" if c.extra.get(tables.SAME_RUN) else "apart"
    return {
        "label": f"{e.rec.framework} {e.label}",
        "framework": e.rec.framework,
        "sec_per_epoch": rounded(e.median),
        "std": rounded(e.std),
        "n": e.stats.get("n"),
        "extrapolated": bool(e.rec.extrapolated),
        "ceiling_sec_per_epoch": None if c is None else rounded(c.median),
        "x_ceiling": None if c is None else rounded(tables.ceiling_ratio(e, c)),
        "ceiling_measured": measured,
    }


def data(machine: Machine, sources: list[str]) -> dict:
    """Everything the figure shows: a panel per workload with a 1-device record, its bars in
    the tables' order."""
    panels = []
    for workload in WORKLOADS:
        ceilings = [c for c in machine.ceilings if c.rec.workload == workload]
        rows = tables.dp_rows(machine.workload(workload))
        shown = [row.cells[1] for row in rows if 1 in row.cells and not row.cells[1].diverged]
        if shown:
            epochs = sorted({e.rec.epochs for e in shown if e.rec.epochs})
            bars = [bar(e, tables.ceiling_of(e, ceilings)) for e in shown]
            panels.append({"workload": workload, "epochs": epochs, "bars": bars})
    what = {"machine": machine.title, "preset": machine.preset, "sources": sorted(sources)}
    return what | {"panels": panels}


def encode(figure: dict) -> str:
    """The sidecar's text, and the PNG chunk's: stable key order, ASCII only."""
    return json.dumps(figure, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def png_text(path: Path) -> dict[str, str]:
    """The text chunks (tEXt, zTXt, iTXt) of a PNG file; empty for a file that is not one."""
    try:
        with Image.open(path) as image:
            return dict(getattr(image, "text", {}))
    except (OSError, UnidentifiedImageError, SyntaxError):
        return {}


def stale(figure: dict, png: Path, sidecar: Path) -> list[tuple[Path, str]]:
    """(file, why) for each committed file of the figure that does not show `figure`."""
    want, reasons = encode(figure), []
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
