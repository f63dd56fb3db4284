"""What a lesson's runs learnt, for its page (tools/docs_hook.py's `WORKLOAD:accuracy`): test
accuracy on 1 and 2 devices, a column per records file, and the curves of every epoch, a PNG
drawn into the site being built beside its page, with their numbers in a fold."""

from __future__ import annotations

import html
import textwrap
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from common import results
from compare import plots, records
from compare.records import Entry
from compare.render import literal_plot_text

if __package__ == "tools":  # as tools/docs_hook.py imports it (mkdocs: its folder on sys.path)
    from tools.docs_records import accuracy, drawn, text
else:
    from docs_records import accuracy, drawn, text

CURVES = (6.4, 2.8)  # inches at 100 px each: beside the table, as tall as a few rows
TITLE = 24  # characters: a panel's title is as wide as its panel
# The table and the curves side by side where the page is wide enough, else one under the other.
ROW_STYLE = "display:flex;flex-wrap:wrap;align-items:center;gap:0 1rem"
TABLE_STYLE = "flex:1 1 20rem;min-width:0"  # its headers wrap, to leave the curves room
FIGURE_STYLE = f"flex:1 1 24rem;min-width:0;max-width:{CURVES[0] * 100}px;margin:0"


def learning(paths: list[str], workload: str, page, config) -> str:
    """What `workload`'s runs learnt: each run's test accuracy on 1 and 2 devices, a column per
    records file (a machine, preset and length of training each), drawn by the table's rule; the
    accuracy after every epoch as curves, a panel per file (a PNG written beside the page in the
    site being built), and their numbers in a fold."""
    files = [(path, _trained(path, workload)) for path in paths]
    keys = sorted({k for _, runs in files for k in runs}, key=lambda k: records.rank(workload, *k))
    machines = [_machine(runs) for _, runs in files]
    head = ["test accuracy, 1 / 2 devices", *("<br>".join(map(text, m)) for m in machines)]
    rows = [[text(f"{fw} {label}")] for fw, label in keys]
    for row, key in zip(rows, keys, strict=True):
        row += [_cell(runs.get(key)) for _, runs in files]
    table = [head, ["---"] * len(head), *rows]
    note = "Each run's accuracy after its last epoch; –: no such run in the file. " + "; ".join(
        _sources(path, runs) for path, runs in files
    )
    page_name = Path(page.file.dest_uri).stem  # a page may draw another workload's, or two
    name = f"{page_name}{'' if page_name == workload else '-' + workload}-accuracy.png"
    png = Path(config.site_dir, page.file.dest_uri).with_name(name)
    alt = _curves(png, files, keys)
    img = f'<img src="{png.name}" alt="{html.escape(alt)}" style="width:100%">'
    img = f'<figure style="{FIGURE_STYLE}">{img}</figure>'
    lines = ["| " + " | ".join(cells) + " |" for cells in table]
    lines = [f'<div markdown style="{TABLE_STYLE}">', "", *lines, "", "</div>", "", img]
    lines = [f'<div markdown style="{ROW_STYLE}">', "", *lines, "", "</div>", "", note]
    numbers = textwrap.indent(_numbers(files, keys), "    ")
    fold = f'??? note "The curves\' numbers: test accuracy after each epoch"\n\n{numbers}'
    return "\n".join(['<div class="results" markdown>', "", *lines, "", "</div>", "", fold])


def _trained(path: str, workload: str) -> dict[tuple, tuple[Entry | None, Entry | None]]:
    """{(framework, label): (its run on 1 device, on 2)} of `path`'s runs that were tested every
    epoch: plain runs (float32, eager, not a sweep's), on a CPU those with a core per device
    (as the speed table's), the fewest cores per device where there are several; a 2-device run
    beside the 1-device run of its strategy."""
    runs = [e for e in drawn(path, workload) if e.rec.test_acc_per_epoch and e.rec.devices <= 2]
    runs = [e for e in runs if not e.tier and not e.sweep]
    runs = [e for e in runs if e.cores_per_device or e.rec.platform != "cpu"]
    runs.sort(key=lambda e: -(e.cores_per_device or 0))  # the last of a key is kept
    one = {(e.rec.framework, e.rec.strategy): e for e in runs if e.rec.devices == 1}
    two = {(e.rec.framework, e.label): e for e in runs if e.rec.devices == 2}
    bases = {k: one.get((e.rec.framework, e.rec.strategy)) for k, e in two.items()}
    alone = {k: e for k, e in one.items() if e not in bases.values()}
    trained = {k: (e, None) for k, e in alone.items()} | {k: (bases[k], e) for k, e in two.items()}
    if not trained:
        raise LookupError(f"{path} has no {workload} runs on 1 or 2 devices tested every epoch")
    return trained


def _cell(pair: tuple | None) -> str:
    """`0.912 / –`: a row's accuracy on 1 / 2 devices; `–`: no such run."""
    return " / ".join(accuracy(e and e.rec.test_acc) for e in pair) if pair else "–"


def _machine(runs: dict) -> tuple[str, str]:
    """(`NVIDIA H100 80GB HBM3` or `Intel Xeon, 2 cores`, `preset full, 10 epochs`): where and
    how long the file's runs trained."""
    shown = [e for pair in runs.values() for e in pair if e]
    first, epochs = shown[0], sorted({e.rec.epochs for e in shown})
    hardware = first.machine[3]  # compare/records.hardware_key
    if hardware[0] == "gpu":
        where = ", ".join(dict.fromkeys(hardware[1])) or "unknown GPU"
    else:
        where = hardware[1] + (f", {hardware[2]} cores" if hardware[2] else "")
    return where, f"preset {first.rec.preset}, {', '.join(map(str, epochs))} epochs"


def _sources(path: str, runs: dict) -> str:
    """`path`: the versions and commits of its runs shown."""
    shown = [e for pair in runs.values() for e in pair if e]
    versions = dict.fromkeys(
        f"{e.rec.framework} {e.rec.versions.get(e.rec.framework)}" for e in shown
    )
    commits = dict.fromkeys(results.short_commit(e.rec.git_commit) for e in shown)
    return f"`{path}`: " + text(f"{', '.join(versions)}; commit {', '.join(commits)}")


def _curves(png: Path, files: list, keys: list[tuple]) -> str:
    """Each run's test accuracy after every epoch, a panel per file, written to `png` (the same
    records, the same bytes); the picture's alternative text."""
    fig = Figure(figsize=CURVES, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(files), sharey=True, squeeze=False)[0]
    said = []
    with literal_plot_text():
        for ax, (_, runs) in zip(axes, files, strict=True):
            where, training = _machine(runs)
            ax.set(title=textwrap.fill(where, TITLE) + "\n" + training, xlabel="epoch")
            ax.title.set_fontsize("small")
            ax.xaxis.get_major_locator().set_params(integer=True)
            for i, key in enumerate(keys):
                for n, e in enumerate(runs.get(key) or (), start=1):
                    said += [_line(ax, i, n, e)] if e else []
        axes[0].set_ylabel("test accuracy")
        handles = {h.get_label(): h for ax in axes for h in ax.get_lines()}
        fig.legend(
            handles.values(), handles.keys(), loc="outside lower center", ncols=3, fontsize="small"
        )
        png.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(png, dpi=100, metadata={"Software": None})
    return "Test accuracy after each epoch, a panel per machine: " + "; ".join(said) + "."


def _line(ax, i: int, n: int, e: Entry) -> str:
    """Run `e`'s curve on `ax` (the `i`th row, on `n` devices: solid 1, dashed 2); said."""
    accs, fw = e.rec.test_acc_per_epoch, e.rec.framework
    label = f"{fw} {e.label}, {n} device{'s' if n > 1 else ''}"
    color = plots.COLORS.get(fw, f"C{i % 10}")
    marker = plots.MARKERS[i % len(plots.MARKERS)]
    ax.plot(
        range(1, len(accs) + 1),
        accs,
        color=color,
        marker=marker,
        ls="-" if n == 1 else "--",
        label=label,
    )
    return f"{label}, {accs[0]:.3f} to {accs[-1]:.3f} over {len(accs)} epochs"


def _numbers(files: list, keys: list[tuple]) -> str:
    """The curves' numbers: a table per file, a row per run and device count."""
    parts = []
    for path, runs in files:
        shown = [(k, n, e) for k in keys for n, e in enumerate(runs.get(k) or (), 1) if e]
        epochs = max(len(e.rec.test_acc_per_epoch) for *_, e in shown)
        head = ["run", "devices", *map(str, range(1, epochs + 1))]
        rows = [
            [text(f"{fw} {label}"), str(n), *(f"{a:.3f}" for a in e.rec.test_acc_per_epoch)]
            for (fw, label), n, e in shown
        ]
        rows = [row + [""] * (len(head) - len(row)) for row in rows]
        table = [head, ["---"] * len(head), *rows]
        parts += [text(", ".join(_machine(runs))) + f" (`{path}`):", ""]
        parts += ["| " + " | ".join(cells) + " |" for cells in table] + [""]
    return "\n".join(['<div class="results" markdown>', "", *parts, "</div>"])
