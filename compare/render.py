"""A report as a list of blocks, written out as Markdown, or as one self-contained HTML page
(images embedded as base64), or as plain text for the terminal."""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path

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
                out.append("#" * block[1] + " " + block[2])
            elif kind == "para":
                out.append(block[1])
            elif kind == "items":
                out.append("\n".join(f"- {item}" for item in block[1]))
            elif kind == "table":
                out.append(markdown_table(block[1]))
            elif kind == "image":
                rel = relative(block[1], base)
                out.append(f"![{block[2]}]({rel})\n\n*{block[2]}*")
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


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(t: Table) -> str:
    lines = [
        "| " + " | ".join(map(_cell, t.headers)) + " |",
        "|" + "|".join("---" for _ in t.headers) + "|",
    ]
    lines += ["| " + " | ".join(map(_cell, row)) + " |" for row in t.rows]
    text = "\n".join(lines)
    if t.notes:
        # a note opening with "* " (the extrapolated mark) would be a list item: escape it
        notes = ("\\" + n if n.startswith("* ") else n for n in t.notes)
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
    widths = [max(len(str(x)) for x in col) for col in zip(t.headers, *t.rows, strict=False)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(t.headers, widths, strict=False))]
    lines.append("  ".join("-" * w for w in widths))
    lines += [
        "  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=False)) for row in t.rows
    ]
    return "\n".join(line.rstrip() for line in lines)
