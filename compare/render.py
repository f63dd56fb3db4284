"""A report as a list of blocks, written out as Markdown, or as one self-contained HTML page
(images embedded as base64), or as plain text for the terminal.

Text may quote records (CPU names, strategies, file names), which anyone can edit: Markdown
escapes what would make them markup (raw HTML, links, line breaks that start new blocks) outside
the report's own `code` spans, HTML escapes everything, and the terminal gets no control
characters."""

from __future__ import annotations

import base64
import contextlib
import errno
import html
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from common import processes
from compare.tables import Table


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
        for block in self.blocks:
            kind = block[0]
            if kind == "heading":
                out.append("#" * block[1] + " " + escape(block[2]))
            elif kind == "para":
                out.append(escape(block[1]))
            elif kind == "items":
                out.append("\n".join(f"- {escape(item)}" for item in block[1]))
            elif kind == "table":
                out.append(markdown_table(block[1]))
            elif kind == "image":
                rel, caption = relative(block[1], base), escape(block[2])
                out.append(f"![{caption}]({rel})\n\n*{caption}*")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        out = [
            "<!DOCTYPE html>",
            '<html><head><meta charset="utf-8">',
            f"<title>{html.escape(title)}</title>",
            f"<style>{STYLE}</style></head><body>",
        ]
        for block in self.blocks:
            kind = block[0]
            if kind == "heading":
                out.append(f"<h{block[1]}>{inline(block[2])}</h{block[1]}>")
            elif kind == "para":
                out.append(f"<p>{inline(block[1])}</p>")
            elif kind == "items":
                out.append("<ul>" + "".join(f"<li>{inline(i)}</li>" for i in block[1]) + "</ul>")
            elif kind == "table":
                out.append(html_table(block[1]))
            elif kind == "image":
                data = base64.b64encode(block[1].read_bytes()).decode("ascii")
                out.append(
                    f'<figure><img alt="{html.escape(block[2])}" '
                    f'src="data:image/png;base64,{data}">'
                    f"<figcaption>{inline(block[2])}</figcaption></figure>"
                )
        out.append("</body></html>")
        return "\n".join(out) + "\n"


STYLE = (
    "body{font-family:sans-serif;max-width:1400px;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse;font-size:90%;margin:1em 0}"
    "td,th{border:1px solid #bbb;padding:3px 6px;text-align:right}"
    "td:first-child,th:first-child{text-align:left}img{max-width:100%}"
    "figcaption{font-style:italic}code{background:#f3f3f3}"
)


def relative(path: Path, base: Path) -> str:
    try:
        return path.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


# A code span of the report's own (`make compare`): Markdown shows it as it is, so it is left so.
CODE_SPAN = re.compile(r"`[^`\x00-\x1f\x7f\u2028\u2029]+`")
# Outside code spans: what could start markup (HTML, a link or image, an escape, a code span,
# an entity, GitHub's math) gets a backslash or becomes an entity; line breaks and other control
# characters become spaces, so no text can start a block (a heading, a list) of its own. (`>`
# ends a tag that `<` can no longer open, and quotes only at a line's start.)
MARKUP = {"\\": "\\\\", "`": "\\`", "[": "\\[", "]": "\\]", "$": "\\$"}
MARKUP |= {"<": "&lt;", "&": "&amp;"}
CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


def escape(text: str) -> str:
    """`text` as Markdown shows it literally: escaped outside its `code` spans, which Markdown
    shows literally anyway."""
    out, at = [], 0
    for span in CODE_SPAN.finditer(text):
        out += [_escape_plain(text[at : span.start()]), span.group()]
        at = span.end()
    return "".join([*out, _escape_plain(text[at:])])


def _escape_plain(text: str) -> str:
    text = CONTROL.sub(" ", text)
    return "".join(MARKUP.get(c, c) for c in text)


def plain(text: str) -> str:
    """`text` for the terminal: control characters (escape sequences, line breaks) as spaces."""
    return CONTROL.sub(" ", str(text))


def _cell(text: str) -> str:
    return escape(str(text)).replace("|", "\\|")


def markdown_table(t: Table) -> str:
    lines = [
        "| " + " | ".join(map(_cell, t.headers)) + " |",
        "|" + "|".join("---" for _ in t.headers) + "|",
    ]
    lines += ["| " + " | ".join(map(_cell, row)) + " |" for row in t.rows]
    text = "\n".join(lines)
    if t.notes:
        # a note opening with "* " (the extrapolated mark) would be a list item: escape it
        notes = ("\\" + n if n.startswith("* ") else n for n in map(escape, t.notes))
        text += "\n\n" + "\n".join(f"> {note}  " for note in notes)
    return text


def html_table(t: Table) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in t.headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in t.rows
    )
    notes = "".join(f"<p><small>{inline(n)}</small></p>" for n in t.notes)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes}"


def inline(text: str) -> str:
    """Markdown `code` and **bold** as HTML; everything else escaped."""
    text = html.escape(text)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", text)


def text_table(t: Table) -> str:
    """A plain aligned table for the terminal."""
    headers, rows = list(map(plain, t.headers)), [list(map(plain, row)) for row in t.rows]
    widths = [max(len(x) for x in col) for col in zip(headers, *rows, strict=False)]
    lines = ["  ".join(x.ljust(w) for x, w in zip(headers, widths, strict=False))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(x.ljust(w) for x, w in zip(row, widths, strict=False)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A new folder in `out` to write the report into; once the body has written it all, its
    files are moved over the previous report's, report.md last. On any failure it is removed
    and the previous report stays as it was."""
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_stages(out)
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


def remove_stale_stages(out: Path) -> None:
    """The stages of reports killed outright (SIGKILL), whose `finally` never ran: each names
    its process, and is removed once that process is gone."""
    for stage in out.glob(".report-*"):
        pid = stage.name.split("-")[1]
        if stage.is_dir() and not (pid.isdigit() and processes.alive(int(pid))):
            shutil.rmtree(stage, ignore_errors=True)


def publish(stage: Path, out: Path) -> None:
    """Move every file of `stage` to the same place in `out`: the plots, then report.html, then
    report.md, so that a report never names a plot not yet in place. A rename needs no space."""
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
    md = out / "report.md"
    md.write_text(doc.markdown(out), encoding="utf-8")
    written = [md]
    if html_title is not None:
        page = out / "report.html"
        page.write_text(doc.html(html_title), encoding="utf-8")
        written.append(page)
    return written


@contextmanager
def literal_plot_text() -> Iterator[None]:
    """matplotlib draws every text as written: a `$` in a record's name (a CPU's, a strategy's)
    would otherwise start mathtext, whose parser fails on what is not TeX (`$\\foo$`)."""
    import matplotlib

    with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
        yield


# --- the report's folder: whether it can be written, and what a failure left there ----------


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
    """Said when a report is refused: the previous one in `out` was not overwritten."""
    md = out / "report.md" if out is not None else None
    return f"; {md} left as it was" if md is not None and md.exists() else ""


def not_written(out: Path, e: OSError) -> str:
    """One line: why the report could not be written, what was kept, and what to do."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"no space left on device writing the report into {out}{unchanged(out)}; "
            "free space and run again"
        )
    return (
        f"cannot write the report into {out} ({e.strerror or e}){unchanged(out)}; "
        "choose another --out (REPORTS=)"
    )
