"""PNG plots with matplotlib's object-oriented API on the Agg canvas (no pyplot, no display).

Every function writes one file and returns its path, or None when there is nothing to draw.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from compare import pipeline_model
from compare.model_report import RowFit
from compare.scaling import fmt_bits
from compare.tables import DpRow, R50Row, decimals, device_counts

COLORS = {"torch": "#ee4c2c", "jax": "#4a7bd0", "mxnet": "#2ca02c"}
MARKERS = "osD^vP*X"


def _figure(width: float = 7.5, height: float = 4.5) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path, metadata: dict[str, str] | None = None) -> Path:
    """`metadata`: PNG text chunks (the README's figure keeps its data in one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata=metadata)
    return path


def _color(framework: str, i: int) -> str:
    return COLORS.get(framework.split("+")[0], f"C{i % 10}")


def sec_bars(
    path: Path, title: str, rows: list[DpRow], ceilings: dict[tuple[str, str], float] | None = None
) -> Path | None:
    """sec/epoch per row, one bar per device count, std as error bars; hatched: extrapolated.
    `ceilings` ((framework, label) -> the ceiling's sec/epoch) marks each 1-device bar with its
    framework's ceiling, so the gap between a loop and its ceiling shows beside the bars."""
    if not rows:
        return None
    counts = device_counts(rows)
    fig = _figure(max(7.5, 1.0 + 0.9 * len(rows)))  # room for every row's label
    ax = fig.add_subplot()
    width = 0.8 / len(counts)
    x = np.arange(len(rows))
    for j, n in enumerate(counts):
        cells = [(i, row.cells.get(n)) for i, row in enumerate(rows)]
        shown = [(i, e) for i, e in cells if e is not None and not e.diverged]
        bars = ax.bar(
            [x[i] + (j - (len(counts) - 1) / 2) * width for i, _ in shown],
            [e.median for _, e in shown],
            width,
            yerr=[e.std for _, e in shown],
            capsize=3,
            color=f"C{j}",
            edgecolor="black",
            linewidth=0.5,
            label=f"{n} device(s)",
        )
        for bar, (_, e) in zip(bars, shown, strict=True):
            if e.rec.extrapolated:
                bar.set_hatch("//")
        if n == 1 and ceilings:
            _ceiling_marks(ax, bars, [rows[i] for i, _ in shown], ceilings)
    # One line per part of the label ("ddp", "+bf16", "+compiled"): long labels do not collide.
    ax.set_xticks(x, [f"{r.framework}\n" + r.label.replace("+", "\n+") + _cores(r) for r in rows])
    ax.set_ylabel("sec/epoch (median, std)")
    extrapolated = any(e.rec.extrapolated for r in rows for e in r.cells.values())
    ax.set_title(title + ("\nhatched: extrapolated from fewer steps" if extrapolated else ""))
    ax.legend()
    return _save(fig, path)


def _ceiling_marks(ax, bars, rows: list[DpRow], ceilings: dict[tuple[str, str], float]) -> None:
    """A black bar-wide line at each 1-device bar's ceiling sec/epoch; one legend entry."""
    label = "ceiling (1 device)"
    for bar, row in zip(bars, rows, strict=True):
        ceiling = ceilings.get((row.framework, row.label))
        if ceiling is not None:
            left, right = bar.get_x(), bar.get_x() + bar.get_width()
            ax.hlines(ceiling, left, right, "black", linewidth=2.5, label=label, gid="ceiling")
            label = "_nolegend_"


def comparison(path: Path, figure: dict, metadata: dict[str, str] | None = None) -> Path | None:
    """The README's figure (compare/figure.py's data): a panel per workload, a horizontal bar
    per framework and path on one device (median sec/epoch, std as error bar; hatched:
    extrapolated), each with its ceiling marked and labelled with its time and x ceiling."""
    panels = figure["panels"]
    if not panels:
        return None
    heights = [len(p["bars"]) + 1.5 for p in panels]
    fig = _figure(8.5, 1.0 + 0.4 * sum(heights))
    axes = fig.subplots(len(panels), 1, height_ratios=heights, squeeze=False)[:, 0]
    for ax, p in zip(axes, panels, strict=True):
        _comparison_panel(ax, p)
    fig.suptitle(
        f"Seconds per epoch on one device, {figure['machine']}\n"
        "lower is faster; black line: the framework's own ceiling for the same step"
    )
    return _save(fig, path, metadata)


def _comparison_panel(ax, panel: dict) -> None:
    bars = panel["bars"]
    y = np.arange(len(bars))
    drawn = ax.barh(
        y,
        [b["sec_per_epoch"] for b in bars],
        0.6,
        xerr=[b["std"] for b in bars],
        capsize=3,
        ecolor="0.45",  # grey, so the black ceiling line stands out where the two meet
        color=[_color(b["framework"], i) for i, b in enumerate(bars)],
        edgecolor="black",
        linewidth=0.5,
    )
    right = max(max(b["sec_per_epoch"] + b["std"], b["ceiling_sec_per_epoch"] or 0) for b in bars)
    for rect, b in zip(drawn, bars, strict=True):
        if b["extrapolated"]:
            rect.set_hatch("//")
        top = b["ceiling_sec_per_epoch"]
        if top is not None:
            low, high = rect.get_y() - 0.12, rect.get_y() + rect.get_height() + 0.12
            ax.vlines(top, low, high, colors="black", linewidth=2.5, gid="ceiling")
        ax.text(
            max(b["sec_per_epoch"] + b["std"], top or 0) + 0.02 * right,
            rect.get_y() + rect.get_height() / 2,
            _bar_text(b),
            va="center",
            fontsize="small",
        )
    ax.set_yticks(y, [b["label"] for b in bars])
    ax.invert_yaxis()  # the tables' order, top to bottom
    ax.set_xlim(0, 1.4 * right)  # room for the labels past the longest bar
    epochs = "/".join(map(str, panel["epochs"]))
    ax.set_title(f"{panel['workload']}, {epochs} epochs", loc="left")
    ax.set_xlabel("seconds per epoch (median over the epochs; error bar: std)")


def _bar_text(b: dict) -> str:
    t = b["sec_per_epoch"]
    text = f"{t:.{decimals(t)}f} s" + ("*" if b["extrapolated"] else "")
    if b["x_ceiling"] is not None:
        text += f", {b['x_ceiling']:.2f}x ceiling"
    return text


def scaling(path: Path, title: str, rows: list[DpRow]) -> Path | None:
    """Speedup against the same row's 1-device time, with the ideal line: only the rows whose
    devices had hardware of their own and ran at once (DpRow.speedup is None for the others)."""
    lines = []
    for row in rows:
        points = [(n, row.speedup(n)[0]) for n in sorted(row.cells) if row.speedup(n)]
        if len(points) > 1:
            lines.append((row, points))
    if not lines:
        return None
    counts = device_counts(rows)
    fig = _figure(6, 4.5)
    ax = fig.add_subplot()
    ax.plot(counts, counts, "k--", linewidth=1, label="ideal")
    seen: dict[str, int] = {}
    for i, (row, points) in enumerate(lines):
        n, s = zip(*points, strict=True)
        k = seen[row.framework] = seen.get(row.framework, -1) + 1  # nth strategy of a framework
        ax.plot(
            n,
            s,
            marker=MARKERS[i % len(MARKERS)],
            linestyle=("-", "--", ":", "-.")[k % 4],
            color=_color(row.framework, i),
            label=f"{row.framework} {row.label}{_cores_label(row)}"
            + (" *" if row.extrapolated(*n) else ""),
        )
    ax.set_xticks(counts)
    ax.set_xlabel("devices")
    ax.set_ylabel("speedup vs 1 device")
    ax.set_title(title)
    ax.legend(fontsize="small")
    return _save(fig, path)


def _cores_label(row: DpRow) -> str:
    return "" if row.cores is None else f", {row.cores} core(s)/device"


def _cores(row: DpRow) -> str:
    """A tick label's last line: a row pinned to its own cores beside the same on shared ones."""
    return "" if row.cores is None else f"\n{row.cores} core(s)/dev"


def accuracy(path: Path, title: str, rows: list[DpRow]) -> Path | None:
    """Test accuracy after every epoch, one line per row and device count."""
    curves = [
        (row, n, e.rec.test_acc_per_epoch)
        for row in rows
        for n, e in sorted(row.cells.items())
        if e.rec.test_acc_per_epoch and not e.diverged
    ]
    if not curves:
        return None
    fig = _figure(9, 4.5)
    ax = fig.add_subplot()
    for i, (row, n, accs) in enumerate(curves):
        ax.plot(
            range(1, len(accs) + 1),
            accs,
            marker=MARKERS[i % len(MARKERS)],
            linestyle="-" if n == 1 else "--",
            color=_color(row.framework, i),
            label=f"{row.framework} {row.label}, {n} dev{_cores_label(row)}",
        )
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title(title)
    # Outside the axes: a dozen curves leave no corner of the plot free.
    fig.legend(loc="outside right upper", fontsize="small")
    return _save(fig, path)


def nodes(path: Path, title: str, lines) -> Path | None:
    """Seconds per step against the link's rate (bit/s, log scale; a link without a rate at the
    throughput measured over it), one line per engine and node count, its model dashed and its
    1-node step dotted (compare/scaling_report.py's Line)."""
    if not lines:
        return None
    fig = _figure(7.5, 4.5)
    ax = fig.add_subplot()
    for i, line in enumerate(lines):
        color = _color(line.framework, i)
        x, y = zip(*line.measured, strict=True)
        ax.plot(x, y, marker=MARKERS[i % len(MARKERS)], color=color, label=line.label)
        if line.model:
            mx, my = zip(*line.model, strict=True)
            label = f"{line.label}: {line.model_name} model"
            ax.plot(mx, my, "--", marker="x", color=color, label=label)
        if line.compute is not None:
            ax.axhline(line.compute, color=color, linestyle=":", linewidth=1)
    # the rates themselves as ticks: a log axis's own labels are mathtext, drawn here as written
    rates = sorted({x for line in lines for x, _ in line.measured})
    ax.set_xscale("log")
    ax.set_xticks(rates, [fmt_bits(x) for x in rates])
    ax.minorticks_off()
    ax.set_xlabel("link rate (log scale; unlimited: its measured throughput)")
    ax.set_ylabel("seconds per step")
    ax.set_title(title + "\ndotted: the engine's 1-node step")
    ax.legend(fontsize="small")
    return _save(fig, path)


R50_BARS = ("single", "model_parallel", "pipeline", "best split", "gpipe", "1f1b")


def r50_bars(path: Path, title: str, rows: list[R50Row]) -> Path | None:
    """Seconds per timed repeat of every resnet50 strategy, per framework."""
    if not rows:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    width = 0.8 / len(R50_BARS)
    for j, name in enumerate(R50_BARS):
        xs, ys, errs = [], [], []
        for i, row in enumerate(rows):
            e = row.best() if name == "best split" else row.runs.get(name)
            if e is not None and not e.diverged:
                xs.append(i + (j - (len(R50_BARS) - 1) / 2) * width)
                ys.append(e.median)
                errs.append(e.std)
        if xs:
            ax.bar(xs, ys, width, yerr=errs, capsize=3, color=f"C{j}", label=name)
    ax.set_xticks(np.arange(len(rows)), [r.framework for r in rows])
    ax.set_ylabel("seconds per timed repeat (median, std)")
    ax.set_title(title)
    ax.legend(fontsize="small")
    return _save(fig, path)


def sweep(path: Path, title: str, rows: list[R50Row]) -> Path | None:
    """The split_size tradeoff: time against micro-batch size, one line per framework."""
    rows = [r for r in rows if r.sweep]
    if not rows:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    for i, row in enumerate(rows):
        splits = sorted(row.sweep)
        es = [row.sweep[s] for s in splits]
        ax.errorbar(
            splits,
            [e.median for e in es],
            yerr=[e.std for e in es],
            marker=MARKERS[i % len(MARKERS)],
            capsize=3,
            color=_color(row.framework, i),
            label=row.framework + (" (stages share one device)" if any_shared(es) else ""),
        )
        single = row.runs.get("single")
        if single is not None and not single.diverged:
            ax.axhline(single.median, color=_color(row.framework, i), linestyle=":", linewidth=1)
    _split_axis(ax, sorted({s for row in rows for s in row.sweep}))
    ax.set_xlabel("split_size (micro-batch size; log scale)")
    ax.set_ylabel("seconds per timed repeat")
    ax.set_title(title + "\ndotted: single device")
    ax.legend()
    return _save(fig, path)


def model_plot(path: Path, title: str, fits: list[RowFit], stages=(4, 8)) -> Path | None:
    """Left: the measured sweep, and the model the data supports where one fits. Right (when a
    pipelined model is used): that model projected to more stages."""
    if not fits:
        return None
    pipelined = [f for f in fits if f.selection.chosen == pipeline_model.PIPELINED]
    fig = _figure(11 if pipelined else 6.5, 4.5)
    axes = fig.subplots(1, 2) if pipelined else [fig.subplots(1, 1)]
    left = axes[0]
    for i, f in enumerate(fits):
        color = _color(f.row.framework, i)
        splits = sorted(f.measured)
        model = f.selection.model
        label = f"{f.row.framework} measured" + ("" if model else " (no model fits)")
        left.plot(splits, [f.measured[s] for s in splits], "o", color=color, label=label)
        if model is not None:
            dense = dense_splits(model.batch_size)
            left.plot(
                dense,
                [model.predict(s) for s in dense],
                "-",
                color=color,
                label=f"{f.row.framework} {model.kind} model",
            )
    left.set_title("measured sweep and the model it supports")
    if pipelined:
        _projection_axis(axes[1], pipelined, stages)
    for ax in axes:
        _split_axis(ax, sorted({s for f in fits for s in f.measured}))
        ax.set_xlabel("split_size (log scale)")
        ax.set_ylabel("seconds per timed repeat")
        ax.legend(fontsize="small")
    fig.suptitle(title)
    return _save(fig, path)


def _projection_axis(ax, fits: list[RowFit], stages) -> None:
    for i, f in enumerate(fits):
        model, color = f.selection.model, _color(f.row.framework, i)
        dense = dense_splits(model.batch_size)
        ax.plot(
            dense,
            [model.predict(s) for s in dense],
            "-",
            color=color,
            label=f"{f.row.framework} {model.stages} stages (model)",
        )
        for k, p in enumerate(stages):
            ax.plot(
                dense,
                [model.predict(s, p) for s in dense],
                linestyle=("--", ":", "-.")[k % 3],
                color=color,
                label=f"{f.row.framework} {p} stages (PROJECTION)",
            )
    ax.set_title("projection to more stages (not measured)")


def any_shared(entries) -> bool:
    return any(e.shares_device for e in entries)


def _split_axis(ax, splits) -> None:
    """A log axis labelled with the split sizes themselves."""
    ax.set_xscale("log")
    ax.set_xticks(splits, [str(s) for s in splits])
    ax.minorticks_off()


def dense_splits(batch_size: int) -> list[int]:
    """Every split size that gives a different number of micro-batches."""
    seen, out = set(), []
    for s in range(1, batch_size + 1):
        m = pipeline_model.micro_batches(batch_size, s)
        if m not in seen:
            seen.add(m)
            out.append(s)
    return out
