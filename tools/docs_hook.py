"""The site's mkdocs hook (mkdocs.yml): what a page shows of the project is read from it as the
site is built. A line of a page, indented as the block it sits in, is replaced:

    --8<-- "torch_impl/resnet18.py:ddp"        `ddp`'s source (ast), less its docstring
    --8<-- "jax_impl/lenet.py:_split,split_batch"   several names; `Class.method`
    --8<-- "results/cpu-xeon-avx512-2core.jsonl:resnet18[:ddp,...]"   its runs on 1 against 2
                                               devices, a core per device, as a table
    --8<-- "CONTRIBUTING.md"                   a Markdown file of the repository, whole

A file or name that is not there is a warning: `mkdocs build --strict` (make docs) fails. Each
link, written relative to its own file, is pointed at the site's page or file for its target,
else at the file in the checkout the site is built in (build/site).
"""

from __future__ import annotations

import ast
import logging
import os
import re
import textwrap
from pathlib import Path

from common import results

ROOT = Path(__file__).resolve().parent.parent
PAGES = {"CONTRIBUTING.md": "contributing.md"}  # files outside docs/ that are pages of the site
DIRECTIVE = re.compile(r'^(?P<indent>[ \t]*)--8<-- "(?P<path>[^":]+)(?::(?P<names>[^"]+))?"$', re.M)
LINE = re.compile(r'<span id="__span-[\d-]+"(?=>( *))')  # a code line (pymdownx.highlight)
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s:#]+)(?P<anchor>#[^)\s]*)?\)")
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
RAN = {"processes": "a process each", "concurrent": "one process, concurrent"}
RAN["sequential"] = "one process, in turn"  # a torch process computes on its devices in turn

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
        if path.endswith(".py"):
            text = _code(path, names.split(","))
        elif path.endswith(".jsonl"):
            text = _scaling_table(path, *names.split(":"))
        else:
            text = _relink((ROOT / path).read_text(), path, page, config)
    except (OSError, SyntaxError, LookupError, results.ResultsError) as e:
        log.warning("%s: %s", page.file.src_uri, e)
        text = f'!!! failure "Not found"\n    {e}'
    return textwrap.indent(text, match["indent"], lambda line: line.strip())


def _code(path: str, names: list[str]) -> str:
    """The named definitions of `path` as one fenced block, titled with the file."""
    text = (ROOT / path).read_text()
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


def _scaling_table(path: str, workload: str, strategies: str = "") -> str:
    """Each 2-device run of `workload` (of `strategies`, where given) with a core per device,
    beside the 1-device run on one core (same strategy, else `single`): accuracy, time, speedup."""
    runs = [r for r in results.load(ROOT / path) if _paired(r, workload)]
    one = {(r.framework, r.strategy): r for r in runs if r.devices == 1}
    chosen = strategies.split(",") if strategies else [r.strategy for r in runs]
    twos = [r for r in runs if r.devices == 2 and r.strategy in chosen]
    bases = [one.get((r.framework, r.strategy), one.get((r.framework, "single"))) for r in twos]
    rows = [_row(base, two) for base, two in zip(bases, twos, strict=True) if base]
    if not rows:
        raise LookupError(f"{path} has no {workload} runs on 1 and 2 devices, a core each")
    unit = "s per repeat" if runs[0].sec_per_epoch is None else "s/epoch"
    head = ["run", "cores per device", "test accuracy, 1 / 2 devices", f"1 device, {unit}"]
    head += [f"2 devices, {unit}", "speedup", "the 2 devices in"]
    if all(r.test_acc is None for r in runs):  # resnet50 measures time alone
        head, rows = head[:2] + head[3:], [row[:2] + row[3:] for row in rows]
    table = [head, ["---"] * len(head), *rows]
    lines = ["| " + " | ".join(map(str, cells)) + " |" for cells in table]
    lines += ["", _provenance(path, runs)]
    return "\n".join(['<div class="results" markdown>', "", *lines, "", "</div>"])


def _paired(r: results.Record, workload: str) -> bool:
    """A plain run of `workload` (float32, eager, not a sweep's) with a core per device."""
    x = r.extra
    plain = x.get("amp") in (None, "off") and not x.get("compiled") and "sweep" not in x
    return r.workload == workload and bool(x.get("cores_per_device")) and plain


def _row(base: results.Record, two: results.Record) -> list:
    def seconds(r):
        time = (r.sec_per_epoch or r.seconds)["median"]
        return time, (f"{time:.0f}" if time >= 100 else f"{time:.3g}") + "\\*" * r.extrapolated

    (t1, s1), (t2, s2) = seconds(base), seconds(two)
    acc = "–" if two.test_acc is None else f"{base.test_acc:.3f} / {two.test_acc:.3f}"
    run = f"{two.framework} {two.strategy}" + (f", split {two.split_size}" * bool(two.split_size))
    ran = RAN.get(two.extra.get("execution"), two.extra.get("execution"))
    return [run, two.extra["cores_per_device"], acc, s1, s2, f"{t1 / t2:.2f}x", ran]


def _provenance(path: str, runs: list[results.Record]) -> str:
    """Where the numbers come from: the file, the machine, the versions, the commit."""
    first, hw = runs[0], runs[0].hardware
    batches = first.extra.get("num_batches")
    size = f"{first.epochs} epochs" if first.sec_per_epoch else f"{batches} batches a repeat"
    versions = {r.framework: r.versions.get(r.framework) for r in runs}
    versions = ", ".join(f"{f} {v}" for f, v in versions.items())
    line = f"`{path}`: {hw.get('cpu')} ({hw.get('cpu_isa')}), {hw.get('cpu_count')} cores, "
    line += f"preset {first.preset}, {size}; {versions}; commit {first.git_commit}."
    steps = {r.steps_timed for r in runs if r.extrapolated}
    return line + (f" \\* projected from {min(steps)} timed steps an epoch." if steps else "")


def _relink(markdown: str, origin, page, config) -> str:
    """Links relative to `origin` (a repository file) made the page's: to the site's page or file,
    else to the checkout's file (raw HTML: mkdocs checks the links into its docs only)."""
    docs = Path(config.docs_dir)
    page_dir = (docs / page.file.src_uri).parent

    def point(match):
        target = (ROOT / origin).parent / match["target"]
        repo = os.path.relpath(target, ROOT)
        site = docs / PAGES[repo] if repo in PAGES else target
        anchor = match["anchor"] or ""
        if site.resolve().is_relative_to(docs.resolve()):
            return f"[{match['text']}]({os.path.relpath(site, page_dir)}{anchor})"
        out = Path(config.site_dir) / page.file.dest_uri
        return f'<a href="{os.path.relpath(target, out.parent)}{anchor}">{match["text"]}</a>'

    return LINK.sub(point, markdown)
