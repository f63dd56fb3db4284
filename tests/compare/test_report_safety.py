"""compare.report with records anyone could have edited and with a disk that fills up: what a
record says reaches report.md as text, never as markup; matplotlib draws it as written; and a
report that cannot be written whole leaves the previous one as it was."""

import errno
import importlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from common import results, signals
from compare import render, report
from tests.compare import fixture_records

EVIL_CPU = "AMD\n# Injected heading\n[click](javascript:alert(1)) <img src=x onerror=alert(1)>"


def write_records(path, **changes) -> None:
    """Two lenet runs (1 and 2 devices) of one machine, with `changes` made to both."""
    for devices, median in ((1, 10.0), (2, 6.0)):
        rec = fixture_records.lenet("torch", devices, median, 0.5, 0.8, 100.0)
        results.append(results.Record(**{**rec.to_dict(), **changes}), path)


def test_record_text_reaches_the_markdown_as_text_not_markup(tmp_path):
    path = tmp_path / "r.jsonl"
    hardware = {**fixture_records.HARDWARE, "cpu": EVIL_CPU}
    write_records(path, hardware=hardware, strategy="scratch<script>alert(1)</script>")
    out = tmp_path / "out"
    assert report.build([str(path)], out, write_html=True, echo=lambda *_: None) == 0
    md = (out / "report.md").read_text()
    assert not re.search(r"^#+ Injected", md, re.M)  # no heading of its own
    assert "<img" not in md and "<script" not in md  # no raw HTML
    assert not re.search(r"(?<!\\)\]\(javascript:", md)  # no link
    assert "AMD # Injected heading \\[click\\](javascript:alert(1)) &lt;img src=x" in md
    page = (out / "report.html").read_text()
    assert "<img src=x" not in page and "<script>alert" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_unprintable_record_text_is_drawn_and_written_printable(tmp_path):
    """Valid JSON can hold a lone surrogate, which no font draws (matplotlib's FT2Font raised),
    and NUL or ESC, which no page should carry: as the records are read, a surrogate becomes
    `?` and a control character a space."""
    path = tmp_path / "r.jsonl"
    hardware = {**fixture_records.HARDWARE, "cpu": "CPU \ud800\x00\x1b[2J"}
    pinned = {"cores_per_device": 1, "execution": "processes"}  # the scaling plot is drawn too
    for devices, median in ((1, 10.0), (2, 6.0)):
        rec = fixture_records.lenet("torch", devices, median, 0.5, 0.8, 100.0).to_dict()
        rec |= {"hardware": hardware, "strategy": "scratch\x1b]0;x\x07", "extra": pinned}
        with path.open("a") as f:
            f.write(json.dumps(rec) + "\n")  # ASCII JSON: `\ud800` as the escape JSON allows
    out = tmp_path / "out"
    assert report.build([str(path)], out, write_html=True, echo=lambda *_: None) == 0
    for name in ("report.md", "report.html"):
        text = (out / name).read_text()
        assert not re.search(r"[\x00\x1b\x07]", text), name
        assert "CPU ?  " in text, name
    assert len(list(out.rglob("*.png"))) == 3


def test_a_stage_left_by_a_killed_report_is_removed_by_the_next(tmp_path):
    path, out = tmp_path / "r.jsonl", tmp_path / "out"
    write_records(path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = [out / f".report-{dead.pid}-x1", out / ".report-old", out / f".report-{os.getpid()}-y"]
    for stage in left:
        (stage / "plots").mkdir(parents=True)
    assert report.build([str(path)], out, echo=lambda *_: None) == 0
    assert [s.exists() for s in left] == [False, False, True]  # the running one is kept


def test_escape_leaves_the_reports_own_text_alone():
    text = "10.0 ± 0.5 s* (n=3), split 6 †, ddp+bf16+compiled, 1.00x; `make compare` **bold**"
    assert render.escape(text) == text
    assert render.escape("`<framework>` <b>") == "`<framework>` &lt;b>"  # a code span is kept
    assert render.escape("a\r\nb\u2028c") == "a  b c"
    assert render.plain("a\x1b[2Jb\nc") == "a [2Jb c"  # no escape sequence reaches a terminal


def test_a_dollar_sign_in_a_record_is_drawn_as_written(tmp_path):
    """matplotlib would read `$\\foo$` as mathtext, fail to parse it, and end the report."""
    path = tmp_path / "r.jsonl"
    hardware = {**fixture_records.HARDWARE, "cpu": r"CPU $\foo$"}
    # each device on its own core, so the scaling plot, whose legend names the strategy, is drawn
    pinned = {"cores_per_device": 1, "execution": "processes"}
    write_records(path, hardware=hardware, strategy=r"$\bar$", extra=pinned)
    lines = []
    assert report.build([str(path)], tmp_path / "out", echo=lines.append) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert r"CPU \$\\foo\$" in md
    assert len(re.findall(r"\]\(([^)]+\.png)\)", md)) == 3  # sec/epoch, scaling, accuracy


@pytest.fixture
def previous(tmp_path):
    """A report already in tmp_path/out, with its html and plots: {relative path: bytes}."""
    path = tmp_path / "r.jsonl"
    write_records(path)
    out = tmp_path / "out"
    assert report.build([str(path)], out, write_html=True, echo=lambda *_: None) == 0
    results.append(fixture_records.lenet("jax", 1, 4.0, 0.2, 0.8, 100.0), path)  # new content
    return path, out, snapshot(out)


def snapshot(out) -> dict:
    return {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def fail_at(monkeypatch, target, name, error, after: int = 0) -> None:
    """`target.name` raises `error` from its call number `after` + 1 on."""
    original, calls = getattr(target, name), []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) > after:
            raise error
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, failing)


FULL = OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize(
    "target, name, after",
    [(render.Doc, "html", 0), (render.Doc, "markdown", 0), (Figure, "savefig", 1)],
    ids=["writing report.html", "writing report.md", "drawing the second plot"],
)
def test_a_full_disk_leaves_the_previous_report_whole(
    previous, monkeypatch, capsys, target, name, after
):
    path, out, before = previous
    fail_at(monkeypatch, target, name, FULL, after)
    code = report.main(["--results", str(path), "--out", str(out), "--html"])
    err = capsys.readouterr().err
    assert code == report.EXIT_BAD_INPUT and len(err.strip().splitlines()) == 1
    assert err.strip() == (
        f"error: no space left on device writing the report into {out}; {out / 'report.md'} "
        "left as it was; free space and run again"
    )
    assert snapshot(out) == before  # every file as it was, and nothing half-written beside


def test_a_ctrl_c_while_writing_leaves_the_previous_report_whole(previous, monkeypatch):
    path, out, before = previous
    fail_at(monkeypatch, render.Doc, "html", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        report.build([str(path)], out, write_html=True, echo=lambda *_: None)
    assert snapshot(out) == before


def test_a_report_written_whole_replaces_the_previous_one(previous):
    path, out, before = previous
    assert report.build([str(path)], out, write_html=True, echo=lambda *_: None) == 0
    after = snapshot(out)
    assert after.keys() == before.keys()  # the same files, nothing left over beside them
    assert b"| jax | scratch |" in after["report.md"] and b"| jax |" not in before["report.md"]


def test_a_first_report_that_cannot_be_written_leaves_no_folder(tmp_path, monkeypatch, capsys):
    path = tmp_path / "r.jsonl"
    write_records(path)
    fail_at(monkeypatch, render.Doc, "markdown", FULL)
    out = tmp_path / "new" / "out"
    assert report.main(["--results", str(path), "--out", str(out)]) == report.EXIT_BAD_INPUT
    assert "no space left on device" in capsys.readouterr().err
    assert not out.exists()


def test_a_record_of_another_schema_is_left_out_with_the_reason(tmp_path):
    path = tmp_path / "r.jsonl"
    write_records(path)
    newer = json.loads(path.read_text().splitlines()[0]) | {"schema": 99, "lr": 0.3}
    with path.open("a") as f:
        f.write(json.dumps(newer) + "\n")
    assert report.build([str(path)], tmp_path / "out", echo=lambda *_: None) == 0
    left = (tmp_path / "out" / "report.md").read_text().split("\n## Left out\n", 1)[1]
    assert ": schema 99 is not one this report reads (schema 1)" in left


@pytest.mark.parametrize("name", ["compare.report", "compare.run", "cluster.train"])
def test_a_ctrl_c_outside_the_runs_is_one_line(name, capsys, monkeypatch):
    """A stop while the report reads or writes (or before the cluster's first namespace) ends
    as every other stop of the project does: one line, exit 130, no traceback. The module's
    own `__main__` block runs, its main raising the stop."""
    module = importlib.import_module(name)
    monkeypatch.setattr(signals, "_SAID", [])  # said once per process: this test's process

    def stopped(*_, **__):
        raise KeyboardInterrupt

    text = Path(module.__file__).read_text()
    block = text[text.rindex('if __name__ == "__main__":') :]
    with pytest.raises(SystemExit) as ended:
        exec(block, {**vars(module), "__name__": "__main__", "main": stopped})
    assert ended.value.code == 130
    assert capsys.readouterr().err.strip().splitlines() == ["interrupted; no record written"]
