"""compare.report on the fixture records (tests/compare/fixture_records.py): the exact table cells,
the arithmetic behind them, the plots, and what is left out and why."""

import json
import re

import matplotlib.image
import pytest

from common.results import Record
from compare import records, report, tables
from tests.compare import fixture_records

PNG = b"\x89PNG\r\n\x1a\n"


def table_rows(md: str, heading: str) -> dict[tuple[str, str], list[str]]:
    """The first table after `## heading`, as {(first cell, second cell): cells}."""
    section = md.split(f"\n## {heading}", 1)[1].split("\n", 1)[1]
    lines = [x for x in section.split("\n\n") if x.startswith("| ")][0].splitlines()
    header = [c.strip() for c in lines[0].strip("|").split(" | ")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert len(cells) == len(header)
        rows[(cells[0], cells[1])] = dict(zip(header, cells, strict=True))
    return rows


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    lines = []
    code = report.build([str(fixture_records.FIXTURE)], out, write_html=True, echo=lines.append)
    assert code == 0
    return out, (out / "report.md").read_text(), "\n".join(lines)


def test_fixture_file_matches_its_generator():
    assert fixture_records.FIXTURE.read_text() == fixture_records.lines()
    for line in fixture_records.lines().splitlines():
        if line != fixture_records.MALFORMED.strip():
            Record.from_dict(json.loads(line))  # every other line is a valid record


def test_lenet_table(built):
    _, md, _ = built
    rows = table_rows(md, "lenet")
    assert set(rows) == {("torch", "scratch"), ("jax", "scratch"), ("mxnet", "scratch")}
    torch = rows[("torch", "scratch")]
    # the newest torch 1-device record (10 s), not the superseded one (99 s)
    assert torch["sec/epoch (1 dev)"] == "10.0 ± 0.5 s (n=3)"
    assert torch["sec/epoch (2 dev)"] == "5.00 ± 0.25 s (n=3)"
    assert torch["test acc (1 dev)"] == "0.812"
    assert torch["images/s (2 dev)"] == "12,000"
    assert torch["speedup (2 dev)"] == "2.00x"  # 10 / 5
    assert torch["efficiency (2 dev)"] == "100%"  # 2.00 / 2
    assert torch["platform"] == "cpu (virtual)" and torch["preset"] == "cpu"
    jax = rows[("jax", "scratch")]
    assert jax["sec/epoch (1 dev)"] == "4.00 ± 0.20 s (n=3)"
    assert jax["speedup (2 dev)"] == "1.60x"  # 4 / 2.5
    assert jax["efficiency (2 dev)"] == "80%"  # 1.6 / 2
    mxnet = rows[("mxnet", "scratch")]
    assert mxnet["sec/epoch (2 dev)"] == "–" and mxnet["speedup (2 dev)"] == "–"
    assert [torch["env"], jax["env"], mxnet["env"]] == ["E1", "E2", "E3"]


def test_resnet18_table_marks_extrapolated_figures(built):
    _, md, _ = built
    rows = table_rows(md, "resnet18")
    assert list(rows) == [
        ("torch", "ddp"),
        ("jax", "sharding"),
        ("jax", "pmap"),
        ("mxnet", "gluon"),
    ]
    torch = rows[("torch", "ddp")]
    assert torch["sec/epoch (1 dev)"] == "300 ± 0 s* (n=1)"
    assert torch["images/s (1 dev)"] == "200*"  # 60000 / 300
    assert torch["speedup (2 dev)"] == "1.50x*"  # 300 / 200
    assert torch["efficiency (2 dev)"] == "75%*"
    pmap = rows[("jax", "pmap")]
    assert pmap["sec/epoch (2 dev)"] == "80.0 ± 0.0 s (n=1)"  # measured: no star
    assert pmap["speedup (2 dev)"] == "2.00x" and pmap["efficiency (2 dev)"] == "100%"
    assert rows[("mxnet", "gluon")]["speedup (2 dev)"] == "1.60x*"  # 400 / 250
    assert "* extrapolated: the epoch time is projected from fewer steps" in md
    assert "(20 timed steps per epoch)" in md


def test_memory_and_utilization_table(built):
    _, md, _ = built
    section = md.split("### Memory and utilisation", 1)[1]
    assert "| torch | ddp | 1 | 512 | – | – |" in section
    assert "| torch | ddp | 2 | 700 / 710 | 95 / 94 | cpu_time |" in section


def test_resnet50_table(built):
    _, md, _ = built
    rows = {k[0]: v for k, v in table_rows(md, "resnet50").items()}
    torch = rows["torch"]
    assert torch["single"] == "3.75 ± 0.07 s (n=3)"  # std 3.75 / 50
    assert torch["model_parallel"] == "4.02 ± 0.08 s (n=3)"
    assert torch["pipeline"] == "2.51 ± 0.05 s (n=3), split 6"
    best = fixture_records.sweep_seconds("torch", 2)  # the fastest point of the sweep
    assert min(fixture_records.sweep_seconds("torch", s) for s in fixture_records.R50_SPLITS) == (
        best
    )
    assert torch["pipeline, best split"] == f"{best:.2f} ± {best / 50:.2f} s (n=3)"
    assert torch["best split size"] == "2"
    assert torch["gpipe"] == "2.60 ± 0.05 s (n=3), split 6"
    assert torch["1f1b"] == "2.50 ± 0.05 s (n=3), split 6"
    assert torch["model_parallel vs single"] == f"{3.75 / 4.02:.2f}x" == "0.93x"
    assert torch["best split vs single"] == f"{3.75 / best:.2f}x"
    assert rows["jax"]["best split size"] == "4"
    assert rows["jax"]["gpipe"] == "–"
    mxnet = rows["mxnet"]
    assert mxnet["single"] == "5.00 ± 0.10 s (n=3)"
    assert mxnet["pipeline, best split"] == "–" and mxnet["best split vs single"] == "–"


def test_pipeline_model_section(built):
    _, md, _ = built
    section = md.split("### Pipeline model", 1)[1]
    # torch's fixture sweep is the model (a=2, overhead 10 ms) with split 3 at +2%, 8 at -3%
    assert "fitted at split sizes 1 and 24: a = 2, overhead = 10 ms per micro-batch" in section
    assert "| 3 | 8 | 11% |" in section and "| -2.0% |" in section
    assert "| 8 | 3 | 25% |" in section and "| +3.1% |" in section  # 1 / 0.97 - 1
    assert "mean 0.8%, max 3.1%" in section
    assert "4 stages (PROJECTION)" in section and "8 stages (PROJECTION)" in section
    assert "mxnet: no split_size sweep" in section


def test_left_out_records_and_warnings_are_listed(built):
    _, md, _ = built
    left = md.split("\n## Left out\n", 1)[1]
    assert "compare_results.jsonl:4: bad results line" in left
    assert "mxnet resnet50 pipeline, split 6" in left and "no seconds statistics" in left
    assert re.search(r"torch lenet scratch, 1 device\(s\).*2026-11-19T10:01:00.*superseded", left)
    assert re.search(r"jax lenet scratch.*preset smoke.*not comparable", left)


def test_environment_of_every_figure_is_listed(built):
    out, md, _ = built
    env = md.split("\n## Environment\n", 1)[1]
    assert "| E1 | Fixture CPU (2 cores); no GPU; torch 2.15.0" in env
    assert "commit abc123def456" in env
    for caption in re.findall(r"^\*(.+)\*$", md, re.M):
        assert "Environment: E" in caption


def test_plots_are_valid_pngs(built):
    out, md, _ = built
    names = re.findall(r"\]\(([^)]+\.png)\)", md)
    assert {
        "lenet_sec_per_epoch.png",
        "lenet_scaling.png",
        "lenet_accuracy.png",
        "resnet18_sec_per_epoch.png",
        "resnet50_strategies.png",
        "resnet50_split_size.png",
        "resnet50_pipeline_model.png",
    } <= set(names)
    for name in names:
        data = (out / name).read_bytes()
        assert data.startswith(PNG)
        image = matplotlib.image.imread(out / name)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_html_is_self_contained(built):
    out, _, _ = built
    page = (out / "report.html").read_text()
    sources = re.findall(r'<img [^>]*src="([^"]*)"', page)
    assert len(sources) == 9
    assert all(src.startswith("data:image/png;base64,") for src in sources)
    assert "<table>" in page and "1.60x" in page


def test_terminal_shows_the_main_tables(built):
    _, _, terminal = built
    assert "lenet (preset cpu, cpu (virtual))" in terminal
    assert "warning: " in terminal and "compare_results.jsonl:4: bad results line" in terminal
    assert re.search(
        r"jax\s+scratch\s+2\s+0\.818\s+2\.50 ± 0\.10 s \(n=3\)\s+24,000\s+1\.60x", terminal
    )
    assert "resnet50 (preset cpu, cpu (virtual))" in terminal


def test_scaling_arithmetic():
    assert tables.scaling(10.0, 5.0, 2) == (2.0, 1.0)
    speedup, efficiency = tables.scaling(4.0, 2.5, 2)
    assert speedup == pytest.approx(1.6, rel=1e-12)
    assert efficiency == pytest.approx(0.8, rel=1e-12)
    speedup, efficiency = tables.scaling(12.0, 4.0, 4)
    assert (speedup, efficiency) == (3.0, 0.75)


def test_formatting():
    assert tables.fmt_stats({"median": 12.34, "std": 0.44, "n": 5}, star=True) == (
        "12.3 ± 0.4 s* (n=5)"
    )
    assert tables.fmt_stats({"median": 0.01234, "std": 0.0001, "n": 2}) == (
        "0.0123 ± 0.0001 s (n=2)"
    )
    assert tables.fmt_efficiency(0.754) == "75%"
    assert tables.fmt_rate(1234.4) == "1,234" and tables.fmt_rate(12.34) == "12.3"


def test_newest_record_of_a_cell_wins(tmp_path):
    old = fixture_records.lenet("torch", 1, 9.0, 0.1, 0.5, 1.0, day=18)
    new = fixture_records.lenet("torch", 1, 7.0, 0.1, 0.5, 1.0, day=21)
    entries = [records.Entry(r, "f", i) for i, r in enumerate([new, old])]
    kept, older = records.newest(entries)
    assert [e.rec for e in kept] == [new]
    assert older[0].entry.rec is old and new.timestamp in older[0].reason


def test_selected_preset_leaves_the_others_out(tmp_path):
    lines = []
    code = report.build([str(fixture_records.FIXTURE)], tmp_path, preset="smoke", echo=lines.append)
    assert code == 0
    md = (tmp_path / "report.md").read_text()
    rows = table_rows(md, "lenet")
    assert list(rows) == [("jax", "scratch")]
    assert rows[("jax", "scratch")]["sec/epoch (1 dev)"] == "0.500 ± 0.010 s (n=3)"
    assert "No comparable resnet18 records." in md
    assert re.search(r"torch lenet scratch, 2 device.*: not comparable: lenet, preset cpu", md)
    assert re.search(r"torch resnet18 ddp, 2 device.*: not preset smoke", md)


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no usable results in"),
        ("", "no usable results in"),
        ("not json\n{}\n", "first: "),
    ],
)
def test_no_results_is_one_line_and_nonzero(tmp_path, capsys, content, message):
    path = tmp_path / "r.jsonl"
    if content is not None:
        path.write_text(content)
    code = report.main(["--results", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == report.EXIT_NO_RESULTS
    assert message in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    if content:
        assert "r.jsonl:1: bad results line" in err


def test_missing_file_beside_a_good_one_is_a_warning(tmp_path):
    code = report.main(
        ["--results", str(fixture_records.FIXTURE), str(tmp_path / "nope.jsonl"),
         "--out", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    assert "nope.jsonl: no such results file" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(extra=[1, 2]), "extra is not an object"),
        (dict(test_acc="high"), "test_acc is not a number"),
        (dict(test_acc_per_epoch="abc"), "test_acc_per_epoch is not a list of numbers"),
        (dict(devices=0), "devices must be a whole number >= 1"),
        (dict(sec_per_epoch={"mean": 1.0}), "sec_per_epoch has no positive median"),
        (dict(platform="tpu"), "unknown platform 'tpu'"),
        (dict(workload="bert"), "unknown workload 'bert'"),
    ],
)
def test_odd_records_are_left_out_with_the_reason(tmp_path, change, reason):
    good = fixture_records.lenet("torch", 1, 10.0, 0.5, 0.8, 100.0)
    bad = Record(**{**good.to_dict(), **change, "timestamp": "not a time"})
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in (good, bad)))
    assert report.build([str(path)], tmp_path / "out", echo=lambda *_: None) == 0
    left = (tmp_path / "out" / "report.md").read_text().split("## Left out", 1)[1]
    assert "not a time (" in left and f"): {reason}" in left
