"""`python -m tools.lessons [--check] [--screenshot]` (`make lessons`): each workload's lesson as
one page, the three frameworks side by side, generated from the code as it stands.

For each workload, docs/lessons/<workload>.md and .html hold a row per concept and a column per
framework: first each file's imports, then how the processes start and join, then the concepts
(the model, the step, each strategy, the training loop, ...). Each cell is the framework's own
text, read with `ast` (no framework is imported): its prose is docstrings (the part of the
module's docstring that names the row's functions, then each function's own), its code the
source of those functions or classes, and it ends with the command that runs it (checked
against common/cli.py's parser and the file's STRATEGIES). Some lines fold away, marked ⋯ (the
HTML opens them on a click; the Markdown keeps the mark, the file has them): a docstring (the
prose above the code is its text), a statement only the benchmark needs (BENCHMARK), an error
check (an `if` whose body only raises), a definition the row names in `fold`. The HTML is
highlighted with pygments and wraps its code with a hanging indent, so three columns fit 1366 px
(tests/common/test_lessons_browser.py checks it in headless chromium).

tools/lessons_code.py reads the code (what folds, what prose, which commands), and
tools/lessons_render.py writes the pages. --check writes nothing and exits 1 when a committed
page differs from what the code gives; tests/common/test_lessons.py runs it, so the pages
cannot drift from the code. --screenshot writes docs/lessons/resnet18.png with headless
chromium (the README shows it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tools import lessons_render as render
from tools.lessons_code import (
    IMPORTS,
    ROOT,
    Cell,
    Source,
    Unit,
    command,
    docstring,
    folds,
    mentions,
    source,
    test_command,
    units,
)

OUT = ROOT / "docs" / "lessons"
FRAMEWORKS = ("torch", "jax", "mxnet")
TITLES = {
    "lenet": "LeNet, data parallel from scratch (d2l 13.5)",
    "resnet18": "ResNet-18, each framework's concise data parallel (d2l 13.6)",
    "resnet50": "ResNet-50, model parallel and pipelined (the PyTorch tutorial)",
}
ALL = "*"  # the same names in every framework

# How several processes start and join (<fw>_impl/launch.py): the launcher this project runs, and
# the call with which each process joins the others. JAX's processes are started by hand (its
# launch.py says how): no launcher. "launch" alone brings that module's first paragraph.
START = {"torch": ["launch.torchrun"], "jax": [], "mxnet": ["launch.dist_sync"]}
JOIN = {"torch": "launch.join", "jax": "launch.join", "mxnet": "launch.join"}
# resnet18 over two machines, the same options for the three frameworks.
NODES = "--gpus 1 --nnodes 2 --node-rank R --rdzv-endpoint HOST:29500  # R: 0 on HOST, 1 on another"

TWO = "--gpus 2"  # the command-line tail of a row that names no strategy
TEST = "test: "  # a row's run that is a test: "test: toy_model" runs test_toy_model...


@dataclass(frozen=True)
class Row:
    """A concept: what it shows; the names that hold it in each framework (ALL: the same in
    every one; "launch.join": a name of <fw>_impl/launch.py); the names folded whole (their
    docstrings stay above the code); and, per framework or ALL, the command-line tails after
    `--workload W` of the commands that run it ([]: none does)."""

    concept: str
    what: str
    names: dict[str, list[str]]
    fold: tuple[str, ...] = ()
    runs: dict[str, list[str]] = field(default_factory=lambda: {ALL: [TWO]})


IMPORTS_ROW = Row("imports", "what each file brings in", {ALL: [IMPORTS]})
ONE_PROCESS = Row(
    "start and join",
    "one process drives every device: the devices it takes (nothing to start or join)",
    {ALL: ["devices.get_devices"]},
)
ROWS = {
    "lenet": [
        IMPORTS_ROW,
        ONE_PROCESS,
        Row("model", "the network, written out over a dict of parameters", {ALL: ["lenet"]}),
        Row("loss", "cross-entropy summed over the batch", {ALL: ["loss_fn"]}),
        Row("replicate", "the parameters copied to a device", {ALL: ["get_params"]}),
        Row(
            "allreduce",
            "the gradients summed over the devices, by hand",
            {ALL: ["allreduce"], "jax": ["_add", "allreduce"]},
        ),
        Row(
            "split",
            "a batch split over the devices",
            {ALL: ["split_batch"], "jax": ["_split", "split_batch"]},
        ),
        Row(
            "train_step",
            "one step on every device: the data-parallel step",
            {ALL: ["train_batch"], "jax": ["_loss_and_grads", "_sgd", "train_batch"]},
        ),
        Row(
            "evaluate",
            "correct predictions on one batch",
            {ALL: ["evaluate"], "jax": ["_correct", "evaluate"]},
        ),
        Row("train", "the training loop", {ALL: ["train"], "jax": ["_take", "train"]}),
    ],
    "resnet18": [
        IMPORTS_ROW,
        Row(
            "start and join",
            "a process per device or machine, started by a launcher, each joining the others",
            {f: ["launch", *START[f], JOIN[f]] for f in FRAMEWORKS},
            fold=tuple(name for f in FRAMEWORKS for name in START[f]),
            runs={
                "torch": ["--gpus 2 --strategy ddp", NODES],
                "jax": [NODES],
                "mxnet": ["--gpus 2 --strategy dist", NODES],
            },
        ),
        Row(
            "model",
            "d2l's ResNet-18 (folded: the lesson is how it trains on several devices)",
            {
                "torch": ["Residual", "ResNet18", "resnet18"],
                "jax": ["Residual", "batch_norm", "ResNet18", "resnet18"],
                "mxnet": ["Residual", "resnet18"],
            },
            fold=("Residual", "batch_norm", "ResNet18", "resnet18"),
        ),
        Row(
            "train_step",
            "one SGD step on one batch, and the correct predictions on one",
            {ALL: ["loss_fn", "make_optimizer", "train_step", "evaluate"]},
        ),
        Row(
            "strategy: one process",
            "one process drives every device: the classic form (JAX: also per-device code)",
            {"torch": ["data_parallel"], "jax": ["pmap", "shard_map"], "mxnet": ["context_list"]},
            runs={
                "torch": ["--gpus 2 --strategy dataparallel"],
                "jax": ["--gpus 2 --strategy pmap", "--gpus 2 --strategy shard_map"],
                "mxnet": ["--gpus 2 --strategy gluon"],
            },
        ),
        Row(
            "strategy: the default",
            "each framework's recommended tool (torch and MXNet: a process per device or worker)",
            {"torch": ["ddp"], "jax": ["sharding"], "mxnet": ["dist_sync"]},
            runs={
                "torch": ["--gpus 2 --strategy ddp"],
                "jax": ["--gpus 2 --strategy sharding"],
                "mxnet": ["--gpus 2 --strategy dist"],
            },
        ),
        Row("train", "the training loop, the same for every strategy", {ALL: ["train"]}),
    ],
    "resnet50": [
        IMPORTS_ROW,
        ONE_PROCESS,
        Row(
            "toy model",
            "the whole idea in a few lines (a test runs it)",
            {ALL: ["ToyModel", "train_toy"]},
            runs={ALL: [TEST + "toy_model"]},
        ),
        Row("stages", "the network cut into one stage per device", {ALL: ["split_into_stages"]}),
        Row(
            "model parallel",
            "stage after stage (JAX differentiates each stage with jitted pieces of its own)",
            {
                "torch": ["ModelParallelResNet50"],
                "jax": [
                    "forward",
                    "stage_forward",
                    "stage_backward",
                    "last_stage_step",
                    "sgd",
                    "ModelParallelResNet50",
                ],
                "mxnet": ["ModelParallelResNet50"],
            },
            runs={ALL: ["--gpus 2 --strategy model_parallel"]},
        ),
        Row(
            "pipeline",
            "micro-batches overlapping the stages",
            {ALL: ["PipelineParallelResNet50"]},
            runs={ALL: ["--gpus 2 --strategy pipeline --split-size 20"]},
        ),
        Row("train", "the tutorial's training loop", {ALL: ["train"]}),
    ],
}


# --- the prose of the workload file's docstring --------------------------------------------------


def claims(workload: str, framework: str, module: Source) -> dict[int, list[Unit]]:
    """Which row tells each paragraph (or entry) of the workload file's docstring: the first row
    that names one of its functions in it (`ddp`), with the line that introduces an entry; the
    imports row, every paragraph that no row names."""
    found = units(module.doc)
    told: dict[int, list[int]] = {}
    taken: set[int] = set()
    for r, row in enumerate(ROWS[workload]):
        names = [n for n in _names(row, framework) if "." not in n]
        for i, unit in enumerate(found):
            if i in taken or not mentions(unit, names):
                continue
            if unit.head is not None and unit.head not in taken:
                told.setdefault(r, []).append(unit.head)
                taken.add(unit.head)
            told.setdefault(r, []).append(i)
            taken.add(i)
    imports = next(r for r, row in enumerate(ROWS[workload]) if IMPORTS in _names(row, framework))
    told[imports] = [i for i in range(len(found)) if i not in taken]
    return {r: [found[i] for i in indices] for r, indices in told.items()}


def _names(row: Row, framework: str) -> list[str]:
    return row.names.get(framework, row.names.get(ALL, []))


# --- the cells -----------------------------------------------------------------------------------


def cells(workload: str) -> list[tuple[Row, dict[str, Cell]]]:
    """Each row with its cell in every framework; a name that is missing is an error."""
    rows = []
    main = {f: source(f, workload) for f in FRAMEWORKS}
    told = {f: claims(workload, f, main[f]) for f in FRAMEWORKS}
    for r, row in enumerate(ROWS[workload]):
        rows.append(
            (row, {f: _cell(workload, f, row, main[f], told[f].get(r, [])) for f in FRAMEWORKS})
        )
    return rows


def _cell(workload: str, framework: str, row: Row, main: Source, told: list[Unit]) -> Cell:
    files, prose, shown = [], list(told), []
    others: dict[str, Source] = {}
    for name in _names(row, framework):
        module, _, bare = name.rpartition(".")
        if not module and name not in main.pieces and _is_module(framework, name):
            module, bare = name, None  # a module alone: its first paragraph, no code
        if module and module not in others:
            others[module] = source(framework, module)
        where = others[module] if module else main
        if where.path not in files:
            files.append(where.path)
        if module:
            prose += [u for u in _module_prose(where, row, framework, bare) if u not in prose]
        if bare is None:
            continue
        if bare not in where.pieces:
            raise SystemExit(f"error: {where.path} has no {bare}; fix ROWS in tools/lessons.py")
        piece = where.pieces[bare]
        doc = docstring(piece.node)
        if doc:
            prose.append((bare, doc))
        shown.append((piece, folds(piece, name in row.fold or bare in row.fold)))
    return Cell(files, prose, shown, _commands(workload, framework, row, main))


def _is_module(framework: str, name: str) -> bool:
    return (ROOT / f"{framework}_impl" / f"{name}.py").is_file()


def _module_prose(module: Source, row: Row, framework: str, bare: str | None) -> list[Unit]:
    """Another file's paragraphs for a row: its first one where the row names the module alone,
    and those that name one of the row's functions in it."""
    found = units(module.doc)
    names = [n.rpartition(".")[2] for n in _names(row, framework) if "." in n]
    return [u for i, u in enumerate(found) if (i == 0 and bare is None) or mentions(u, names)]


def _commands(workload: str, framework: str, row: Row, main: Source) -> list[str]:
    tails = row.runs.get(framework, row.runs.get(ALL, []))
    return [
        test_command(workload, framework, tail[len(TEST) :])
        if tail.startswith(TEST)
        else command(workload, framework, tail, main)
        for tail in tails
    ]


# --- the pages, the screenshot -------------------------------------------------------------------


def markdown(workload: str) -> str:
    return render.markdown(TITLES[workload], _intro(f"[HTML]({workload}.html)"), cells(workload))


def html_page(workload: str) -> str:
    link = f'<a href="{workload}.md">Markdown</a>'
    return render.html(TITLES[workload], _intro(link), cells(workload))


def _intro(other: str) -> str:
    return (
        f"Generated from the code by make lessons (tools/lessons.py); the same page in {other}. "
        "A row per concept, a column per framework: the docstrings, then the code, then the "
        "command that runs it. ⋯ marks what folds away (click it): a docstring (its text is "
        "above the code), a line only the benchmark needs, an error check, a definition the "
        "lesson does not need. The measuring around each loop lives in common/harness.py."
    )


def pages() -> dict[Path, str]:
    return {
        OUT / f"{w}.{kind}": (markdown(w) if kind == "md" else html_page(w))
        for w in ROWS
        for kind in ("md", "html")
    }


SCREENSHOT = ("resnet18", "strategy-the-default")  # the README's picture: a page and its row


def screenshot() -> Path:
    """docs/lessons/<page>.png: the page's header and one row at 1366 px (a copy of the page
    that hides the other rows: headless chromium's screenshot ignores a #row in the address)."""
    page, row = SCREENSHOT
    png = OUT / f"{page}.png"
    only = f"<style>main section:not(#{row}){{display:none}}</style></head>"
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / f"{page}.html"
        copy.write_text(html_page(page).replace("</head>", only, 1))
        try:
            done = render.chromium("--hide-scrollbars", f"--screenshot={png}", copy.as_uri())
        except FileNotFoundError:
            raise SystemExit(
                "error: --screenshot needs chromium (apt-get install chromium)"
            ) from None
    if done.returncode or not png.is_file():
        raise SystemExit(f"error: chromium made no screenshot: {done.stderr.strip()[-300:]}")
    from PIL import Image  # matplotlib's, in the base environment

    with Image.open(png) as shot:  # 128 colours: a third of the bytes, the text as sharp
        small = shot.convert("RGB").quantize(colors=128)
    small.save(png, optimize=True)
    return png


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.lessons", description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 on a difference")
    p.add_argument("--screenshot", action="store_true", help=f"also write {SCREENSHOT[0]}.png")
    args = p.parse_args(argv)
    made = pages()
    stale = [path for path, text in made.items() if not _same(path, text)]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} differs from the code; run `make lessons`")
        return 1 if stale else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for path, text in made.items():
        path.write_text(text)
    print(f"wrote {len(made)} pages to {OUT.relative_to(ROOT)}/")
    if args.screenshot:
        print(f"wrote {screenshot().relative_to(ROOT)}")
    return 0


def _same(path: Path, text: str) -> bool:
    return path.is_file() and path.read_text() == text


if __name__ == "__main__":
    sys.exit(main())
