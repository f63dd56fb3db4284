"""The site's mkdocs hook (mkdocs.yml): what a page shows of the project is read from it as the
site is built. A line of a page, indented as the block it sits in, is replaced:

    --8<-- "torch_impl/resnet18.py:ddp"        `ddp`'s source (ast), less its docstring
    --8<-- "jax_impl/lenet.py:_split,split_batch"   several names; `Class.method`
    --8<-- "torch_impl/zero.py:zero3~ddp"      zero3, the lines that ddp lacks marked (a name of
                                               the same file, or `path.py:name`)
    --8<-- "results/cpu-xeon-avx512-2core.jsonl:resnet18[:ddp,...]"   its runs on 1 against 2
                                               devices, a core per device, as a table
    --8<-- "results/gpu-h100.jsonl,results/gpu-h200.jsonl:resnet18:accuracy"   what its runs
                                               learnt: test accuracy on 1 and 2 devices, a
                                               column per file, and the curves of every epoch
    --8<-- "results/cpu-xeon-avx512-2core-bubble.jsonl:resnet50:bubble"   the pipeline's
                                               bubble: each stage's busy share beside the schedule's
    --8<-- "results/zero-....jsonl:zero:memory"   lesson 4's tables: holds, memory, bytes or
                                               time (tools/docs_memory.py)
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
import difflib
import logging
import os
import re
import textwrap
from pathlib import Path

from common import collectives, results
from compare import records, resnet50
from compare.records import Entry
from compare.scaling_report import fmt_bytes

# mkdocs runs this file with its own folder first on sys.path (tools/ is no installed package);
# the tests and tools/docs_build.py import it as tools.docs_hook.
if __package__ == "tools":
    from tools import docs_learning, docs_memory, docs_records
else:
    import docs_learning
    import docs_memory
    import docs_records

ROOT = Path(__file__).resolve().parent.parent
DIRECTIVE = re.compile(r'^(?P<indent>[ \t]*)--8<-- "(?P<path>[^":]+)(?::(?P<names>[^"]+))?"$', re.M)
# A code line (pymdownx.highlight), its text in a span of its own where it is marked (hl_lines).
LINE = re.compile(r'<span id="__span-[\d-]+"(?=>(?:<span class="hll">)?( *))')
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s:#]+)(?P<anchor>#[^)\s]*)?\)")
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# "concurrent" records a framework that may run its devices at once (a thread per device),
# not that they overlapped: MXNet's contexts take turns all the same (docs/results.md).
RAN = {"processes": "a process each", "concurrent": "one process, a thread per device"}
RAN["sequential"] = "one process, in turn"  # a torch process computes on its devices in turn
CHANCE = " Test accuracy left out: every run's is at chance, under twice a guess's."

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
            text = docs_learning.learning(
                path.split(","), names.removesuffix(":accuracy"), page, config
            )
        elif path.endswith(".jsonl") and names.startswith("zero:"):
            text = _zero(path, names.removeprefix("zero:"))
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
        text = f'!!! failure "Not found"\n    {docs_records.text(reason)}'
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
    """The named definitions of `path` as one fenced block, titled with the file; `name~other`
    marks the lines of `name` that `other` (a name of `path`, or `file.py:name`) lacks."""
    text = _read(path)
    tree, lines = ast.parse(text), text.splitlines()
    parts, marked = [], []
    for name in names:
        name, _, other = name.partition("~")
        part = _source(lines, _find(tree, name, path))
        before = sum(len(p.splitlines()) + 1 for p in parts)  # the blank line between parts
        marked += [before + i for i in _changed(part, path, other)] if other else []
        parts.append(part)
    marks = f' hl_lines="{" ".join(map(str, marked))}"' if marked else ""
    return "\n".join([f'```python title="{path}"{marks}', "\n\n".join(parts), "```"])


def _changed(part: str, path: str, other: str) -> list[int]:
    """The lines of `part` (from 1) that differ from `other`'s, their comments aside: the lines
    a reader comparing the two looks for."""
    other_path, _, name = other.rpartition(":")
    other_path = other_path or path
    text = _read(other_path)
    theirs = _source(text.splitlines(), _find(ast.parse(text), name, other_path))

    def code(source: str) -> list[str]:
        return [line.split("  #")[0].strip() for line in source.splitlines()]

    ops = difflib.SequenceMatcher(None, code(theirs), code(part), autojunk=False).get_opcodes()
    return [j + 1 for tag, _, _, j1, j2 in ops if tag != "equal" for j in range(j1, j2)]


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
        rows.append(
            [
                docs_records.text(m.engine),
                docs_records.text(m.op),
                docs_records.text(m.what),
                m.count,
                size,
                share,
            ]
        )
    lines = ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(['<div class="results" markdown>', "", *lines, "", "</div>"])


def _scaling_table(path: str, workload: str, strategies: str = "") -> str:
    """Each 2-device run of `workload` (of `strategies`, where given) with a core per device,
    beside the 1-device run of its strategy (else `single`) on as many cores: accuracy, the
    median time, speedup."""
    pairs = _pairs(
        docs_records.drawn(path, workload), workload, strategies.split(",") if strategies else []
    )
    if not pairs:
        raise LookupError(f"{path} has no {workload} runs on 1 and 2 devices, a core each")
    shown = [e for pair in pairs for e in pair]
    unit = "s per repeat" if workload == "resnet50" else "s/epoch"
    head = ["run", "cores per device", "test accuracy, 1 / 2 devices", f"1 device, {unit}"]
    head += [f"2 devices, {unit}", "speedup", "the 2 devices in"]
    rows = [_row(base, two) for base, two in pairs]
    accs = [e.rec.test_acc for e in shown if e.rec.test_acc is not None]
    chance = bool(accs) and all(map(docs_records.chance, accs))  # a few steps learn nothing
    if not accs or chance:  # resnet50 measures time alone
        head, rows = head[:2] + head[3:], [row[:2] + row[3:] for row in rows]
    table = [head, ["---"] * len(head), *rows]
    lines = ["| " + " | ".join(map(str, cells)) + " |" for cells in table]
    lines += ["", _provenance(path, shown) + (CHANCE if chance else "")]
    return "\n".join(['<div class="results" markdown>', "", *lines, "", "</div>"])


def _bubble(path: str) -> str:
    """The pipeline's bubble of `path`'s gpipe and 1f1b runs (compare/resnet50.py)."""
    text = resnet50.bubble_markdown(docs_records.drawn(path, "resnet50"), path)
    if text is None:
        what = "gpipe or 1f1b runs with their stages' spans at two micro-batch counts"
        raise LookupError(f"{path} has no {what}")
    return "\n".join(['<div class="results" markdown>', "", text, "", "</div>"])


def _zero(path: str, kind: str) -> str:
    """Lesson 4's table of `kind` (tools/docs_memory.py), and where its numbers come from."""
    shown = docs_records.drawn(path, "zero")
    text = docs_memory.table(shown, kind)
    lines = [text, "", _provenance(path, shown)]
    return "\n".join(['<div class="results" markdown>', "", *lines, "", "</div>"])


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

    acc = " / ".join(map(docs_records.accuracy, (base.rec.test_acc, two.rec.test_acc)))
    split = f", split {two.rec.split_size}" if two.rec.split_size else ""
    run = docs_records.text(f"{two.rec.framework} {two.label}{split}")
    ran = docs_records.text(RAN.get(two.execution, two.execution))
    speedup = f"{base.median / two.median:.2f}x"
    return [run, two.cores_per_device, acc, seconds(base), seconds(two), speedup, ran]


def _provenance(path: str, shown: list[Entry]) -> str:
    """Where the numbers come from: the file, the machine, the versions, the commits."""
    first, hw = shown[0].rec, shown[0].rec.hardware
    batches = shown[0].extra.get("num_batches")
    epochs = "/".join(str(n) for n in sorted({e.rec.epochs for e in shown}))
    size = f"{epochs} epochs" if first.sec_per_epoch else f"{batches} batches a repeat"
    versions = dict.fromkeys(
        f"{e.rec.framework} {e.rec.versions.get(e.rec.framework)}" for e in shown
    )
    commits = dict.fromkeys(results.short_commit(e.rec.git_commit) for e in shown)
    machine = f"{hw.get('cpu')} ({hw.get('cpu_isa')}), {hw.get('cpu_count')} cores"
    line = f"`{path}`: " + docs_records.text(
        f"{machine}, preset {first.preset}, {size}; {', '.join(versions)}; "
        f"commit {', '.join(commits)}; each run's median time."
    )
    timed = {e.rec.steps_timed for e in shown if e.rec.extrapolated and e.rec.steps_timed}
    steps = "/".join(str(n) for n in sorted(timed))
    return line + (f" \\* projected from {steps} timed steps an epoch." if steps else "")


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
