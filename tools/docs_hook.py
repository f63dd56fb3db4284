"""The site's mkdocs hook (mkdocs.yml): what a page shows of the project is read from it as the
site is built. A line of a page, indented as the block it sits in, is replaced:

    --8<-- "torch_impl/resnet18.py:ddp"        `ddp`'s source (ast), less its docstring
    --8<-- "jax_impl/lenet.py:_split,split_batch"   several names; `Class.method`
    --8<-- "results/cpu-xeon-avx512-2core.jsonl:resnet18[:ddp,...]"   its runs on 1 against 2
                                               devices, a core per device, as a table
    --8<-- "results/gpu-h100.jsonl,results/gpu-h200.jsonl:resnet18:accuracy"   what its runs
                                               learnt: test accuracy on 1 and 2 devices, a
                                               column per file, and the curves of every epoch
    --8<-- "results/cpu-xeon-avx512-2core-bubble.jsonl:resnet50:bubble"   the pipeline's
                                               bubble: each stage's busy share beside the schedule's
    --8<-- "docs/some-file.md"                 a Markdown file of the repository, whole

A table draws its records by the report's rule (compare/records.py): every record checked as
the report checks it, clean commits only (a `-dirty` one names no code anyone can check out),
the newest record of each cell, options in the run's label (`ddp+sync-bn`), and each run's
median time. What a record carries is text, escaped as the report escapes it: no tag, link or
entity of a record reaches the page. An accuracy at chance (a run too short to learn) is left out
or labelled so. The curves are a PNG drawn into the site being built, beside its page.

A file or name that is not there, a bad records line or a record the report would leave out is
an error, named by its file (and line): the build fails (mkdocs.yml is strict, and an error is
counted even under --quiet). Each link, written relative to its own file, is pointed at the
site's page or file for its target, else at the file in the checkout the site is built in.
"""

from __future__ import annotations

import ast
import html
import json
import logging
import os
import re
import textwrap
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from common import collectives, results
from compare import checks, plots, records, resnet50
from compare.readme import dirty
from compare.records import Entry
from compare.render import escape, literal_plot_text
from compare.scaling_report import fmt_bytes

ROOT = Path(__file__).resolve().parent.parent
DIRECTIVE = re.compile(r'^(?P<indent>[ \t]*)--8<-- "(?P<path>[^":]+)(?::(?P<names>[^"]+))?"$', re.M)
LINE = re.compile(r'<span id="__span-[\d-]+"(?=>( *))')  # a code line (pymdownx.highlight)
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s:#]+)(?P<anchor>#[^)\s]*)?\)")
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# "concurrent" records a framework that may run its devices at once (a thread per device),
# not that they overlapped: MXNet's contexts take turns all the same (docs/results.md).
RAN = {"processes": "a process each", "concurrent": "one process, a thread per device"}
RAN["sequential"] = "one process, in turn"  # a torch process computes on its devices in turn
# Fashion-MNIST's ten classes: a guess is right one time in ten. A run under twice that has
# learnt next to nothing (a few steps of a preset made for speed).
GUESS = 0.1
CHANCE = " Test accuracy left out: every run's is at chance, under twice a guess's."
CURVES = (6.4, 2.8)  # inches at 100 px each: beside the table, as tall as a few rows
TITLE = 24  # characters: a panel's title is as wide as its panel
# The table and the curves side by side where the page is wide enough, else one under the other.
ROW_STYLE = "display:flex;flex-wrap:wrap;align-items:center;gap:0 1rem"
TABLE_STYLE = "flex:1 1 20rem;min-width:0"  # its headers wrap, to leave the curves room
FIGURE_STYLE = f"flex:1 1 24rem;min-width:0;max-width:{CURVES[0] * 100}px;margin:0"

log = logging.getLogger("mkdocs.hooks.lessons")


def on_page_markdown(markdown, page, config, files):
    # The page's own links first: the code it takes in is not Markdown.
    markdown = _relink(markdown, Path(config.docs_dir, page.file.src_uri), page, config)
    return DIRECTIVE.sub(lambda m: _expand(m, page, config), markdown)


def on_page_content(html, page, config, files):
    """Each code line marked with its indentation, from which a wrapped line hangs (lessons.css)."""
    return LINE.sub(lambda m: f'{m[0]} style="--i:{len(m[1])}"', html)


def _expand(match, page, config) -> str:
    path, names = match["path"], match["names"] or ""
    try:
        if path == "common/collectives.py" and names.startswith("moves:"):
            text = _moves_table(names.removeprefix("moves:"))
        elif path.endswith(".py"):
            text = _code(path, names.split(","))
        elif path.endswith(".jsonl") and names.endswith(":accuracy"):
            text = _learning(path.split(","), names.removesuffix(":accuracy"), page, config)
        elif path.endswith(".jsonl") and names == "resnet50:bubble":
            text = _bubble(path)
        elif path.endswith(".jsonl"):
            text = _scaling_table(path, *names.split(":"))
        else:
            text = _relink(_read(path), path, page, config)
    except (OSError, SyntaxError, LookupError, results.ResultsError) as e:
        # An error, not a warning: --quiet drops warnings before --strict counts them.
        page_path = os.path.relpath(Path(config.docs_dir, page.file.src_uri), ROOT)
        reason = _reason(path, e)
        log.error("%s: %s; fix the page's --8<-- line or what it names", page_path, reason)
        text = f'!!! failure "Not found"\n    {_text(reason)}'
    return textwrap.indent(text, match["indent"], lambda line: line.strip())


def _reason(path: str, e: Exception) -> str:
    if isinstance(e, OSError):
        return f"cannot read {path} ({e.strerror or e})"
    if isinstance(e, SyntaxError):
        return f"{path}:{e.lineno}: {e.msg}"
    return str(e)


def _read(path: str) -> str:
    try:
        return (ROOT / path).read_text()
    except UnicodeDecodeError:
        raise LookupError(f"{path} is not UTF-8 text") from None


def _code(path: str, names: list[str]) -> str:
    """The named definitions of `path` as one fenced block, titled with the file."""
    text = _read(path)
    tree, lines = ast.parse(text), text.splitlines()
    parts = [_source(lines, _find(tree, name, path)) for name in names]
    return "\n".join([f'```python title="{path}"', "\n\n".join(parts), "```"])


def _find(tree: ast.Module, dotted: str, path: str) -> ast.AST:
    node = tree
    for name in dotted.split("."):
        body = [n for n in getattr(node, "body", []) if isinstance(n, DEFINITIONS)]
        node = next((n for n in body if n.name == name), None)
        if node is None:
            raise LookupError(f"{path} defines no {dotted}")
    return node


def _source(lines: list[str], node) -> str:
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    doc = node.body[0]
    skip = range(doc.lineno, doc.end_lineno + 1) if ast.get_docstring(node) else ()
    kept = [lines[i - 1] for i in range(first, node.end_lineno + 1) if i not in skip]
    return textwrap.dedent("\n".join(kept))


def _moves_table(workload: str) -> str:
    """What each engine of `workload`'s lesson moves between devices in a step, a row per kind of
    collective (common.collectives.moves, which each framework's suite holds to its engine)."""
    head = ["engine", "op", "carrying", "per step", "bytes a step", "of them BatchNorm's"]
    rows = [head, ["---"] * len(head)]
    for m in collectives.moves(workload):
        if not m.batchnorm_bytes:
            share = "–"
        elif m.batchnorm_bytes == m.bytes:
            share = "all"
        else:  # among others: BatchNorm's ops of their own, or its bytes in shared buckets
            share = f"{m.batchnorm_count} ops, " * bool(m.batchnorm_count)
            share += fmt_bytes(m.batchnorm_bytes)
        size = fmt_bytes(m.bytes) if m.bytes else "–"
        rows.append([_text(m.engine), _text(m.op), _text(m.what), m.count, size, share])
    lines = ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(['<div class="results" markdown>', "", *lines, "", "</div>"])


def _scaling_table(path: str, workload: str, strategies: str = "") -> str:
    """Each 2-device run of `workload` (of `strategies`, where given) with a core per device,
    beside the 1-device run of its strategy (else `single`) on as many cores: accuracy, the
    median time, speedup."""
    pairs = _pairs(_drawn(path, workload), workload, strategies.split(",") if strategies else [])
    if not pairs:
        raise LookupError(f"{path} has no {workload} runs on 1 and 2 devices, a core each")
    shown = [e for pair in pairs for e in pair]
    unit = "s per repeat" if workload == "resnet50" else "s/epoch"
    head = ["run", "cores per device", "test accuracy, 1 / 2 devices", f"1 device, {unit}"]
    head += [f"2 devices, {unit}", "speedup", "the 2 devices in"]
    rows = [_row(base, two) for base, two in pairs]
    accs = [e.rec.test_acc for e in shown if e.rec.test_acc is not None]
    chance = bool(accs) and all(map(_chance, accs))  # a few steps learn nothing
    if not accs or chance:  # resnet50 measures time alone
        head, rows = head[:2] + head[3:], [row[:2] + row[3:] for row in rows]
    table = [head, ["---"] * len(head), *rows]
    lines = ["| " + " | ".join(map(str, cells)) + " |" for cells in table]
    lines += ["", _provenance(path, shown) + (CHANCE if chance else "")]
    return "\n".join(['<div class="results" markdown>', "", *lines, "", "</div>"])


def _drawn(path: str, workload: str) -> list[Entry]:
    """The runs of `workload` in `path` that a table may draw: of clean commits, the newest of
    each cell, not a cluster's, all of one machine group (compare/records.py's rule)."""
    kept, _ = records.newest([e for e in _entries(path) if not dirty(e.rec.git_commit)])
    groups = [g for m in records.machines(kept)[0] if (g := m.workload(workload))]
    if len(groups) > 1:
        raise LookupError(
            f"{path} holds {workload} runs of {len(groups)} machine groups (preset, platform, "
            "hardware): a table draws one; keep each group's records in a file of its own"
        )
    return groups[0] if groups else []


def _entries(path: str) -> list[Entry]:
    """Every record of `path`, checked as the report checks it; a bad line, or a record the
    report would leave out (a field of the wrong type, say), is a ResultsError naming the line."""
    file = ROOT / path
    try:
        recs = results.load(file)
    except results.ResultsError as e:
        raise results.ResultsError(str(e).replace(str(file), path, 1)) from None
    lines = _record_lines(file)
    entries = [Entry(rec, path, i) for i, rec in enumerate(recs)]
    for e in entries:
        if why := checks.problem(e.rec):
            raise results.ResultsError(f"{path}:{lines[e.order]}: {why}")
    return entries


def _record_lines(file: Path) -> list[int]:
    """The line of each record results.load read from `file`, in its order (it skips blank
    lines and other kinds of record; every line is a JSON object once it has read them)."""
    with file.open("rb") as f:
        lines = [(n, raw) for n, raw in enumerate(f, start=1) if raw.strip()]
    return [n for n, raw in lines if json.loads(raw).get("workload") not in results.OTHER_KINDS]


def _bubble(path: str) -> str:
    """The pipeline's bubble of `path`'s gpipe and 1f1b runs (compare/resnet50.py)."""
    text = resnet50.bubble_markdown(_drawn(path, "resnet50"), path)
    if text is None:
        what = "gpipe or 1f1b runs with their stages' spans at two micro-batch counts"
        raise LookupError(f"{path} has no {what}")
    return "\n".join(['<div class="results" markdown>', "", text, "", "</div>"])


def _pairs(runs: list[Entry], workload: str, strategies: list[str]) -> list[tuple[Entry, Entry]]:
    """(1 device, 2 devices) of each plain run (float32, eager, not a sweep's) with a core per
    device, in the report's row order."""

    def key(e: Entry, strategy: str) -> tuple:
        return e.rec.framework, strategy, e.cores_per_device

    plain = [e for e in runs if not e.tier and not e.sweep and e.cores_per_device]
    one = {key(e, e.rec.strategy): e for e in plain if e.rec.devices == 1}
    chosen = strategies or {e.rec.strategy for e in plain}
    twos = [e for e in plain if e.rec.devices == 2 and e.rec.strategy in chosen]
    twos.sort(key=lambda e: records.rank(workload, e.rec.framework, e.label))
    bases = [one.get(key(two, two.rec.strategy)) or one.get(key(two, "single")) for two in twos]
    return [(base, two) for base, two in zip(bases, twos, strict=True) if base]


def _row(base: Entry, two: Entry) -> list:
    def seconds(e: Entry) -> str:
        time = e.median
        return (f"{time:.0f}" if time >= 100 else f"{time:.3g}") + "\\*" * e.rec.extrapolated

    acc = " / ".join(map(_accuracy, (base.rec.test_acc, two.rec.test_acc)))
    split = f", split {two.rec.split_size}" if two.rec.split_size else ""
    run = _text(f"{two.rec.framework} {two.label}{split}")
    ran = _text(RAN.get(two.execution, two.execution))
    speedup = f"{base.median / two.median:.2f}x"
    return [run, two.cores_per_device, acc, seconds(base), seconds(two), speedup, ran]


def _provenance(path: str, shown: list[Entry]) -> str:
    """Where the numbers come from: the file, the machine, the versions, the commits."""
    first, hw = shown[0].rec, shown[0].rec.hardware
    batches = shown[0].extra.get("num_batches")
    size = f"{first.epochs} epochs" if first.sec_per_epoch else f"{batches} batches a repeat"
    versions = dict.fromkeys(
        f"{e.rec.framework} {e.rec.versions.get(e.rec.framework)}" for e in shown
    )
    commits = dict.fromkeys(results.short_commit(e.rec.git_commit) for e in shown)
    machine = f"{hw.get('cpu')} ({hw.get('cpu_isa')}), {hw.get('cpu_count')} cores"
    line = f"`{path}`: " + _text(
        f"{machine}, preset {first.preset}, {size}; {', '.join(versions)}; "
        f"commit {', '.join(commits)}; each run's median time."
    )
    steps = {e.rec.steps_timed for e in shown if e.rec.extrapolated}
    return line + (f" \\* projected from {min(steps)} timed steps an epoch." if steps else "")


def _accuracy(acc: float | None) -> str:
    """A test accuracy as a cell shows it: one at chance says so."""
    if acc is None:
        return "–"
    return f"{acc:.3f}" + (" (chance)" if _chance(acc) else "")


def _chance(acc: float) -> bool:
    """Whether `acc` is what guessing scores, near enough: the run learnt next to nothing."""
    return acc < 2 * GUESS


def _learning(paths: list[str], workload: str, page, config) -> str:
    """What `workload`'s runs learnt: each run's test accuracy on 1 and 2 devices, a column per
    records file (a machine, preset and length of training each), drawn by the table's rule; the
    accuracy after every epoch as curves, a panel per file (a PNG written beside the page in the
    site being built), and their numbers in a fold."""
    files = [(path, _trained(path, workload)) for path in paths]
    keys = sorted({k for _, runs in files for k in runs}, key=lambda k: records.rank(workload, *k))
    machines = [_machine(runs) for _, runs in files]
    head = ["test accuracy, 1 / 2 devices", *("<br>".join(map(_text, m)) for m in machines)]
    rows = [[_text(f"{fw} {label}")] for fw, label in keys]
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
    runs = [e for e in _drawn(path, workload) if e.rec.test_acc_per_epoch and e.rec.devices <= 2]
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
    return " / ".join(_accuracy(e and e.rec.test_acc) for e in pair) if pair else "–"


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
    return f"`{path}`: " + _text(f"{', '.join(versions)}; commit {', '.join(commits)}")


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
            [_text(f"{fw} {label}"), str(n), *(f"{a:.3f}" for a in e.rec.test_acc_per_epoch)]
            for (fw, label), n, e in shown
        ]
        rows = [row + [""] * (len(head) - len(row)) for row in rows]
        table = [head, ["---"] * len(head), *rows]
        parts += [_text(", ".join(_machine(runs))) + f" (`{path}`):", ""]
        parts += ["| " + " | ".join(cells) + " |" for cells in table] + [""]
    return "\n".join(['<div class="results" markdown>', "", *parts, "</div>"])


def _text(value) -> str:
    """A record's text as a table cell shows it, literally (as the report escapes it)."""
    return escape(str(value)).replace("|", "\\|")


def _relink(markdown: str, origin, page, config) -> str:
    """Links relative to `origin` (a repository file) made the page's: to the site's page or file,
    else to the checkout's file (raw HTML: mkdocs checks the links into its docs only)."""
    docs = Path(config.docs_dir)
    page_dir = (docs / page.file.src_uri).parent

    def point(match):
        target = (ROOT / origin).parent / match["target"]
        anchor = match["anchor"] or ""
        if target.resolve().is_relative_to(docs.resolve()):
            return f"[{match['text']}]({os.path.relpath(target, page_dir)}{anchor})"
        out = Path(config.site_dir) / page.file.dest_uri
        return f'<a href="{os.path.relpath(target, out.parent)}{anchor}">{match["text"]}</a>'

    return LINK.sub(point, markdown)
