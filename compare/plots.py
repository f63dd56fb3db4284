"""PNG plots with matplotlib's object-oriented API on the Agg canvas, grouped bars by pandas. Each
function writes one file and returns its path, or None when there is nothing to draw."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.container import BarContainer
from matplotlib.figure import Figure

from compare.resnet50 import STRATEGIES, R50Row
from compare.scaling_report import fmt_bits
from compare.tables import DpRow, decimals, device_counts

COLORS = {"torch": "#ee4c2c", "jax": "#4a7bd0", "mxnet": "#2ca02c"}
MARKERS = "osD^vP*X"


def _axes(width: float = 7.5, height: float = 4.5, panels: int = 0, **kw):
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, (fig.subplots(panels, **kw) if panels else fig.add_subplot())


def _save(fig: Figure, path: Path, metadata: dict[str, str] | None = None) -> Path:
    """`metadata`: PNG text chunks (compare/figure.py keeps its data in one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata=metadata)
    return path


def _color(framework: str, i: int) -> str:
    return COLORS.get(framework.split("+")[0], f"C{i % 10}")


def _bars(ax, cells: list[list], columns: list[str], labels: list[str]) -> list[BarContainer]:
    """A group per label, a bar per column (median, std as error bar) of each record in `cells`
    (None: no bar); the bars of each column, in order."""

    def frame(value):
        values = [[np.nan if e is None else value(e) for e in line] for line in cells]
        return pd.DataFrame(values, index=labels, columns=columns)

    frame(lambda e: e.median).plot.bar(
        ax=ax, yerr=frame(lambda e: e.std), capsize=3, rot=0, width=0.8, edgecolor="black", lw=0.5
    )
    return [c for c in ax.containers if isinstance(c, BarContainer)]


def sec_bars(
    path: Path, title: str, rows: list[DpRow], ceilings: dict | None = None
) -> Path | None:
    """sec/epoch per row, a bar per device count, hatched: extrapolated; each 1-device bar with
    its ceiling marked (`ceilings`: (framework, label) -> the ceiling's sec/epoch)."""
    if not rows:
        return None
    counts = device_counts(rows)
    cells = [[e if e and not e.diverged else None for e in map(r.cells.get, counts)] for r in rows]
    fig, ax = _axes(max(7.5, 1.0 + 0.9 * len(rows)))  # room for every row's label
    # One line per part of the label ("ddp", "+bf16", "+compiled"): long labels do not collide.
    labels = [f"{r.framework}\n" + r.label.replace("+", "\n+") + _cores(r, "\n") for r in rows]
    columns = [f"{n} device(s)" for n in counts]
    for j, bars in enumerate(_bars(ax, cells, columns, labels)):
        for bar, line in zip(bars, cells, strict=True):
            bar.set_hatch("//" if line[j] and line[j].rec.extrapolated else None)
        if counts[j] == 1 and ceilings:
            _ceiling_marks(ax, bars, rows, ceilings)
    ax.set_ylabel("sec/epoch (median, std)")
    extrapolated = any(e.rec.extrapolated for r in rows for e in r.cells.values())
    ax.set_title(title + ("\nhatched: extrapolated from fewer steps" if extrapolated else ""))
    ax.legend()
    return _save(fig, path)


def _ceiling_marks(ax, bars, rows: list[DpRow], ceilings: dict) -> None:
    """A black bar-wide line at each 1-device bar's ceiling; one legend entry."""
    label = "ceiling (1 device)"
    for bar, row in zip(bars, rows, strict=True):
        ceiling = ceilings.get((row.framework, row.label))
        if ceiling is not None and 1 in row.cells and not row.cells[1].diverged:
            left, right = bar.get_x(), bar.get_x() + bar.get_width()
            ax.hlines(ceiling, left, right, "black", linewidth=2.5, label=label, gid="ceiling")
            label = "_nolegend_"


def comparison(path: Path, figure: dict, metadata: dict[str, str] | None = None) -> Path | None:
    """The README's figure (compare/figure.py): a panel per workload, a bar per framework and
    path on one device (hatched: extrapolated), its ceiling marked, its time and x ceiling."""
    panels = figure["panels"]
    if not panels:
        return None
    heights = [len(p["bars"]) + 1.5 for p in panels]
    fig, axes = _axes(8.5, 1.0 + 0.4 * sum(heights), len(panels), height_ratios=heights)
    for ax, p in zip(np.atleast_1d(axes), panels, strict=True):
        _comparison_panel(ax, p)
    fig.suptitle(
        f"Seconds per epoch on one device, {figure['machine']}\n"
        "lower is faster; black line: the framework's own ceiling for the same step"
    )
    return _save(fig, path, metadata)


def _comparison_panel(ax, panel: dict) -> None:
    bars = panel["bars"]
    y = np.arange(len(bars))
    # grey error bars, so the black ceiling line stands out where the two meet
    style = {"capsize": 3, "ecolor": "0.45", "edgecolor": "black", "linewidth": 0.5}
    colors = [_color(b["framework"], i) for i, b in enumerate(bars)]
    times, stds = [b["sec_per_epoch"] for b in bars], [b["std"] for b in bars]
    drawn = ax.barh(y, times, 0.6, xerr=stds, color=colors, **style)
    right = max(max(b["sec_per_epoch"] + b["std"], b["ceiling_sec_per_epoch"] or 0) for b in bars)
    for rect, b in zip(drawn, bars, strict=True):
        top, t = b["ceiling_sec_per_epoch"], b["sec_per_epoch"]
        rect.set_hatch("//" if b["extrapolated"] else None)
        if top is not None:
            low, high = rect.get_y() - 0.12, rect.get_y() + rect.get_height() + 0.12
            ax.vlines(top, low, high, colors="black", linewidth=2.5, gid="ceiling")
        text = f"{t:.{decimals(t)}f} s" + ("*" if b["extrapolated"] else "")
        text += "" if b["x_ceiling"] is None else f", {b['x_ceiling']:.2f}x ceiling"
        x = max(t + b["std"], top or 0) + 0.02 * right
        ax.text(x, rect.get_y() + rect.get_height() / 2, text, va="center", fontsize="small")
    ax.set_yticks(y, [b["label"] for b in bars])
    ax.invert_yaxis()  # the tables' order, top to bottom
    ax.set_xlim(0, 1.4 * right)  # room for the labels past the longest bar
    ax.set_title(f"{panel['workload']}, {'/'.join(map(str, panel['epochs']))} epochs", loc="left")
    ax.set_xlabel("seconds per epoch (median over the epochs; error bar: std)")


def _line(ax, i: int, framework: str, x, y, label: str, **kw) -> None:
    ax.plot(x, y, marker=MARKERS[i % len(MARKERS)], color=_color(framework, i), label=label, **kw)


def scaling(path: Path, title: str, rows: list[DpRow]) -> Path | None:
    """Speedup against the same row's 1-device time, with the ideal line: rows of like runs."""
    lines = [(r, [(n, r.speedup(n)[0]) for n in sorted(r.cells) if r.speedup(n)]) for r in rows]
    lines = [(row, points) for row, points in lines if len(points) > 1]
    if not lines:
        return None
    counts = device_counts(rows)
    fig, ax = _axes(6, 4.5)
    ax.plot(counts, counts, "k--", linewidth=1, label="ideal")
    seen: dict[str, int] = {}
    for i, (row, points) in enumerate(lines):
        n, s = zip(*points, strict=True)
        k = seen[row.framework] = seen.get(row.framework, -1) + 1  # nth strategy of a framework
        label = f"{row.framework} {row.label}{_cores(row)}" + (" *" if row.extrapolated(*n) else "")
        _line(ax, i, row.framework, n, s, label, linestyle=("-", "--", ":", "-.")[k % 4])
    ax.set_xticks(counts)
    ax.set(xlabel="devices", ylabel="speedup vs 1 device", title=title)
    ax.legend(fontsize="small")
    return _save(fig, path)


def _cores(row: DpRow, before: str = ", ") -> str:
    per = "core(s)/dev" if before == "\n" else "core(s)/device"
    return "" if row.cores is None else f"{before}{row.cores} {per}"


def accuracy(path: Path, title: str, rows: list[DpRow]) -> Path | None:
    """Test accuracy after every epoch, a line per row and device count."""
    curves = [
        (row, n, e.rec.test_acc_per_epoch)
        for row in rows
        for n, e in sorted(row.cells.items())
        if e.rec.test_acc_per_epoch and not e.diverged
    ]
    if not curves:
        return None
    fig, ax = _axes(9, 4.5)
    for i, (row, n, accs) in enumerate(curves):
        label = f"{row.framework} {row.label}, {n} dev{_cores(row)}"
        _line(
            ax, i, row.framework, range(1, len(accs) + 1), accs, label, ls="-" if n == 1 else "--"
        )
    ax.set(xlabel="epoch", ylabel="test accuracy", title=title)
    ax.xaxis.get_major_locator().set_params(integer=True)
    # Outside the axes: a dozen curves leave no corner of the plot free.
    fig.legend(loc="outside right upper", fontsize="small")
    return _save(fig, path)


def nodes(path: Path, title: str, lines) -> Path | None:
    """Seconds per step against the link's rate (scaling_report.Line), a line per engine and
    node count, its model dashed and its 1-node step dotted."""
    if not lines:
        return None
    fig, ax = _axes()
    for i, line in enumerate(lines):
        color = _color(line.framework, i)
        _line(ax, i, line.framework, *zip(*line.measured, strict=True), line.label)
        if line.model:
            label = f"{line.label}: model"
            ax.plot(*zip(*line.model, strict=True), "--", marker="x", color=color, label=label)
        if line.compute is not None:
            ax.axhline(line.compute, color=color, linestyle=":", linewidth=1)
    _log_axis(ax, sorted({x for line in lines for x, _ in line.measured}), fmt_bits)
    ax.set(xlabel="link rate (log scale; unlimited: its measured throughput)")
    ax.set(ylabel="seconds per step", title=title + "\ndotted: the engine's 1-node step")
    ax.legend(fontsize="small")
    return _save(fig, path)


def r50_bars(path: Path, title: str, rows: list[R50Row]) -> Path | None:
    """Seconds per timed repeat of every resnet50 strategy and framework."""
    if not rows:
        return None
    fig, ax = _axes()
    cells = [[e if e and not e.diverged else None for e in map(r.get, STRATEGIES)] for r in rows]
    _bars(ax, cells, list(STRATEGIES), [r.framework for r in rows])
    ax.set(ylabel="seconds per timed repeat (median, std)", title=title)
    ax.legend(fontsize="small")
    return _save(fig, path)


def sweep(path: Path, title: str, rows: list[R50Row]) -> Path | None:
    """The split_size tradeoff: time against micro-batch size, a line per framework."""
    rows = [r for r in rows if r.sweep]
    if not rows:
        return None
    fig, ax = _axes()
    for i, row in enumerate(rows):
        es = [row.sweep[s] for s in sorted(row.sweep)]
        shared = " (stages share one device)" if any(e.shares_device for e in es) else ""
        medians, stds = [e.median for e in es], [e.std for e in es]
        marker, color = MARKERS[i % len(MARKERS)], _color(row.framework, i)
        kw = {"marker": marker, "capsize": 3, "color": color, "label": row.framework + shared}
        ax.errorbar(sorted(row.sweep), medians, yerr=stds, **kw)
        single = row.runs.get("single")
        if single is not None and not single.diverged:
            ax.axhline(single.median, color=color, linestyle=":", linewidth=1)
    _log_axis(ax, sorted({s for row in rows for s in row.sweep}))
    ax.set(xlabel="split_size (micro-batch size; log scale)", ylabel="seconds per timed repeat")
    ax.set_title(title + "\ndotted: single device")
    ax.legend()
    return _save(fig, path)


def _log_axis(ax, ticks, label=str) -> None:
    """A log axis labelled with the values themselves: its own labels are mathtext, drawn here
    as written."""
    ax.set_xscale("log")
    ax.set_xticks(ticks, [label(x) for x in ticks])
    ax.minorticks_off()
