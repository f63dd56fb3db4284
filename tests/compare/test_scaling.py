"""The report's "Scaling across nodes" (compare/scaling.py, compare/scaling_report.py) on the
synthetic cluster records of tests/compare/fixture_cluster.py: each cell worked out from the
numbers there and the engine's collectives, the plot, the predictions labelled as such; and
every new field of the wrong type left out with its reason, never a traceback."""

import json
import re

import matplotlib.image
import pytest

from common import collectives
from common.results import Record
from compare import collectives as measured
from compare import comm_model as cm
from compare import records, report, scaling, scaling_report
from tests.compare import fixture_cluster as fc
from tests.compare import fixture_records
from tests.compare.test_collectives import record as allreduce_record
from tests.compare.test_collectives import rows_of

BOX = "2 virtual devices on 8 CPU cores (Fixture Box), preset cpu"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("nodes")
    recs = fc.dedicated() + fc.cluster() + [fc.gpu_record()]
    path = fc.write(out / "r.jsonl", [*recs, fc.allreduce("torch"), fc.allreduce("mxnet")])
    lines = []
    assert report.build([str(path)], out / "report", echo=lines.append) == 0
    return out / "report", (out / "report" / "report.md").read_text(), "\n".join(lines)


def nodes_rows(md: str) -> dict[tuple, dict]:
    """The resnet18 table of the section, as {(engine, link name, nodes): {header: cell}}."""
    text = md.split("\n#### resnet18 across nodes\n\n", 1)[1].split("\n\n", 1)[0]
    lines = text.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split(" | ")]
    out = {}
    for line in lines[2:]:
        cells = dict(zip(header, [c.strip() for c in line.strip("|").split(" | ")], strict=True))
        out[(cells["engine"], cells["link"].split(" ")[0], cells["nodes"])] = cells
    return out


def modelled(framework: str, strategy: str, compute: float) -> tuple[float, float]:
    """(comm, the model's step) of the engine's collectives at the fixture's all-reduce fit."""
    pieces = [
        (fc.ALPHA + size / fc.BUSBW, ready)  # 2 (n - 1) / n = 1 at n = 2
        for size, ready in collectives.step_collectives(framework, strategy, sync_bn=False)
    ]
    return sum(t for t, _ in pieces), cm.timeline(compute, pieces)


def percent(predicted: float, measured: float) -> str:
    error = 100 * (predicted - measured) / measured
    return f"{error:+.1f}%" if abs(error) < 10 else f"{error:+.0f}%"


def test_each_cluster_run_against_its_one_node_run_and_the_model(built):
    _, md, _ = built
    rows = nodes_rows(md)
    assert list(rows) == [
        ("torch ddp", "none", "1"),
        ("torch ddp", "unlimited", "2"),
        ("torch ddp", "1gbit", "2"),
        ("mxnet gluon", "none", "1"),
        ("mxnet dist", "1gbit", "2"),
    ]
    slow = rows[("torch ddp", "1gbit", "2")]
    assert slow["link"] == "1gbit (measured 800 Mbit/s, 100 µs)"
    assert slow["exchange"] == "ring all-reduce (gloo, torch DDP)"
    assert (slow["sec/epoch"], slow["speedup"], slow["efficiency"]) == (
        "450 ± 0 s* (n=3)",
        "1.11x*",  # 500 / 450
        "56%*",
    )
    assert slow["s/step"] == "0.900 s"  # batch 128 / 142.2 images/s
    assert slow["bytes/step measured"] == "41.5 MB"  # (1,275 + 1,215) MB / 2 / 30 steps
    assert slow["bytes/step model"] == "44.7 MB"  # 2 (2 - 1) / 2 x ResNet-18's gradient
    comm, step = modelled("torch", "ddp", 0.5)
    # DDP's three buckets of the gradient and its two broadcasts of BatchNorm's buffers (rank
    # 0's running statistics, then its batch counts), a collective's alpha each
    buffers = sum(c.bytes for c in collectives.step_ops("torch", "ddp", False) if c.ready is None)
    assert comm == pytest.approx(5 * 1e-3 + (fc.GRADIENT_BYTES + buffers) / 1e8)
    assert slow["comm (model)"] == scaling_report.fmt_seconds(comm) == "0.452 s"
    assert slow["exposed comm"] == "0.400 s"  # 0.9 - 0.5
    assert slow["overlap"] == scaling_report.fmt_seconds(comm - 0.4)
    assert slow["model"] == f"{scaling_report.fmt_seconds(step)} ({percent(step, 0.9)})"
    fast = rows[("torch ddp", "unlimited", "2")]  # no all-reduce run over this link: no model
    assert fast["comm (model)"] == fast["overlap"] == fast["model"] == "–"
    assert fast["bytes/step measured"] == "–"  # the record counted no bytes


def test_a_one_node_run_has_no_link_to_count(built):
    _, md, _ = built
    rows = nodes_rows(md)
    # the fixture's 1-node torch run counted 3,000 bytes each way (100 B a step): stray packets
    assert rows[("torch ddp", "none", "1")]["bytes/step measured"] == "–"
    assert rows[("mxnet gluon", "none", "1")]["bytes/step measured"] == "–"
    assert scaling.measured_bytes(records.Entry(fc.cluster()[0], "r.jsonl", 0)) is None


def notes_of(recs) -> list[str]:
    entries = [records.Entry(r, "r.jsonl", i) for i, r in enumerate(recs)]
    return scaling_report.nodes_table("resnet18", scaling.cells_of(entries, {})).notes


def test_nodes_of_one_core_say_what_exposed_comm_and_the_model_count():
    notes = notes_of(fc.cluster())  # one device of one core per node
    assert notes.count(scaling_report.ONE_CORE_NOTE) == 1
    note = scaling_report.ONE_CORE_NOTE
    assert note.endswith(".")
    for said in ("only core", "exposed comm counts", "lower bound on what the compute hid"):
        assert said in note
    star = "* extrapolated: the epoch time is projected from 10 timed steps per epoch"
    assert any(n.startswith(star) for n in notes)  # the s* cells explained
    # two cores per node: the exchange's CPU work may run beside the compute; no such note
    wider = fc.cluster()
    for r in wider:
        r.extra["cores_per_device"] = 2
    assert scaling_report.ONE_CORE_NOTE not in notes_of(wider)
    # the 1-node runs alone: nothing was exchanged
    alone = [r for r in fc.cluster() if r.extra["nodes"] == 1]
    assert scaling_report.ONE_CORE_NOTE not in notes_of(alone)


def test_a_parameter_server_engine_matched_to_its_one_node_gluon_run(built):
    _, md, _ = built
    ps = nodes_rows(md)[("mxnet dist", "1gbit", "2")]
    assert ps["exchange"] == "parameter server (ps-lite, kvstore dist_sync)"
    assert ps["speedup"] == "1.90x*"  # 400 / 210
    comm, step = modelled("mxnet", "dist", 0.4)
    assert comm == pytest.approx(76 * 1e-3 + fc.GRADIENT_BYTES / 1e8)  # a key per parameter
    assert ps["comm (model)"] == scaling_report.fmt_seconds(comm)
    assert ps["exposed comm"] == "0.0200 s"  # 0.42 - 0.4
    assert ps["model"] == f"{scaling_report.fmt_seconds(step)} ({percent(step, 0.42)})"
    base = nodes_rows(md)[("mxnet gluon", "none", "1")]
    assert base["speedup"] == base["comm (model)"] == "–"


def test_the_plot_draws_each_engine_against_the_links_rate(built):
    out, md, _ = built
    names = re.findall(r"\]\(([^)]+_nodes\.png)\)", md)
    assert names == ["2-virtual-devices-on-8-cpu-cores-fixture-box-preset-cpu/resnet18_nodes.png"]
    image = matplotlib.image.imread(out / names[0])
    assert image.shape[0] > 100 and image.shape[1] > 100
    path = out.parent / "r.jsonl"
    entries = [e for e in records.read([path], []) if e.nodes is not None]
    cells = scaling.cells_of(entries, measured.fits(measured.load([path])))
    lines = {line.label: line for line in scaling_report.lines(cells)}
    torch = lines["torch ddp, 2 nodes"]
    # 1gbit at its rate, unlimited at the throughput measured over it
    assert [x for x, _ in torch.measured] == [1e9, 8e9]
    assert torch.measured[0][1] == pytest.approx(0.9) and torch.compute == pytest.approx(0.5)
    assert torch.model == [(1e9, pytest.approx(modelled("torch", "ddp", 0.5)[1]))]


def test_predictions_are_labelled_and_come_from_the_one_gpu_record(built):
    _, md, _ = built
    text = md.split("#### Predictions, not measurements: interconnects not lent", 1)[1]
    assert (
        "| 1 x Fixture GPU 80GB | torch ddp | 0.100 s | NVLink (H100), GPUs in one node | 2 |"
        in (text)
    )
    assert "Predictions, not measurements:" in text


def test_without_a_gpu_record_the_predictions_say_why(tmp_path):
    path = fc.write(tmp_path / "r.jsonl", fc.cluster())
    assert report.build([str(path)], tmp_path / "out", echo=lambda *_: None) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    why = "no 1-GPU record of an engine whose collectives per step are known."
    assert f"No predictions for resnet18: {why}" in md


def test_cluster_runs_stay_out_of_the_device_tables_and_the_summary(built):
    _, md, terminal = built
    box = md.split(f"\n## {BOX}\n", 1)[1].split("\n### Scaling across nodes", 1)[0]
    assert "one device" not in box and "| mxnet |" not in box and "dist" not in box
    summary = md.split("\n## Summary", 1)[1].split("\n## ", 1)[0]
    assert "mxnet" not in summary and "not among them: see Scaling across nodes" in summary
    assert "resnet18_nodes.png" in md and "plot(s)" in terminal


def test_a_run_without_its_one_node_run_shows_dashes(tmp_path):
    alone = [r for r in fc.cluster() if r.framework == "torch" and r.extra["nodes"] == 2]
    alone[0].extra["link"] = {**fc.ONE_GBIT, "measured_bps": None}  # no throughput measured
    path = fc.write(tmp_path / "r.jsonl", [*alone, fc.allreduce("torch")])
    assert report.build([str(path)], tmp_path / "out", echo=lambda *_: None) == 0
    rows = nodes_rows((tmp_path / "out" / "report.md").read_text())
    slow = rows[("torch ddp", "1gbit", "2")]
    assert slow["speedup"] == slow["exposed comm"] == slow["model"] == "–"  # no compute to add
    comm = modelled("torch", "ddp", 0.5)[0]  # without the 1-node run's compute, all the same
    assert slow["comm (model)"] == scaling_report.fmt_seconds(comm) == "0.452 s"
    assert slow["bytes/step model"] == "44.7 MB"
    assert rows[("torch ddp", "unlimited", "2")]["comm (model)"] == "–"


BAD = [
    ({"cores_per_device": 0}, "extra.cores_per_device must be a whole number >= 1"),
    ({"cores_per_device": "1"}, "extra.cores_per_device must be a whole number >= 1"),
    ({"cores_used": [0, -1]}, "extra.cores_used must be a list of CPU numbers (>= 0)"),
    ({"cores_used": "0-3"}, "extra.cores_used must be a list of CPU numbers"),
    ({"execution": "parallel"}, "extra.execution must be one of single, processes, concurrent"),
    ({"nodes": 0}, "extra.nodes must be a whole number >= 1"),
    ({"nodes": 3}, "extra.nodes (3) is more than the run's 2 device(s)"),
    ({"link": None}, "a run on 2 nodes needs extra.link"),
    ({"link": "1gbit"}, "extra.link is not an object"),
    ({"link": {**fc.ONE_GBIT, "name": 7}}, "extra.link.name must be a string, got 7"),
    ({"link": {**fc.ONE_GBIT, "rate_bps": "1g"}}, "extra.link.rate_bps must be a number > 0"),
    ({"link": {**fc.ONE_GBIT, "measured_bps": 0}}, "extra.link.measured_bps must be a number > 0"),
    ({"link": {**fc.ONE_GBIT, "latency_s": -1}}, "extra.link.latency_s must be a number >= 0"),
    ({"link_bytes": [1, 2]}, "extra.link_bytes is not an object"),
    ({"link_bytes": {"tx": 1.5, "rx": 1, "steps": 3}}, "extra.link_bytes.tx must be a whole"),
    ({"link_bytes": {"tx": 1, "rx": 1, "steps": 0}}, "extra.link_bytes.steps must be a whole"),
    ({"gradient_bytes": 4e7}, "extra.gradient_bytes must be a whole number >= 1, got 40000000.0"),
    ({"engine": ["gloo"]}, "extra.engine must be a string"),
]


@pytest.mark.parametrize("change, reason", BAD, ids=[r for _, r in BAD])
def test_new_fields_of_the_wrong_kind_are_left_out_with_the_reason(tmp_path, change, reason):
    good = fc.cluster()[1]  # torch ddp on 2 nodes over 1gbit
    bad = Record(**{**good.to_dict(), "extra": {**good.extra, **change}, "timestamp": "not a time"})
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in (good, bad)))
    assert report.build([str(path)], tmp_path / "out", echo=lambda *_: None) == 0
    left = (tmp_path / "out" / "report.md").read_text().split("## Left out", 1)[1]
    assert "not a time (" in left and f"): {reason}" in left
    assert records.problem(bad).startswith(reason)


def test_a_one_node_run_needs_no_link_and_old_records_need_none_of_it():
    one = fc.cluster()[0]
    assert one.extra["execution"] == "single"  # as common/cores.py writes a 1-device run
    assert records.problem(one) is None
    assert (
        records.problem(Record(**{**one.to_dict(), "extra": {**one.extra, "link": None}})) is None
    )
    assert records.problem(fixture_records.lenet("torch", 1, 1.0, 0.0, 0.8, 1.0)) is None


def test_the_step_model_times_each_collective_at_the_engines_own_fit(tmp_path):
    """With an all-reduce run of the engine over the same link on the same machine beside the
    cluster's runs, each of the step's collectives (here DDP's three buckets of ResNet-18's
    gradient, and its two broadcasts of BatchNorm's buffers before the forward) is timed at that
    run's alpha and busbw; a bucket starts once the backward has readied it and the one before
    has ended, and the forward waits for the broadcasts."""
    recs = fc.cluster()
    alpha, busbw = 2e-3, 5e7  # 2 ms, 50 MB/s per link
    reduce = allreduce_record(link="1gbit", rate=1e9)
    reduce["rows"], reduce["hardware"] = rows_of(collectives.sizes(4**13), 2, alpha, busbw), fc.BOX
    fits = measured.fits([reduce])
    assert fits[("torch", 2, "1gbit", "Fixture Box")] == pytest.approx((alpha, busbw), rel=1e-9)
    entries = [records.Entry(r, "r.jsonl", i) for i, r in enumerate(recs)]
    cells = {(c.entry.rec.framework, c.entry.link_name): c for c in scaling.cells_of(entries, fits)}
    cell = cells[("torch", "1gbit")]
    pieces = collectives.step_collectives("torch", "ddp", sync_bn=False)
    times = [alpha + size / busbw for size, _ in pieces]  # 2 (n - 1) / n = 1 at n = 2
    assert cell.comm == pytest.approx(sum(times))
    held = sum(t for t, (_, ready) in zip(times, pieces, strict=True) if ready is None)
    assert held > 2 * alpha  # the two broadcasts
    forward, backward, end = 0.5 / 3 + held, 0.5 * 2 / 3, 0.0  # the 1-node step: 0.5 s
    for t, (_, ready) in zip(times, pieces, strict=True):
        if ready is not None:  # the buckets
            end = max(end, forward + ready * backward) + t
    assert cell.predicted == pytest.approx(end)
    assert cell.error == pytest.approx((end - 0.9) / 0.9)
    # no all-reduce run over the unlimited link, none of MXNet's: no model
    assert cells[("torch", "unlimited")].comm is None and cells[("mxnet", "1gbit")].comm is None


def test_a_fit_from_another_machine_or_gradient_is_not_used():
    recs = fc.cluster()
    reduce = fc.allreduce("torch")
    reduce["hardware"] = {"cpu": "another CPU"}
    entries = [records.Entry(r, "r.jsonl", i) for i, r in enumerate(recs)]
    assert all(c.comm is None for c in scaling.cells_of(entries, measured.fits([reduce])))
    reduce["hardware"] = fc.BOX  # the machine's, but a gradient that is not ResNet-18's
    for r in recs:
        r.extra["gradient_bytes"] = 40_000_000
    entries = [records.Entry(r, "r.jsonl", i) for i, r in enumerate(recs)]
    assert all(c.comm is None for c in scaling.cells_of(entries, measured.fits([reduce])))


def test_predictions_of_resnet18_time_each_collective_at_nccls_latency():
    """A 1-GPU ResNet-18 record beside cluster runs of ResNet-18's gradient: DDP's three
    buckets and two broadcasts of BatchNorm's buffers, each 8.4 us + 2 (n - 1) ring steps of
    3.4 us over NVLink, and its bytes."""
    recs = fc.cluster()
    entries = [records.Entry(r, "r.jsonl", i) for i, r in enumerate([*recs, fc.gpu_record()])]
    table = scaling_report.predictions(entries, entries[:-1])
    row = next(r for r in table.rows if r[3].startswith("NVLink") and r[4] == "8")
    buckets = collectives.step_collectives("torch", "ddp", sync_bn=False)
    alpha = 8.4e-6 + 2 * 7 * 3.4e-6
    comm = sum(alpha + 2 * 7 / 8 * size / cm.NVLINK_H100_BYTES_PER_S for size, _ in buckets)
    assert row[6] == scaling_report.fmt_seconds(comm)  # 5 x 56 us + 78.3 MB / 370 GB/s
    pieces = [(alpha + 2 * 7 / 8 * size / cm.NVLINK_H100_BYTES_PER_S, r) for size, r in buckets]
    assert row[7] == scaling_report.fmt_seconds(cm.timeline(fc.GPU_STEP, pieces))
