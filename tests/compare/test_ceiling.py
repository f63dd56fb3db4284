"""The ceiling in the report (compare/tables.py): each 1-device training record over the
ceiling of its framework, precision and compiled tier in its machine group, the ratio exact;
ceilings never appear as training rows, and one without a training record is left out."""

import pytest

from common import results
from compare import plots, report, tables
from tests.compare import fixture_records as fx
from tests.compare.test_report import CPU, table_rows


def ceiling(framework, workload, median, **kw):
    """A ceiling record as common/ceiling.py writes it: 3 repeats of 20 steps, 235 steps/epoch."""
    extra = {"amp": "off", "s_per_step": median / 235, "s_per_epoch": median}
    extra.update(steps_per_epoch=235, repeats=3, warmup_steps=2, **kw.pop("extra", {}))
    return fx.record(
        framework,
        workload,
        "ceiling",
        1,
        "2026-11-22T10:00:00+00:00",
        sec_per_epoch=fx.stats(median, 0.0, 3),
        images_per_sec=256 * 235 / median,
        extrapolated=True,
        steps_timed=20,
        extra=extra,
        **kw,
    )


def training():
    return [
        fx.lenet("torch", 1, 10.0, 0.5, 0.812, 6000.0),
        fx.lenet("torch", 2, 5.0, 0.25, 0.805, 12000.0),
        fx.lenet("jax", 1, 4.0, 0.2, 0.821, 15000.0),
        fx.lenet("mxnet", 1, 12.0, 0.6, 0.79, 5000.0),
        fx.resnet18("torch", "ddp", 1, 300.0, 0.61, True),
        fx.compiled_resnet18(250.0, "cpu"),
        fx.resnet18("jax", "sharding", 1, 150.0, 0.64, False),
        fx.resnet18("jax", "pmap", 1, 160.0, 0.63, False),
    ]


CEILINGS = [
    ceiling("torch", "lenet", 8.0, extra={"compiled": False}),  # 10 / 8 = 1.25x
    ceiling("jax", "lenet", 2.5),  # 4 / 2.5 = 1.60x
    # no mxnet lenet ceiling: its training row has no ratio
    ceiling("torch", "resnet18", 240.0, extra={"compiled": False}),  # eager ddp only: 1.25x
    ceiling("jax", "resnet18", 200.0),  # sharding 0.75x, pmap 0.80x
    ceiling("mxnet", "resnet18", 100.0),  # no mxnet resnet18 training: a dash
    ceiling("torch", "lenet", 1.0, preset="smoke"),  # no smoke training record: left out
    ceiling("jax", "resnet18", 90.0, extra={"amp": "bf16"}),  # no bf16 training: its tier shown
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ceiling")
    path = tmp / "r.jsonl"
    for rec in training() + CEILINGS:
        results.append(rec, path)
    lines = []
    assert report.build([str(path)], tmp / "out", echo=lines.append) == 0
    return (tmp / "out" / "report.md").read_text()


def ceiling_rows(md, workload):
    return table_rows(md, f"{workload}: ", heading_text="#### Training loop vs its framework's")


def test_lenet_ratio_is_training_over_ceiling(built):
    rows = ceiling_rows(built, "lenet")
    assert list(rows) == [("torch", "scratch"), ("jax", "scratch")]
    torch = rows[("torch", "scratch")]
    assert torch["sec/epoch (1 dev)"] == "10.0 ± 0.5 s (n=3)"
    assert torch["ceiling sec/epoch"] == "8.00 ± 0.00 s* (n=3)"
    assert torch["ceiling s/step"] == "0.0340 s (3 x 20 steps)"  # 8 / 235
    assert torch["x ceiling"] == "1.25x"
    assert rows[("jax", "scratch")]["x ceiling"] == "1.60x"


def test_resnet18_matches_the_tier_and_every_strategy(built):
    rows = ceiling_rows(built, "resnet18")
    assert list(rows) == [
        ("torch", "ddp"),
        ("jax", "sharding"),
        ("jax", "pmap"),
        ("jax", "– (+bf16)"),
        ("mxnet", "–"),
    ]
    assert rows[("torch", "ddp")]["x ceiling"] == "1.25x"  # 300 / 240; not the compiled row
    assert rows[("jax", "sharding")]["x ceiling"] == "0.75x"
    assert rows[("jax", "pmap")]["x ceiling"] == "0.80x"
    mxnet = rows[("mxnet", "–")]
    assert (mxnet["sec/epoch (1 dev)"], mxnet["x ceiling"]) == ("–", "–")
    assert "The ceiling (`python -m <framework>_impl.ceiling`" in built


def test_ceilings_are_not_training_rows(built):
    for workload in ("lenet", "resnet18"):
        assert all(s != "ceiling" for _, s in table_rows(built, workload))
    summary = table_rows(built, "## Summary", keys=3)
    assert all(strategy != "ceiling" for _, _, strategy in summary)
    assert "a ceiling with no training record of its machine group" in built
    assert CPU in built


def test_readme_tables_show_the_ceiling_beside_the_one_device_time(tmp_path):
    from compare import readme

    path = tmp_path / "results" / "r.jsonl"
    path.parent.mkdir()
    for rec in training() + CEILINGS[:-1]:  # the smoke ceiling would be a group of its own
        results.append(rec, path)
    text = readme.render(readme.load(("results/r.jsonl",), tmp_path), tmp_path)
    assert "| ceiling sec/epoch | x ceiling (1 dev) |" in text
    assert (
        "| 10.0 ± 0.5 s (n=3) | 5.00 ± 0.25 s (n=3) | overheads only | 8.00 ± 0.00 s* (n=3) "
        "| 1.25x |" in (text)
    )
    assert "| mxnet scratch | 0.790 / – | 12.0 ± 0.6 s (n=3) | – | – | – | – |" in text  # none
    resnet18 = text.split("| resnet18", 1)[1].split("\n\n", 1)[0]
    assert "| torch ddp | 0.610 | 300 ± 0 s* (n=1) | 240 ± 0 s* (n=3) | 1.25x |" in resnet18
    assert "| torch ddp+compiled | 0.600 | 250 ± 0 s (n=1) | – | – |" in resnet18  # its own tier
    assert "| jax pmap | 0.630 | 160 ± 0 s (n=1) | 200 ± 0 s* (n=3) | 0.80x |" in resnet18


def test_the_sec_per_epoch_plot_marks_each_one_device_bar_with_its_ceiling(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    for rec in training() + CEILINGS:
        results.append(rec, path)
    loaded = report.load([str(path)])
    group = next(m for m in loaded.machines if m.preset == "cpu")
    entries = group.workload("resnet18")
    marks = tables.ceiling_marks(entries, group.ceilings, "resnet18")
    # The tier must match: the compiled row has no compiled ceiling, so no mark.
    assert marks == {("torch", "ddp"): 240.0, ("jax", "sharding"): 200.0, ("jax", "pmap"): 200.0}
    drawn, real = [], plots._ceiling_marks
    monkeypatch.setattr(plots, "_ceiling_marks", lambda ax, *a: (real(ax, *a), drawn.append(ax)))
    plots.sec_bars(tmp_path / "p.png", "t", tables.dp_rows(entries), marks)
    lines = [c for c in drawn[0].collections if c.get_gid() == "ceiling"]
    heights = sorted(seg[0][1] for c in lines for seg in c.get_segments())
    assert heights == [200.0, 200.0, 240.0]


def in_run(median, x_ceiling):
    """A training record's extra.ceiling as common.ceiling.Paired writes it (3 epochs)."""
    return {
        "sec_per_epoch": fx.stats(median, 0.0, 3),
        "s_per_step": median / 235,
        "x_ceiling": x_ceiling,
        "steps_timed": 20,
        "repeats": 3,
        "warmup_steps": 2,
    }


def test_a_ceiling_measured_in_the_run_is_the_one_its_record_is_set_against(tmp_path):
    # x ceiling 1.30 (the median of the epochs' ratios) where the medians' ratio is 10 / 8
    torch = fx.lenet("torch", 1, 10.0, 0.5, 0.812, 6000.0, extra={"ceiling": in_run(8.0, 1.3)})
    mxnet = fx.lenet("mxnet", 1, 12.0, 0.6, 0.79, 5000.0, extra={"ceiling": {"x_ceiling": 2}})
    two = fx.lenet("torch", 2, 5.0, 0.25, 0.805, 12000.0, extra={"ceiling": in_run(1.0, 9.0)})
    apart = ceiling("torch", "lenet", 5.0, extra={"compiled": False})  # its run is paired: unused
    path = tmp_path / "results" / "r.jsonl"
    path.parent.mkdir()
    for rec in (torch, mxnet, two, apart):
        results.append(rec, path)
    assert report.build([str(path)], tmp_path / "out", echo=[].append) == 0
    rows = ceiling_rows((tmp_path / "out" / "report.md").read_text(), "lenet")
    assert list(rows) == [("torch", "scratch")]  # mxnet's ceiling is malformed: none
    row = rows[("torch", "scratch")]
    assert (row["x ceiling"], row["measured"]) == ("1.30x", "in the run")
    assert row["ceiling sec/epoch"] == "8.00 ± 0.00 s* (n=3)"
    from compare import readme

    text = readme.render(readme.load(("results/r.jsonl",), tmp_path), tmp_path)
    assert (
        "| 10.0 ± 0.5 s (n=3) | 5.00 ± 0.25 s (n=3) | overheads only | 8.00 ± 0.00 s* (n=3) "
        "| 1.30x |" in (text)
    )
    group = report.load([str(path)]).machines[0]
    assert tables.ceiling_marks(group.entries, group.ceilings, "lenet") == {
        ("torch", "scratch"): 8.0
    }
