"""A speedup only between like runs (compare/tables.py, DpRow): the 1-device and n-device runs
with the same cores per device, and the n devices not stepped one after another. A run on
shared cores and one pinned to its own cores are different rows; the others show a label."""

import re

import pytest

from compare import plots, readme, records, report, tables
from tests.compare import fixture_cluster as fc
from tests.compare import fixture_records


def entries(recs) -> list[records.Entry]:
    return [records.Entry(r, "test", i) for i, r in enumerate(recs)]


def rows_of(recs, workload: str) -> dict[tuple, tables.DpRow]:
    mine = [e for e in entries(recs) if e.rec.workload == workload]
    return {(r.framework, r.label, r.cores): r for r in tables.dp_rows(mine)}


def test_shared_cores_give_no_speedup_where_the_old_report_gave_one():
    """10 s on 1 device and 5 s on 2 that shared the cores: once 2.00x, now no figure."""
    lenet = fixture_records.lenet
    row = tables.dp_rows(
        entries([lenet("torch", 1, 10.0, 0.5, 0.8, 1.0), lenet("torch", 2, 5.0, 0.2, 0.8, 1.0)])
    )[0]
    assert row.cores is None and not row.dedicated
    assert row.speedup(2) is None
    assert row.unlike(2) == tables.OVERHEADS == row.scaling_cell(2) == "overheads only"
    assert row.scaling_cell(2, efficiency=True) == "overheads only"


def test_pinned_runs_are_a_row_of_their_own_with_their_speedup():
    rows = rows_of(fc.dedicated(), "resnet18")
    assert list(rows) == [("torch", "ddp", None), ("torch", "ddp", 1)]  # shared first
    pinned, shared = rows[("torch", "ddp", 1)], rows[("torch", "ddp", None)]
    assert pinned.speedup(2) == pytest.approx((300 / 160, 300 / 160 / 2))
    assert pinned.scaling_cell(2) == "1.88x" and pinned.scaling_cell(2, True) == "94%"
    assert shared.scaling_cell(2) == "overheads only"  # 300 / 280 of shared cores: no figure
    assert tables.cores_text(pinned) == "1" and tables.cores_text(shared) == "shared"


def test_sequential_devices_give_no_speedup_even_on_their_own_cores():
    rows = rows_of(fc.dedicated(), "lenet")
    torch, jax = rows[("torch", "scratch", 1)], rows[("jax", "scratch", 1)]
    assert torch.speedup(2) is None and torch.scaling_cell(2) == "sequential"
    assert torch.speedup(1) == (1.0, 1.0)  # a 1-device run is never "sequential"
    assert jax.speedup(2) == (1.6, 0.8) and jax.scaling_cell(2) == "1.60x"


def test_a_gpu_of_its_own_is_dedicated_without_cores_per_device():
    gpu = fixture_records.GPU
    recs = [fixture_records.lenet("torch", n, 1.0 / n, 0.0, 0.8, 1.0, **gpu) for n in (1, 2)]
    recs[1].extra = {"execution": "sequential"}  # one process, but GPUs run asynchronously
    row = tables.dp_rows(entries(recs))[0]
    assert row.dedicated and tables.cores_text(row) == "GPU"
    assert row.scaling_cell(2) == "2.00x"


def test_missing_or_diverged_runs_are_a_dash_not_a_label():
    lenet = fixture_records.lenet
    one = tables.dp_rows(entries([lenet("torch", 2, 5.0, 0.2, 0.8, 1.0)]))[0]
    assert one.scaling_cell(2) == tables.DASH  # no 1-device run to compare with
    bad = lenet("torch", 2, 5.0, 0.2, 0.8, 1.0, diverged_at_epoch=1)
    row = tables.dp_rows(entries([lenet("torch", 1, 10.0, 0.5, 0.8, 1.0), bad]))[0]
    assert row.scaling_cell(2) == tables.DASH


def test_the_scaling_plot_draws_only_like_runs(tmp_path):
    rows = list(rows_of(fc.dedicated(), "lenet").values())
    path = plots.scaling(tmp_path / "a.png", "t", rows)
    assert path is not None  # jax, concurrent on its own cores
    sequential = [r for r in rows if r.framework == "torch"]
    assert plots.scaling(tmp_path / "b.png", "t", sequential) is None
    shared = [r for r in rows_of(fc.dedicated(), "resnet18").values() if r.cores is None]
    assert plots.scaling(tmp_path / "c.png", "t", shared) is None


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("like")
    path = fc.write(out / "r.jsonl", fc.dedicated())
    assert report.build([str(path)], out / "report", echo=lambda *_: None) == 0
    return out / "report", (out / "report" / "report.md").read_text()


def dp_rows_in(md: str, heading: str) -> dict[tuple, dict]:
    text = md.split(f"\n### {heading}", 1)[1].split("\n\n|", 1)[1]
    lines = ("|" + text).split("\n\n", 1)[0].splitlines()
    header = [c.strip() for c in lines[0].strip("|").split(" | ")]
    out = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        out[tuple(cells[:3])] = dict(zip(header, cells, strict=True))
    return out


def test_report_tables_show_cores_and_labels_with_their_notes(built):
    _, md = built
    resnet18 = dp_rows_in(md, "resnet18")
    assert resnet18[("torch", "ddp", "1")]["speedup (2 dev)"] == "1.88x"
    assert resnet18[("torch", "ddp", "shared")]["speedup (2 dev)"] == "overheads only"
    lenet = dp_rows_in(md, "lenet")
    assert lenet[("torch", "scratch", "1")]["efficiency (2 dev)"] == "sequential"
    assert lenet[("jax", "scratch", "1")]["efficiency (2 dev)"] == "80%"
    for note in (*tables.UNLIKE_NOTES.values(), tables.CORES_NOTE):
        assert note in md
    # the 1-device runs on shared and on pinned cores stay apart in the throughput table too
    assert "| torch | ddp | 1, 1 core(s)/device |" in md and "| torch | ddp | 1 | – |" in md


def test_only_like_runs_get_a_scaling_plot(built):
    out, md = built
    names = re.findall(r"\]\(([^)]+\.png)\)", md)
    assert any(n.endswith("lenet_scaling.png") for n in names)  # jax's concurrent row
    assert any(n.endswith("resnet18_scaling.png") for n in names)  # the pinned ddp row


def test_summary_says_the_cores_of_its_best_time(built):
    _, md = built
    summary = md.split("\n## Summary", 1)[1].split("\n## ", 1)[0]
    assert "| resnet18 | torch | ddp | 160 s (2 dev, 1 core(s)/dev) |" in summary


def test_the_readme_table_has_a_cores_column_only_where_a_run_had_its_own(tmp_path):
    path = fc.write(tmp_path / "r.jsonl", fc.dedicated())
    mine = [e for e in records.read([path], []) if e.rec.workload == "resnet18"]
    table = readme.dp_table("resnet18", mine)
    assert table.headers[:2] == ["resnet18 (3 epochs)", "cores/device"]
    body = {tuple(r[:2]): r for r in table.rows}
    assert body[("torch ddp", "1")][-1] == "1.88x"
    assert body[("torch ddp", "shared")][-1] == "overheads only"
    assert tables.CORES_NOTE in table.notes and tables.UNLIKE_NOTES["overheads only"] in table.notes
    old = [e for e in mine if e.cores_per_device is None]
    assert "cores/device" not in readme.dp_table("resnet18", old).headers


def test_a_run_pinned_and_one_on_shared_cores_never_supersede_each_other():
    recs = fc.dedicated()
    kept, older = records.newest(entries(recs))
    assert len(kept) == len(recs) and older == []
