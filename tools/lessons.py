"""`python -m tools.lessons [--check]` (`make lessons`): each workload's lesson as one page, the
three frameworks side by side, generated from the code as it stands.

For each workload, docs/lessons/<workload>.md and .html hold a row per concept (the model, the
step, each strategy, the training loop, ...) and a column per framework; each cell is the
source of the framework's function or class for that concept, read with `ast` (no framework is
imported). --check writes nothing and exits 1 when a committed page differs from what the code
gives; tests/common/test_lessons.py runs it, so the pages cannot drift from the code.
"""

from __future__ import annotations

import argparse
import ast
import html
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "lessons"
FRAMEWORKS = ("torch", "jax", "mxnet")
TITLES = {
    "lenet": "LeNet, data parallel from scratch (d2l 13.5)",
    "resnet18": "ResNet-18, each framework's concise data parallel (d2l 13.6)",
    "resnet50": "ResNet-50, model parallel and pipelined (the PyTorch tutorial)",
}
ALL = "*"  # the same names in every framework
JAX_STAGES = ["forward", "stage_forward", "stage_backward", "last_stage_step", "sgd"]

# (concept, what it shows, {framework or ALL: the top-level names that hold it})
ROWS = {
    "lenet": [
        ("model", "the network, written out over a dict of parameters", {ALL: ["lenet"]}),
        ("loss", "cross-entropy summed over the batch", {ALL: ["loss_fn"]}),
        ("replicate", "the parameters copied to a device", {ALL: ["get_params"]}),
        ("allreduce", "the gradients summed over the devices, by hand", {ALL: ["allreduce"]}),
        ("split", "a batch split over the devices", {ALL: ["split_batch"]}),
        ("train_step", "one step on every device: the data-parallel step", {ALL: ["train_batch"]}),
        ("evaluate", "correct predictions on one batch", {ALL: ["evaluate"]}),
        ("train", "the training loop", {ALL: ["train"]}),
    ],
    "resnet18": [
        (
            "model",
            "d2l's ResNet-18",
            {
                "torch": ["Residual", "ResNet18", "resnet18"],
                "jax": ["Residual", "batch_norm", "ResNet18", "resnet18"],
                "mxnet": ["Residual", "resnet18"],
            },
        ),
        ("train_step", "one SGD step on one batch", {ALL: ["loss_fn", "train_step"]}),
        ("evaluate", "correct predictions on one batch", {ALL: ["evaluate"]}),
        (
            "strategy: one process",
            "one process drives every device (the classic form)",
            {"torch": ["data_parallel"], "jax": ["pmap"], "mxnet": ["context_list"]},
        ),
        (
            "strategy: the default",
            "each framework's recommended tool (torch and MXNet: a process per device or worker)",
            {"torch": ["ddp"], "jax": ["sharding"], "mxnet": ["dist_sync"]},
        ),
        ("train", "the training loop, the same for every strategy", {ALL: ["train"]}),
    ],
    "resnet50": [
        ("toy model", "the whole idea in a few lines", {ALL: ["ToyModel", "train_toy"]}),
        ("stages", "the network cut into one stage per device", {ALL: ["split_into_stages"]}),
        (
            "model parallel",
            "stage after stage (JAX differentiates each stage with jitted pieces of its own)",
            {
                "torch": ["ModelParallelResNet50"],
                "jax": [*JAX_STAGES, "ModelParallelResNet50"],
                "mxnet": ["ModelParallelResNet50"],
            },
        ),
        ("pipeline", "micro-batches overlapping the stages", {ALL: ["PipelineParallelResNet50"]}),
        ("train", "the tutorial's training loop", {ALL: ["train"]}),
    ],
}


def sources(framework: str, workload: str) -> dict[str, str]:
    """{top-level name: its source} of the framework's workload file."""
    path = ROOT / f"{framework}_impl" / f"{workload}.py"
    text = path.read_text()
    nodes = [n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    return {n.name: _with_decorators(text, n) for n in nodes}


def _with_decorators(text: str, node: ast.AST) -> str:
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return "\n".join(text.splitlines()[first - 1 : node.end_lineno])


def cells(workload: str) -> list[tuple[str, str, dict[str, str]]]:
    """(concept, what it shows, {framework: source}) of each row; a missing name is an error."""
    found = {f: sources(f, workload) for f in FRAMEWORKS}
    rows = []
    for concept, what, names in ROWS[workload]:
        row = {}
        for f in FRAMEWORKS:
            wanted = names.get(f, names.get(ALL))
            missing = [n for n in wanted if n not in found[f]]
            if missing:
                raise SystemExit(f"error: {f}_impl/{workload}.py has no {missing[0]}; fix ROWS")
            row[f] = "\n\n\n".join(found[f][n] for n in wanted)
        rows.append((concept, what, row))
    return rows


def markdown(workload: str) -> str:
    """The page in Markdown: one table per concept, a column per framework (GitHub renders the
    fenced code inside the table's cells)."""
    link = f"[{workload}.html]({workload}.html)"
    out = [f"# {TITLES[workload]}", "", _intro(f"HTML: {link}"), ""]
    for concept, what, row in cells(workload):
        out += [f"## {concept}", "", f"{what}.", "", "<table><tr>"]
        out += [f"<th>{f}_impl/{workload}.py</th>" for f in FRAMEWORKS]
        out.append("</tr><tr>")
        for f in FRAMEWORKS:
            out += ['<td valign="top">', "", "```python", row[f], "```", "", "</td>"]
        out += ["</tr></table>", ""]
    return "\n".join(out)


STYLE = (
    "body{font-family:system-ui,sans-serif;margin:1.5em}"
    ".row{display:grid;grid-template-columns:repeat(3,minmax(0,1fr));gap:1em}"
    "pre{background:#f6f8fa;padding:.6em;overflow-x:auto;font-size:80%;margin:0}"
    "h3{margin:.2em 0;font-size:95%;font-family:monospace}"
)


def html_page(workload: str) -> str:
    """The page as one HTML file: the three columns in a grid, each cell escaped source."""
    title = html.escape(TITLES[workload])
    link = f'<a href="{workload}.md">{workload}.md</a>'
    out = [
        "<!DOCTYPE html>",
        f'<html><head><meta charset="utf-8"><title>{title}</title>',
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{title}</h1>",
        f"<p>{_intro(f'Markdown: {link}')}</p>",
    ]
    for concept, what, row in cells(workload):
        out.append(f"<h2>{html.escape(concept)}</h2><p>{html.escape(what)}.</p>")
        out.append('<div class="row">')
        for f in FRAMEWORKS:
            out.append(f"<div><h3>{f}_impl/{workload}.py</h3>")
            out.append(f"<pre><code>{html.escape(row[f])}</code></pre></div>")
        out.append("</div>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _intro(other: str) -> str:
    return (
        f"Generated from the code by make lessons (tools/lessons.py); the same page in {other}. "
        "The measuring around each loop lives in common/harness.py."
    )


def pages() -> dict[Path, str]:
    return {
        OUT / f"{w}.{kind}": (markdown(w) if kind == "md" else html_page(w))
        for w in ROWS
        for kind in ("md", "html")
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.lessons", description=__doc__)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 on a difference")
    args = p.parse_args(argv)
    stale = [path for path, text in pages().items() if not _same(path, text)]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} differs from the code; run `make lessons`")
        return 1 if stale else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for path, text in pages().items():
        path.write_text(text)
    print(f"wrote {len(pages())} pages to {OUT.relative_to(ROOT)}/")
    return 0


def _same(path: Path, text: str) -> bool:
    return path.is_file() and path.read_text() == text


if __name__ == "__main__":
    sys.exit(main())
