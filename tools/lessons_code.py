"""The code as tools/lessons.py shows it, read with `ast` (never imported): a file's top-level
definitions (Piece, Source), what of them folds away (Fold, folds: a docstring, a statement only
the benchmark needs, an error check, a definition folded whole), its docstrings as prose (Unit,
units), a row's cell in one framework (Cell), and the commands a cell ends with, checked against
common/cli.py's parser and the test files."""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import itertools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORTS = "<imports>"  # a file's import block, as a name
# Statements only the benchmark needs, folded wherever they are: (text in them, why they are there).
# A compound statement whose header holds one folds its whole definition.
BENCHMARK = {
    "new_step()": "--compile's CUDA graphs",
    'set_stance("force_eager")': "--compile: evaluation runs eagerly",
}
PLACEHOLDERS = {"R": "0"}  # what a command's placeholder stands for when it is checked


# --- reading the code --------------------------------------------------------------------------


def read(path: Path) -> str:
    """A file's text (the tests stand in an edited one)."""
    return path.read_text()


@dataclass(frozen=True)
class Piece:
    """A top-level statement as a page shows it: its lines (with its decorators and the comment
    just above it), the number of its first line in the file, and its node."""

    lines: list[str]
    first: int
    node: ast.stmt

    def span(self, node: ast.AST, comments: bool = False) -> tuple[int, int]:
        """`node`'s lines as indices into `lines`, with the comment lines just above it."""
        start = node.lineno - self.first
        while comments and start > 0 and self.lines[start - 1].lstrip().startswith("#"):
            start -= 1
        return start, node.end_lineno - self.first


@dataclass(frozen=True)
class Source:
    """One file: its path from the root, its pieces by name, its docstring, its strategies."""

    path: str
    pieces: dict[str, Piece]
    doc: str
    strategies: tuple[str, ...]


def source(framework: str, module: str) -> Source:
    """<framework>_impl/<module>.py, parsed (never imported)."""
    path = f"{framework}_impl/{module}.py"
    text = read(ROOT / path)
    tree = ast.parse(text)
    lines = text.splitlines()
    pieces, strategies = {}, ()
    for node in tree.body:
        name = _name(node)
        if name:
            pieces[name] = _piece(lines, node)
        if name == "STRATEGIES":
            strategies = ast.literal_eval(node.value)
    after = tree.body[1:] if ast.get_docstring(tree) else tree.body
    imports = list(itertools.takewhile(lambda n: isinstance(n, ast.Import | ast.ImportFrom), after))
    if imports:  # the block the file begins with
        first, last = imports[0].lineno, imports[-1].end_lineno
        pieces[IMPORTS] = Piece(lines[first - 1 : last], first, tree)
    return Source(path, pieces, ast.get_docstring(tree) or "", strategies)


def _name(node: ast.stmt) -> str | None:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        return getattr(node.targets[0], "id", None)
    return None


def _piece(lines: list[str], node: ast.stmt) -> Piece:
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    while first > 1 and lines[first - 2].lstrip().startswith("#"):
        first -= 1
    return Piece(lines[first - 1 : node.end_lineno], first, node)


# --- what folds ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fold:
    """Lines `first` to `last` (indices into a piece's lines) shown as one mark: `kind` is
    "doc", "benchmark", "check" or "definition"; `what` says why (the benchmark's reason, the
    error a check raises) or, for a definition, its mark; `count`: the checks folded together."""

    first: int
    last: int
    kind: str
    what: str = ""
    count: int = 1

    @property
    def mark(self) -> str:
        if self.kind == "doc":
            return '"""⋯"""'
        if self.kind == "benchmark":
            return f"# ⋯ {self.what}"
        if self.kind == "check":
            some = "a check that raises" if self.count == 1 else f"{self.count} checks that raise"
            return f"# ⋯ {some} {self.what}"
        return self.what


def folds(piece: Piece, whole: bool) -> list[Fold]:
    """The folds of `piece`, outermost only, neighbouring checks as one: the whole definition
    (`whole`, or a benchmark-only compound statement in it), else its docstring, its
    benchmark-only statements and its error checks."""
    if isinstance(piece.node, ast.Module):  # the import block
        return []
    reason = _benchmark_header(piece)
    if whole or reason:
        return [Fold(0, len(piece.lines) - 1, "definition", _definition(piece, reason))]
    found = []
    if docstring(piece.node):
        found.append(Fold(*piece.span(piece.node.body[0]), "doc"))
    for node in ast.walk(piece.node):
        if isinstance(node, ast.stmt) and not hasattr(node, "body"):
            first, last = piece.span(node)
            text = "\n".join(piece.lines[first : last + 1])
            why = next((why for key, why in BENCHMARK.items() if key in text), None)
            if why:
                found.append(Fold(*piece.span(node, comments=True), "benchmark", why))
        elif _is_check(node):
            exc = node.body[0].exc
            what = ast.unparse(exc.func if isinstance(exc, ast.Call) else exc)
            found.append(Fold(*piece.span(node, comments=True), "check", what))
    return _outermost(found)


def docstring(node: ast.AST) -> str | None:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return ast.get_docstring(node)
    return None


def _benchmark_header(piece: Piece) -> str | None:
    """Why, when a compound statement's header (a `with`, `for`, `if` line) holds benchmark-only
    text: its body cannot fold apart from it, so the whole definition folds."""
    for node in ast.walk(piece.node):
        body = getattr(node, "body", None)
        if node is piece.node or not isinstance(node, ast.stmt) or not body:
            continue
        header = "\n".join(piece.lines[node.lineno - piece.first : body[0].lineno - piece.first])
        for key, why in BENCHMARK.items():
            if key in header:
                return why
    return None


def _is_check(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.If)
        and not node.orelse
        and len(node.body) == 1
        and isinstance(node.body[0], ast.Raise)
        and node.body[0].exc is not None
    )


def _definition(piece: Piece, reason: str | None) -> str:
    """The mark of a definition folded whole: its first line, shortened, and its size."""
    node = piece.node
    if isinstance(node, ast.ClassDef):
        bases = ", ".join(ast.unparse(b) for b in node.bases)
        head = f"class {node.name}({bases}): ⋯" if bases else f"class {node.name}: ⋯"
    elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        head = f"def {node.name}(…): ⋯"
    else:
        head = f"{_name(node)} = ⋯"
    size = f"{len(piece.lines)} lines" + (f", with {reason}" if reason else "")
    return f"{head}  # {size}"


def _outermost(found: list[Fold]) -> list[Fold]:
    kept: list[Fold] = []
    for fold in sorted(found, key=lambda f: (f.first, -f.last)):
        if kept and fold.first <= kept[-1].last:
            continue  # inside the one before
        before = kept[-1] if kept else None
        same_check = before and before.kind == fold.kind == "check" and before.what == fold.what
        if same_check and fold.first == before.last + 1:  # the same check again: one mark
            fold = Fold(before.first, fold.last, "check", fold.what, before.count + 1)
            kept.pop()
        kept.append(fold)
    return kept


# --- the prose: docstrings -----------------------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    """A paragraph of a docstring, or an entry of an indented list in it: `term`, the entry's
    first word (a strategy's name); `head`, the index of the line that introduces the list."""

    text: str
    head: int | None = None
    term: str = ""


def units(doc: str) -> list[Unit]:
    """A docstring's paragraphs; one that ends in an indented list (lines that begin an entry
    at the list's indentation, continued deeper) gives its leading lines, then each entry."""
    out: list[Unit] = []
    for para in re.split(r"\n\s*\n", inspect.cleandoc(doc)) if doc else []:
        lines = para.splitlines()
        lead = list(itertools.takewhile(lambda line: not line.startswith(" "), lines))
        indented = lines[len(lead) :]
        if any(not line.startswith(" ") for line in indented):
            indented = []  # not a list at its end: a paragraph as any other
        if not indented:
            out.append(Unit(flat(para)))
            continue
        head = None
        if lead:
            out.append(Unit(flat("\n".join(lead))))
            head = len(out) - 1
        step = min(len(line) - len(line.lstrip()) for line in indented)
        entries: list[list[str]] = []
        for line in indented:
            if len(line) - len(line.lstrip()) == step:
                entries.append([])
            entries[-1].append(line)
        out += [Unit(flat("\n".join(e)), head, e[0].split()[0]) for e in entries]
    return out


def flat(text: str) -> str:
    return " ".join(text.split())


def mentions(unit: Unit, names: list[str]) -> bool:
    """Whether `unit` names one of `names` in backquotes (`ddp`), or is an entry for one."""
    return unit.term in names or any(re.search(f"`{re.escape(n)}[`(]", unit.text) for n in names)


# --- a row's cell in one framework, the commands it ends with ------------------------------------


@dataclass(frozen=True)
class Cell:
    """One framework's part of a row: the files it shows, its prose (paragraphs, and
    (name, docstring) pairs), its pieces with their folds, its commands."""

    files: list[str]
    prose: list[Unit | tuple[str, str]]
    pieces: list[tuple[Piece, list[Fold]]]
    commands: list[str]


def paragraphs(part: Unit | tuple[str, str]) -> list[str]:
    """A prose part as paragraphs of text: a unit as it is, a docstring with its name first."""
    if isinstance(part, Unit):
        return [part.text]
    name, doc = part
    paras = [flat(p) for p in re.split(r"\n\s*\n", doc)]
    return [f"`{name}`: {paras[0]}", *paras[1:]]


def indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def command(workload: str, framework: str, tail: str, main: Source) -> str:
    """`python -m <framework>_impl --workload W <tail>`, checked: common/cli.py's parser takes it,
    its strategy is one of the file's, and its node options are a valid set."""
    from common import checks, cli, config  # framework-free: common imports no framework

    line = f"python -m {framework}_impl --workload {workload} {tail}"
    argv = [PLACEHOLDERS.get(a, a) for a in shlex.split(line, comments=True)[3:]]
    wrong = f"error: tools/lessons.py's command `{line}`"
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):  # argparse's own line, said in this one
            args = cli.parser(framework).parse_args(argv)
        checks.check_nodes(framework, args)
    except (SystemExit, config.ConfigError) as e:
        why = said.getvalue().strip().splitlines()[-1:] or [str(e)]
        raise SystemExit(f"{wrong} is refused ({why[0]}); fix ROWS") from None
    if args.strategy is not None and args.strategy not in main.strategies:
        raise SystemExit(f"{wrong}: {main.path} has no strategy {args.strategy}; fix ROWS")
    return line


def test_command(workload: str, framework: str, name: str) -> str:
    """The command that runs the framework's tests of `workload` whose names hold `name`,
    checked: there is one."""
    path = f"tests/{framework}_impl/test_{workload}.py"
    file = ROOT / path
    if not file.is_file() or f"def test_{name}" not in read(file):
        raise SystemExit(f"error: {path} has no test_{name}; fix ROWS in tools/lessons.py")
    return f".venv/{framework}/bin/python -m pytest -q {path} -k {name}"
