"""tools/lessons.py's pages as text: Markdown (GitHub renders it) and HTML (highlighted with
pygments, its code wrapped with a hanging indent so that three columns fit 1366 px, its folds
<details>), and headless chromium, which tests/common/test_lessons_browser.py and the screenshot
drive."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
from html import escape

import pygments
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer
from pygments.token import STANDARD_TYPES, Text

from tools.lessons_code import Cell, Fold, Piece, indent, paragraphs

WINDOW = (1366, 900)  # a common laptop screen, the width the pages are made to fit


# --- Markdown ------------------------------------------------------------------------------------


def markdown(title: str, intro: str, rows: list) -> str:
    """A page in Markdown: one table per row, a column per framework (GitHub renders the prose
    and the fenced code inside the table's cells). `rows`: (Row, {framework: Cell})."""
    out = [f"# {title}", "", intro, ""]
    for row, row_cells in rows:
        out += [f"## {row.concept}", "", f"{row.what}.", "", "<table><tr>"]
        out += [f"<th>{', '.join(cell.files)}</th>" for cell in row_cells.values()]
        out.append("</tr><tr>")
        for cell in row_cells.values():
            out += ['<td valign="top">', "", *_md_cell(cell), "</td>"]
        out += ["</tr></table>", ""]
    return "\n".join(out)


def _md_cell(cell: Cell) -> list[str]:
    out = []
    for part in cell.prose:
        for para in paragraphs(part):
            out += [_md_text(para), ""]
    code = []
    for piece, piece_folds in cell.pieces:
        if code:
            code += ["", ""]
        code += _md_code(piece, piece_folds)
    out += ["```python", *code, "```", ""]
    for command in cell.commands:
        out += [f"run: `{command}`", ""]
    return out


def _md_text(text: str) -> str:
    """Docstring text as Markdown: outside `code`, `<` is not a tag and `*` not emphasis."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(
        p if p.startswith("`") else p.replace("<", "&lt;").replace("*", r"\*") for p in parts
    )


def _md_code(piece: Piece, piece_folds: list[Fold]) -> list[str]:
    out, i = [], 0
    for fold in piece_folds:
        out += piece.lines[i : fold.first]
        out.append(indent(piece.lines[fold.first]) + fold.mark)
        i = fold.last + 1
    return out + piece.lines[i:]


# --- HTML ----------------------------------------------------------------------------------------

MONO = "ui-monospace,SFMono-Regular,Menlo,Consolas,'DejaVu Sans Mono',monospace"
# Three columns of wrapped code: each line a block whose wrapped parts hang 4ch in from its own
# indentation (padding minus a negative text-indent), so nothing scrolls sideways at 1366 px.
STYLE = f"""
body{{font:15px/1.45 system-ui,sans-serif;margin:0 1.2em 3em;color:#1f2328}}
h1{{font-size:1.5em;margin:.6em 0 .3em}}
h2{{font-size:1.2em;margin:1.8em 0 .2em;border-bottom:1px solid #d0d7de}}
h3{{font:600 12.5px {MONO};color:#57606a;margin:.2em 0;overflow-wrap:anywhere}}
nav{{margin:.3em 0;font-size:14px}}
nav a{{margin-right:.7em}}
input[name=view]{{display:none}}
label{{cursor:pointer;padding:0 .5em;border:1px solid #d0d7de;border-radius:4px;margin-left:.3em}}
.what{{margin:.1em 0 .6em;color:#57606a}}
.row{{display:grid;grid-template-columns:repeat(3,minmax(0,1fr));gap:1.1em}}
.col{{min-width:0}}
.prose{{font-size:13.5px}}
.prose p{{margin:.35em 0}}
code{{font-family:{MONO};overflow-wrap:anywhere}}
.prose code,.run code{{background:#eff1f3;border-radius:3px;padding:0 .2em;font-size:90%}}
.code{{background:#f6f8fa;border-radius:6px;padding:.5em .6em;margin:.6em 0;
  font:12px/1.4 {MONO}}}
.code pre{{margin:0;font:inherit;white-space:pre-wrap;overflow-wrap:anywhere}}
.l{{display:block;--h:calc(var(--i,0)*1ch + 4ch);padding-left:var(--h);
  text-indent:calc(-1*var(--h))}}
.code summary{{color:#6e7781;cursor:pointer;list-style:none;white-space:pre-wrap}}
.code summary::-webkit-details-marker{{display:none}}
.code summary::after{{content:" \\25B8"}}
.code details[open]>summary::after{{content:" \\25BE"}}
.run{{font-size:13px;margin:.2em 0}}
.run span{{white-space:nowrap}}
@media (max-width:900px){{.row{{grid-template-columns:minmax(0,1fr)}}}}
"""
CHOSEN = "background:#ddf4ff;border-color:#54aeff"  # the view shown
HIGHLIGHT = "default"  # pygments' style


def html(title: str, intro: str, rows: list) -> str:
    """A page as one HTML file: the columns in a grid, the code highlighted, folds as <details>;
    one framework at a time by the radio buttons at the top (CSS only, no script)."""
    frameworks = list(rows[0][1]) if rows else []
    views = ["all", *frameworks]
    radios = "".join(
        f'<input type="radio" name="view" id="v-{v}"{" checked" if v == "all" else ""}>'
        for v in views
    )
    labels = "".join(
        f'<label for="v-{v}">{"side by side" if v == "all" else v}</label>' for v in views
    )
    toc = " ".join(f'<a href="#{slug(row.concept)}">{escape(row.concept)}</a>' for row, _ in rows)
    out = [
        "<!DOCTYPE html>",
        f'<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<style>{STYLE}{_views_style(frameworks)}{_pygments_style()}</style></head><body>",
        radios,
        f"<header><h1>{escape(title)}</h1>",
        f"<p>{intro}</p>",
        f"<nav>Show:{labels}</nav><nav>Rows: {toc}</nav></header><main>",
    ]
    for row, row_cells in rows:
        out.append(f'<section id="{slug(row.concept)}"><h2>{escape(row.concept)}</h2>')
        out.append(f'<p class="what">{escape(row.what)}.</p><div class="row">')
        out += [_html_cell(f, cell) for f, cell in row_cells.items()]
        out.append("</div></section>")
    out.append("</main></body></html>")
    return "\n".join(out) + "\n"


def _views_style(frameworks: list[str]) -> str:
    """One framework at a time: its radio button checked, the other columns hidden."""
    rules = []
    for f in frameworks:
        on = f"#v-{f}:checked~"
        rules.append(f"{on}main .col:not(.{f}){{display:none}}")
        rules.append(f"{on}main .row{{grid-template-columns:minmax(0,1fr)}}")
    for v in ("all", *frameworks):
        rules.append(f"#v-{v}:checked~header label[for=v-{v}]{{{CHOSEN}}}")
    return "\n".join(rules) + "\n"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _html_cell(framework: str, cell: Cell) -> str:
    prose = "".join(f"<p>{_html_text(p)}</p>" for part in cell.prose for p in paragraphs(part))
    code = []
    for k, (piece, piece_folds) in enumerate(cell.pieces):
        if k:
            code.append(_pre(["", ""], ["", ""]))
        code.append(_html_code(piece, piece_folds))
    runs = "".join(f'<p class="run">run: <code>{_words(c)}</code></p>' for c in cell.commands)
    files = escape(", ".join(cell.files))
    return (
        f'<div class="col {framework}"><h3>{files}</h3><div class="prose">{prose}</div>'
        f'<div class="code">{"".join(code)}</div>{runs}</div>'
    )


def _words(command: str) -> str:
    """A command whose lines break between its words only (never after an option's `--`)."""
    return " ".join(f"<span>{escape(w)}</span>" for w in command.split(" ") if w)


def _html_text(text: str) -> str:
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(
        f"<code>{escape(p[1:-1])}</code>" if p.startswith("`") else escape(p) for p in parts
    )


def _html_code(piece: Piece, piece_folds: list[Fold]) -> str:
    lit = highlight(piece.lines)
    out, i = [], 0
    for fold in piece_folds:
        start, end = fold.first, fold.last + 1
        out.append(_pre(lit[i:start], piece.lines[i:start]))
        mark = escape(indent(piece.lines[start]) + fold.mark)
        summary = _line(mark, piece.lines[start], "summary")
        body = _pre(lit[start:end], piece.lines[start:end])
        out.append(f"<details>{summary}{body}</details>")
        i = end
    out.append(_pre(lit[i:], piece.lines[i:]))
    return "".join(out)


def _pre(lit: list[str], raw: list[str]) -> str:
    if not lit:
        return ""
    return (
        "<pre><code>"
        + "".join(_line(h, r) for h, r in zip(lit, raw, strict=True))
        + "</code></pre>"
    )


def _line(lit: str, raw: str, tag: str = "span") -> str:
    """A line as a block whose wrapped parts hang in from `raw`'s indentation (STYLE's .l)."""
    return f'<{tag} class="l" style="--i:{len(indent(raw))}">{lit or " "}</{tag}>'


def highlight(lines: list[str]) -> list[str]:
    """Each line as highlighted HTML: pygments' Python tokens as spans of its short classes
    (a token that spans lines, a docstring, is cut at each line's end)."""
    out, line = [], []
    lexer = PythonLexer(stripnl=False, ensurenl=True)
    for token, value in pygments.lex("\n".join(lines), lexer):
        cls = _token_class(token)
        for k, part in enumerate(value.split("\n")):
            if k:
                out.append("".join(line))
                line = []
            if part:
                text = escape(part, quote=False)
                line.append(f'<span class="{cls}">{text}</span>' if cls else text)
    out.append("".join(line))
    return (out + [""] * len(lines))[: len(lines)]


def _token_class(token) -> str:
    """pygments' short CSS class of `token`; "" for white space and where the style gives it
    no rule (plain names)."""
    while token not in STANDARD_TYPES:
        token = token.parent
    cls = STANDARD_TYPES[token]
    return cls if cls in _styled() and token not in Text else ""


def _pygments_style() -> str:
    rules = HtmlFormatter(style=HIGHLIGHT).get_token_style_defs(".code")
    return "\n".join(re.sub(r"\s*/\*.*?\*/", "", r) for r in rules)


@functools.cache
def _styled() -> frozenset[str]:
    """The token classes that HIGHLIGHT colours: the others need no span."""
    return frozenset(re.findall(r"^\.code \.(\w+) ", _pygments_style(), re.M))


# --- the browser ---------------------------------------------------------------------------------


def chromium(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Debian's chromium, headless, in a profile of its own (another may be running)."""
    binary = shutil.which("chromium")
    if binary is None:
        raise FileNotFoundError("chromium")
    with tempfile.TemporaryDirectory() as profile:
        flags = ["--headless", "--disable-gpu", "--no-sandbox", "--no-first-run"]
        flags += [f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}"]
        return subprocess.run(
            [binary, *flags, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
