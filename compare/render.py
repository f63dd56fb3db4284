"""A report as a list of blocks, written as Markdown, as one self-contained HTML page (jinja2,
autoescaped, images inline) or as terminal text (tabulate), and put in place whole or not at all.
Text may quote records, which anyone can edit: Markdown escapes what would be markup outside the
report's own `code` spans, HTML escapes everything, the terminal gets no control characters."""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import markupsafe
from tabulate import DataRow, TableFormat, tabulate

from common import processes
from compare.tables import Table

# A code span of the report's own (`make compare`): Markdown shows it as it is, so it is left so.
CODE_SPAN = re.compile(r"`[^`\x00-\x1f\x7f\u2028\u2029]+`")
# Outside code spans what could start markup (HTML, a link, an escape, a code span, an entity,
# math) is escaped, and control characters become spaces, so no text starts a block of its own.
# (`>` ends a tag `<` can no longer open, and quotes only at a line's start.)
MARKUP = str.maketrans(
    {"\\": "\\\\", "`": "\\`", "[": "\\[", "]": "\\]", "$": "\\$", "<": "&lt;", "&": "&amp;"}
)
CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")
# GitHub's pipe tables as the README has them: no padding, `---` under every header.
ROW = DataRow("| ", " | ", " |")
MARKDOWN = TableFormat(
    None, lambda widths, _: "|---" * len(widths) + "|", None, None, ROW, ROW, 0, None
)
PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8">
<title>{{ title }}</title>
<style>
body{font-family:sans-serif;max-width:1400px;margin:2em auto;padding:0 1em}
table{border-collapse:collapse;font-size:90%;margin:1em 0}
td,th{border:1px solid #bbb;padding:3px 6px;text-align:right}
td:first-child,th:first-child{text-align:left}img{max-width:100%}
figcaption{font-style:italic}code{background:#f3f3f3}
</style></head><body>
{% for b in blocks %}
{% if b[0] == "heading" %}
<h{{ b[1] }}>{{ b[2]|inline }}</h{{ b[1] }}>
{% elif b[0] == "para" %}
<p>{{ b[1]|inline }}</p>
{% elif b[0] == "items" %}
<ul>{% for item in b[1] %}<li>{{ item|inline }}</li>{% endfor %}</ul>
{% elif b[0] == "table" %}
<table><thead><tr>{% for h in b[1].headers %}<th>{{ h }}</th>{% endfor %}</tr></thead><tbody>
{% for row in b[1].rows %}<tr>{% for c in row %}<td>{{ c }}</td>{% endfor %}</tr>{% endfor %}
</tbody></table>{% for note in b[1].notes %}<p><small>{{ note|inline }}</small></p>{% endfor %}

{% else %}
<figure><img alt="{{ b[2] }}" src="data:image/png;base64,{{ b[1]|base64 }}">
<figcaption>{{ b[2]|inline }}</figcaption></figure>
{% endif %}
{% endfor %}
</body></html>
"""


def inline(text: str) -> markupsafe.Markup:
    """Markdown `code` and **bold** as HTML, everything else escaped."""
    text = str(markupsafe.escape(text))
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return markupsafe.Markup(re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", text))


HTML = jinja2.Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True)
HTML.filters |= {"inline": inline, "base64": lambda p: base64.b64encode(p.read_bytes()).decode()}


@dataclass
class Doc:
    blocks: list[tuple] = field(default_factory=list)

    def heading(self, level: int, text: str) -> None:
        self.blocks.append(("heading", level, text))

    def para(self, text: str) -> None:
        self.blocks.append(("para", text))

    def items(self, items: list[str]) -> None:
        if items:
            self.blocks.append(("items", list(items)))

    def table(self, table: Table) -> None:
        self.blocks.append(("table", table))

    def image(self, path: Path, caption: str) -> None:
        self.blocks.append(("image", Path(path), caption))

    def markdown(self, base: Path) -> str:
        out = []
        for kind, *a in self.blocks:
            if kind == "heading":
                out.append("#" * a[0] + " " + escape(a[1]))
            elif kind == "para":
                out.append(escape(a[0]))
            elif kind == "items":
                out.append("\n".join(f"- {escape(item)}" for item in a[0]))
            elif kind == "table":
                out.append(markdown_table(a[0]))
            else:
                caption = escape(a[1])
                out.append(f"![{caption}]({relative(a[0], base)})\n\n*{caption}*")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        return HTML.from_string(PAGE).render(title=title, blocks=self.blocks)


def relative(path: Path, base: Path) -> str:
    try:
        return path.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def escape(text: str) -> str:
    """`text` as Markdown shows it literally: escaped outside its `code` spans."""
    out, at = [], 0
    for span in CODE_SPAN.finditer(text):
        out += [CONTROL.sub(" ", text[at : span.start()]).translate(MARKUP), span.group()]
        at = span.end()
    return "".join([*out, CONTROL.sub(" ", text[at:]).translate(MARKUP)])


def plain(text: str) -> str:
    """`text` for the terminal: control characters (escape sequences, line breaks) as spaces."""
    return CONTROL.sub(" ", str(text))


def markdown_table(t: Table, notes: bool = True) -> str:
    cells = [[escape(str(c)).replace("|", "\\|") for c in row] for row in [t.headers, *t.rows]]
    text = tabulate(cells[1:], cells[0], tablefmt=MARKDOWN, disable_numparse=True, stralign=None)
    return text + (f"\n\n{quoted(t.notes)}" if notes and t.notes else "")


def quoted(notes: list[str]) -> str:
    """Notes as quoted lines; a leading "* " (the extrapolated mark) is escaped, not a list."""
    notes = ("\\" + n if n.startswith("* ") else n for n in map(escape, notes))
    return "\n".join(f"> {note}  " for note in notes)


def text_table(t: Table) -> str:
    rows = [[plain(c) for c in row] for row in t.rows]
    text = tabulate(rows, [plain(h) for h in t.headers], disable_numparse=True)
    return "\n".join(line.rstrip() for line in text.splitlines())


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A new folder in `out` to write the report into; its files are moved over the previous
    report's once all are written. On any failure it is removed and the previous report stays."""
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    for stage in out.glob(".report-*"):  # of reports killed outright (SIGKILL), once gone
        pid = stage.name.split("-")[1]
        if stage.is_dir() and not (pid.isdigit() and processes.alive(int(pid))):
            shutil.rmtree(stage, ignore_errors=True)
    try:
        stage = Path(tempfile.mkdtemp(dir=out, prefix=f".report-{os.getpid()}-"))
        try:
            yield stage
            publish(stage, out)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    finally:
        if made:  # removed only while empty: when nothing was published into it
            with contextlib.suppress(OSError):
                out.rmdir()


def publish(stage: Path, out: Path) -> None:
    """Move every file of `stage` to `out` (a rename needs no space): report.html and then
    report.md last, so that a report never names a plot not yet in place."""
    files = sorted(
        (p for p in stage.rglob("*") if p.is_file()),
        key=lambda p: (p.name == "report.md", p.name == "report.html", str(p)),
    )
    for path in files:
        target = out / path.relative_to(stage)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)


def write(doc: Doc, out: Path, html_title: str | None = None) -> list[Path]:
    """report.md in `out`, and with `html_title` report.html; the paths written."""
    (out / "report.md").write_text(doc.markdown(out), encoding="utf-8")
    if html_title is None:
        return [out / "report.md"]
    (out / "report.html").write_text(doc.html(html_title), encoding="utf-8")
    return [out / "report.md", out / "report.html"]


@contextmanager
def literal_plot_text() -> Iterator[None]:
    """matplotlib draws every text as written: a `$` in a record's name would start mathtext,
    whose parser fails on what is not TeX (`$\\foo$`)."""
    import matplotlib

    with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
        yield


def check_out(out: Path) -> None:
    """Refuse an output folder the report could not be written into (raises OSError)."""
    parent = next((p for p in out.parents if p.exists()), Path("."))
    problem = None
    if out.exists() and not out.is_dir():
        problem = "is not a folder"
    elif out.exists() and not os.access(out, os.W_OK | os.X_OK):
        problem = "is not writable"
    elif (out / "report.md").exists() and not os.access(out / "report.md", os.W_OK):
        problem = "holds a report.md that is not writable"
    elif not out.exists() and not parent.is_dir():
        problem = f"cannot be created: {parent} is not a folder"
    elif not out.exists() and not os.access(parent, os.W_OK | os.X_OK):
        problem = f"cannot be created: {parent} is not writable"
    if problem:
        raise OSError(f"{out} {problem}; choose another --out (REPORTS=)")


def unchanged(out: Path | None) -> str:
    """Said when a report is refused: the previous one in `out` is left as it was."""
    md = out / "report.md" if out is not None else None
    return f"; {md} left as it was" if md is not None and md.exists() else ""


def not_written(out: Path, e: OSError) -> str:
    """One line: why the report could not be written, what was kept, and what to do."""
    kept, why = unchanged(out), e.strerror or e
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"no space left on device writing the report into {out}{kept}; free space and run again"
        )
    return f"cannot write the report into {out} ({why}){kept}; choose another --out (REPORTS=)"
