"""compare.report on the fixture records (tests/compare/fixture_records.py): the exact table cells,
the arithmetic behind them, the plots, and what is left out and why."""

import json
import os
import re
from pathlib import Path

import pytest

from common import results
from common.results import Record
from compare import readme, records, report, summary, tables
from tests.compare import fixture_records

PNG = b"\x89PNG\r\n\x1a\n"
HW = fixture_records.HARDWARE


CPU = "2 virtual devices on 2 CPU cores (Fixture CPU), preset cpu"
SMOKE = "1 virtual device on 2 CPU cores (Fixture CPU), preset smoke"
GPU = "1 x Fixture GPU 80GB, preset full"


def section(md: str, machine: str, heading: str = "") -> str:
    """The text of `## machine` (up to the next `## `), from its `heading` on."""
    text = md.split(f"\n## {machine}\n", 1)[1].split("\n## ", 1)[0]
    return text.split(heading, 1)[1] if heading else text


def table_rows(
    md: str, heading: str, machine: str = CPU, keys: int = 2, heading_text: str = ""
) -> dict[tuple, dict]:
    """The first table after `### heading` (and then after `heading_text`) in the machine's
    section (`## heading`: in the whole report), as {(first `keys` cells): {header: cell}}."""
    if heading.startswith("## "):
        text = md.split(f"\n{heading}", 1)[1]
    else:
        text = section(md, machine, f"\n### {heading}")
    if heading_text:
        text = text.split(f"\n{heading_text}", 1)[1]
    text = text.split("\n", 1)[1]
    lines = (
        [x for x in text.split("\n\n") if x.strip("\n").startswith("| ")][0].strip().splitlines()
    )
    header = [c.strip() for c in lines[0].strip("|").split(" | ")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert len(cells) == len(header)
        rows[tuple(cells[:keys])] = dict(zip(header, cells, strict=True))
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
    # the fixture's devices share the cores: 10 / 5 is no speedup, and the table says so
    assert torch["speedup (2 dev)"] == torch["efficiency (2 dev)"] == "overheads only"
    assert torch["cores/device"] == "shared"
    assert torch["platform"] == "cpu (virtual)" and torch["preset"] == "cpu"
    jax = rows[("jax", "scratch")]
    assert jax["sec/epoch (1 dev)"] == "4.00 ± 0.20 s (n=3)"
    assert jax["speedup (2 dev)"] == jax["efficiency (2 dev)"] == "overheads only"
    mxnet = rows[("mxnet", "scratch")]
    assert mxnet["sec/epoch (2 dev)"] == "–" and mxnet["speedup (2 dev)"] == "–"
    assert [torch["env"], jax["env"], mxnet["env"]] == ["E1", "E2", "E3"]


def test_resnet18_table_marks_extrapolated_figures(built):
    _, md, _ = built
    rows = table_rows(md, "resnet18")
    assert list(rows) == [
        ("torch", "ddp"),
        ("torch", "ddp+compiled"),
        ("jax", "sharding"),
        ("jax", "sharding+sync-bn"),
        ("jax", "pmap"),
        ("mxnet", "gluon"),
    ]
    torch = rows[("torch", "ddp")]
    assert torch["sec/epoch (1 dev)"] == "300 ± 0 s* (n=1)"
    assert torch["images/s (1 dev)"] == "200*"  # 60000 / 300
    assert torch["speedup (2 dev)"] == torch["efficiency (2 dev)"] == "overheads only"
    pmap = rows[("jax", "pmap")]
    assert pmap["sec/epoch (2 dev)"] == "80.0 ± 0.0 s (n=1)"  # measured: no star
    assert pmap["speedup (2 dev)"] == "overheads only"
    assert rows[("mxnet", "gluon")]["speedup (2 dev)"] == "overheads only"
    assert tables.UNLIKE_NOTES[tables.OVERHEADS] in md
    assert "* extrapolated: the epoch time is projected from fewer steps" in md
    assert "(20 timed steps per epoch)" in md


def test_sync_batchnorm_is_a_row_of_its_own_over_the_same_one_device_run(built):
    """--sync-bn computes another thing on several devices: never in the per-device row; on one
    device the two are the same, so both rows show the one 1-device run."""
    _, md, _ = built
    rows = table_rows(md, "resnet18")
    plain, sync = rows[("jax", "sharding")], rows[("jax", "sharding+sync-bn")]
    assert plain["sec/epoch (2 dev)"] == "100 ± 0 s (n=1)"
    assert sync["sec/epoch (2 dev)"] == "120 ± 0 s (n=1)"
    assert sync["sec/epoch (1 dev)"] == plain["sec/epoch (1 dev)"] == "150 ± 0 s (n=1)"


@pytest.mark.parametrize(
    ("framework", "devices", "extra", "label"),
    [
        ("jax", 2, {}, "sharding+sync-bn"),  # JAX's records before the field: the whole batch
        ("jax", 1, {}, "sharding"),  # on one device the same either way
        ("torch", 2, {}, "sharding"),  # DDP's and Gluon's: each device's share
        ("jax", 2, {"batch_norm": "per-device"}, "sharding"),
        ("torch", 2, {"batch_norm": "sync"}, "sharding+sync-bn"),
    ],
)
def test_a_records_batchnorm_names_its_row(framework, devices, extra, label):
    rec = fixture_records.resnet18(framework, "sharding", devices, 1.0, 0.5, False)
    rec.extra = {"amp": "off", **extra}
    assert records.Entry(rec, "r.jsonl", 0).label == label


def test_compiled_torch_is_a_row_of_its_own_beside_eager(built):
    _, md, out = built
    rows = table_rows(md, "resnet18")
    compiled, eager = rows[("torch", "ddp+compiled")], rows[("torch", "ddp")]
    assert compiled["sec/epoch (1 dev)"] == "250 ± 0 s (n=1)"
    assert compiled["images/s (1 dev)"] == "240"  # 60000 / 250
    assert eager["sec/epoch (1 dev)"] == "300 ± 0 s* (n=1)"
    assert compiled["sec/epoch (2 dev)"] == "–"  # no 2-device compiled run
    assert md.count(summary.COMPILED_NOTE) == 1  # said once, at the top
    assert "JAX always compiles (jit; lenet's per-device step)" in md
    assert "MXNet's resnet18 and resnet50 are hybridized" in md
    assert "MXNet's lenet runs NDArray operations eagerly" in md
    best = table_rows(md, "## Summary", keys=3)
    assert best[("resnet18", "torch", "ddp+compiled")][CPU] == "250 s (1 dev)"
    assert best[("resnet18", "torch", "ddp+compiled")][GPU] == "1.60 s (1 dev)"
    assert "ddp+compiled" in out  # and in the terminal's table


def test_throughput_table_shows_tflops_and_percent_of_peak(built):
    _, md, _ = built
    cpu = table_rows(md, "resnet18", keys=3, heading_text="#### Throughput")
    # 3 x 0.9116 GFLOP x 240 images/s = 0.656 TFLOP/s; a CPU has no known peak
    row = cpu[("torch", "ddp+compiled", "1")]
    assert row["GFLOP/image (train)"] == "2.73" and row["TFLOP/s"] == "0.656"
    assert row["% of peak"] == "n/a (peak unknown)"
    assert cpu[("torch", "ddp", "1")]["TFLOP/s"] == "–"  # a record from before the figures
    gpu = table_rows(md, "resnet18", GPU, keys=3, heading_text="#### Throughput")
    # 2.7348 GFLOP x 37,500 images/s = 102.6 TFLOP/s of an H100 SXM's TF32 494.7: 20.7%
    row = gpu[("torch", "ddp+compiled", "1")]
    assert row["TFLOP/s"] == "103" and row["% of peak"] == "20.7% of 494.7 (tf32)"
    assert "training = 3 x forward" in md


def test_memory_and_utilization_table(built):
    _, md, _ = built
    cpu = section(md, CPU, "#### Memory and utilisation")
    assert "| torch | ddp | shared | 1 | 512 | – | – |" in cpu
    assert "| torch | ddp | shared | 2 | 700 / 710 | 95 / 94 | cpu_time |" in cpu
    gpu = section(md, GPU, "#### Memory and utilisation")
    assert "| torch | ddp | GPU | 1 | – | 65 | nvml |" in gpu


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


def test_committed_records_of_two_machines_give_one_page(tmp_path):
    """The reference records: the CPU and the H100 both shown, nothing left out as not
    comparable."""
    root = fixture_records.FIXTURE.parents[2]
    paths = [str(root / "results" / f) for f in ("cpu-2core.jsonl", "gpu-h100.jsonl")]
    assert report.build(paths, tmp_path, echo=lambda *_: None) == 0
    md = (tmp_path / "report.md").read_text()
    cpu = section(md, "2 virtual devices on 2 CPU cores (AMD EPYC), preset cpu")
    gpu = section(md, "1 x NVIDIA H100 80GB HBM3, preset full")
    assert "| torch | scratch | GPU | gpu | full | 0.827 | 0.524 ± 0.032 s (n=10) |" in gpu
    assert "| torch | ddp+compiled | GPU | gpu | full | 0.930 | 2.13 ± 0.01 s (n=10) |" in gpu
    row = "| jax | scratch | shared | cpu (virtual) | cpu | 0.823 | 24.2 ± 0.5 s (n=10) |"
    assert row in cpu and "| 2.07x |" not in cpu  # 24.2 / 11.7 on shared cores: no speedup
    left = md.split("\n## Left out\n", 1)[1]
    assert "Older records of the same cell" in left and "Not asked for" not in left


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


def test_records_are_numbered_in_the_order_of_the_files_read(tmp_path):
    """An entry's order is its position over every file read, the first file's first: the
    tie-breaker between equal timestamps and the order of the environments (E1, ...)."""
    paths = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for path, framework in zip(paths, ("jax", "torch"), strict=True):
        for devices in (1, 2):
            rec = fixture_records.lenet(framework, devices, 5.0, 0.1, 0.8, 1.0)
            results.append(rec, path)
    entries = records.read(paths, [])
    assert [(e.order, e.rec.framework) for e in entries] == [
        (0, "jax"),
        (1, "jax"),
        (2, "torch"),
        (3, "torch"),
    ]
    assert list(records.environments(entries).values()) == ["E1", "E2"]
    assert next(iter(records.environments(entries))).split("; ")[2].startswith("jax ")


def test_one_cpu_name_with_two_isas_is_two_machines(tmp_path):
    """A VM's CPU name hides its ISA: an AVX2 and an AVX-512 'AMD EPYC' time differently, so
    their records are not compared in one table; records made before `cpu_isa` stay a group."""
    hw = fixture_records.HARDWARE
    isas = [
        {**hw, "cpu_isa": "avx2", "isa_caps": {}},
        {**hw, "cpu_isa": "avx512_bf16", "isa_caps": {}},
        {**hw, "cpu_isa": "avx512_bf16", "isa_caps": {"ONEDNN_MAX_CPU_ISA": "AVX2"}},
        hw,
    ]
    path = tmp_path / "r.jsonl"
    for i, hardware in enumerate(isas):
        rec = fixture_records.lenet("torch", 1, 5.0 + i, 0.1, 0.8, 1.0, hardware=hardware)
        results.append(rec, path)
    data = report.load([str(path)])
    assert [m.title for m in data.machines] == [
        "1 virtual device on 2 CPU cores (Fixture CPU, AVX2), preset cpu",
        "1 virtual device on 2 CPU cores (Fixture CPU, AVX512_BF16), preset cpu",
        "1 virtual device on 2 CPU cores (Fixture CPU, AVX512_BF16 capped at AVX2), preset cpu",
        "1 virtual device on 2 CPU cores (Fixture CPU), preset cpu",
    ]
    assert not data.superseded  # four groups, not one cell whose newest record wins


def test_selected_preset_leaves_the_others_out(tmp_path):
    lines = []
    code = report.build([str(fixture_records.FIXTURE)], tmp_path, preset="smoke", echo=lines.append)
    assert code == 0
    md = (tmp_path / "report.md").read_text()
    rows = table_rows(md, "lenet", SMOKE)
    assert list(rows) == [("jax", "scratch")]
    assert rows[("jax", "scratch")]["sec/epoch (1 dev)"] == "0.500 ± 0.010 s (n=3)"
    assert "No resnet18 records in this group." in md
    assert f"\n## {CPU}\n" not in md and f"\n## {GPU}\n" not in md
    assert re.search(r"torch lenet scratch, 2 device.*: not preset smoke", md)
    assert re.search(r"torch resnet18 ddp, 1 device.*gpu, preset full.*: not preset smoke", md)


def test_nothing_of_the_preset_asked_for_is_an_error(tmp_path, capsys):
    out = tmp_path / "out"
    code = report.main(
        [
            "--results",
            str(fixture_records.FIXTURE),
            "--out",
            str(out),
            "--preset",
            "smoke",
            "--platform",
            "gpu",
        ]
    )
    err = capsys.readouterr().err
    assert code == report.EXIT_NO_RESULTS and "Traceback" not in err
    assert err.startswith("error: none of the 51 usable record(s) in ")
    assert (
        "is preset smoke, platform gpu (there are: preset cpu on cpu; preset full on gpu; "
        "preset smoke on cpu); choose one of those" in err
    )
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()  # nothing written


def test_a_good_report_is_not_overwritten_when_nothing_is_comparable(tmp_path, capsys):
    out = tmp_path / "out"
    assert report.main(["--results", str(fixture_records.FIXTURE), "--out", str(out)]) == 0
    good = (out / "report.md").read_text()
    capsys.readouterr()
    fixture = str(fixture_records.FIXTURE)
    for argv in (
        ["--results", fixture, "--preset", "smoke", "--platform", "gpu"],  # nothing asked for
        ["--results", str(tmp_path / "missing.jsonl")],  # nothing at all
    ):
        code = report.main([*argv, "--out", str(out)])
        err = capsys.readouterr().err
        assert code == report.EXIT_NO_RESULTS and len(err.strip().splitlines()) == 1
        assert err.strip().endswith(f"{out / 'report.md'} left as it was")
        assert (out / "report.md").read_text() == good


@pytest.mark.parametrize(
    "make, read_only, problem",
    [
        (lambda p: p.write_text("a file"), None, "is not a folder"),
        (lambda p: p.mkdir(), "itself", "is not writable"),
        (lambda p: None, "parent", "cannot be created: "),
        (lambda p: p.parent.rmdir() or p.parent.write_text("a file"), None, "cannot be created: "),
    ],
    ids=["a file", "read-only", "parent read-only", "parent a file"],
)
def test_an_unwritable_report_folder_is_one_line_before_any_work(
    tmp_path, capsys, monkeypatch, make, read_only, problem
):
    out = tmp_path / "sub" / "out"
    out.parent.mkdir()
    make(out)
    if read_only:  # as os.access says on a read-only folder (root may write anywhere)
        denied = (out if read_only == "itself" else out.parent).resolve()
        monkeypatch.setattr(os, "access", lambda p, mode: Path(p).resolve() != denied)
    monkeypatch.setattr(report, "build", lambda *a, **k: pytest.fail("worked before checking"))
    code = report.main(["--results", str(fixture_records.FIXTURE), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == report.EXIT_BAD_INPUT and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: cannot write the report: {out} {problem}")
    assert err.strip().endswith("choose another --out (REPORTS=)")


def test_an_undecodable_line_is_skipped_like_a_malformed_one(tmp_path):
    path = tmp_path / "r.jsonl"
    good = fixture_records.FIXTURE.read_bytes()
    path.write_bytes(b"\x89PNG\x1a\xff\xfe\x00 binary\n" + good)
    lines = []
    assert report.build([str(path)], tmp_path / "out", echo=lines.append) == 0
    left = (tmp_path / "out" / "report.md").read_text().split("\n## Left out\n", 1)[1]
    assert f"{path}:1: bad results line" in left  # the binary line
    assert f"{path}:5: bad results line" in left  # the fixture's malformed line, one further
    assert any(x.startswith(f"warning: {path}:1: bad results line (") for x in lines)


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
        [
            "--results",
            str(fixture_records.FIXTURE),
            str(tmp_path / "nope.jsonl"),
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    assert "nope.jsonl: no such results file" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(extra=[1, 2]), "extra is not an object"),
        (dict(test_acc="high"), "test_acc must be a number from 0 to 1, got 'high'"),
        (dict(test_acc_per_epoch="abc"), "test_acc_per_epoch is not a list of numbers"),
        (dict(devices=0), "devices must be a whole number >= 1"),
        (dict(sec_per_epoch={"mean": 1.0}), "sec_per_epoch has no positive median"),
        (dict(platform="tpu"), "unknown platform 'tpu'"),
        (dict(workload="bert"), "unknown workload 'bert'"),
        # fields of the wrong type in a hand-edited or foreign record, each once a traceback
        (dict(hardware={**HW, "cpu": 7}), "hardware.cpu must be a string, got 7"),
        (dict(hardware={**HW, "gpus": [{"name": 3}]}), "hardware.gpus must be a list of GPUs"),
        (dict(hardware={**HW, "cpu_count": "two"}), "hardware.cpu_count must be a whole number"),
        (dict(git_commit=123), "git_commit must be a string, got 123"),
        (dict(steps_timed=[20]), "steps_timed must be a whole number >= 1 (at most 2147483648)"),
        (
            dict(batch_size="256"),
            "batch_size must be a whole number >= 1 (at most 2147483648), got '256'",
        ),
        (dict(devices=1e30), "devices must be a whole number >= 1 (at most 65536), got 1e+30"),
        (dict(devices=10**30), "devices must be a whole number >= 1 (at most 65536), got 1000"),
        (
            dict(sec_per_epoch={"median": 1.0, "std": -0.5, "n": 3}),
            "sec_per_epoch std must be a number >= 0, got -0.5",
        ),
        (dict(sec_per_epoch={"median": 1.0, "std": 0.1, "n": "3"}), "sec_per_epoch n must be a"),
        (
            dict(extra={"ceiling": {"sec_per_epoch": {"median": "fast"}}}),
            "extra.ceiling.sec_per_epoch has no positive median (got 'fast')",
        ),
        (
            dict(extra={"ceiling": {"sec_per_epoch": {"median": None, "std": 0}}}),
            "extra.ceiling.sec_per_epoch has no positive median (got None)",
        ),
        (dict(extra={"amp": 16}), "extra.amp must be a string, got 16"),
        (
            dict(extra={"utilization": [1], "utilization_source": 7, "memory_source": "x"}),
            "extra.utilization_source must be a string, got 7",
        ),
        (dict(versions={"torch": 2.15}), "versions must be an object of strings"),
        (dict(virtual="yes"), "virtual must be true or false, got 'yes'"),
        (dict(test_acc=85.0), "test_acc must be a number from 0 to 1, got 85.0"),
        (dict(schema=99), "schema 99 is not one this report reads (schema 1)"),
        (dict(strategy=None), "strategy and preset must be strings"),
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
    assert records.problem(bad).startswith(reason)  # the one reason, first


def diverged_records() -> list[Record]:
    """torch lenet: 10 s on 1 device, and on 2 a faster run that diverged in epoch 2; jax lenet
    diverged in epoch 1 with its times null; torch resnet50: single diverged, model_parallel 2 s,
    and a sweep whose split 3 diverged."""
    lenet, r50 = fixture_records.lenet, fixture_records.resnet50
    null_times = {"median": None, "mean": None, "std": None, "min": None, "max": None, "n": 1}
    return [
        lenet("torch", 1, 10.0, 0.5, 0.812, 6000.0),
        lenet("torch", 2, 1.0, 0.1, 0.1, 60000.0, diverged_at_epoch=2),
        fixture_records.record(
            "jax",
            "lenet",
            "scratch",
            1,
            "2026-11-20T10:00:00+00:00",
            epochs=1,
            sec_per_epoch=null_times,
            test_acc=float("nan"),
            test_acc_per_epoch=[float("nan")],
            train_loss=[float("inf")],
            diverged_at_epoch=1,
        ),
        r50("torch", "single", 0.5, 1, devices=1, diverged_at_epoch=1),
        r50("torch", "model_parallel", 2.0, 2),
        r50("torch", "pipeline", 3.0, 3, split=2, sweep=True),
        r50("torch", "pipeline", 0.1, 4, split=3, sweep=True, diverged_at_epoch=1),
    ]


def test_a_diverged_record_is_shown_as_diverged_never_as_a_time(tmp_path):
    path = tmp_path / "r.jsonl"
    for rec in diverged_records():
        results.append(rec, path)  # as a run writes it: nan as null
    lines = []
    assert report.build([str(path)], tmp_path / "out", echo=lines.append) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    rows = table_rows(md, "lenet")
    torch, jax = rows[("torch", "scratch")], rows[("jax", "scratch")]
    assert torch["sec/epoch (1 dev)"] == "10.0 ± 0.5 s (n=3)"
    assert torch["sec/epoch (2 dev)"] == "diverged at epoch 2"
    assert torch["test acc (2 dev)"] == torch["images/s (2 dev)"] == "–"
    assert torch["speedup (2 dev)"] == torch["efficiency (2 dev)"] == "–"
    assert jax["sec/epoch (1 dev)"] == "diverged at epoch 1" and jax["test acc (1 dev)"] == "–"
    r50 = table_rows(md, "resnet50", keys=1)[("torch",)]
    assert r50["single"] == "diverged at epoch 1" and r50["model_parallel vs single"] == "–"
    assert r50["pipeline, best split"].startswith("3.00 ± ") and r50["best split size"] == "2"
    best = table_rows(md, "## Summary", keys=3)
    assert best[("lenet", "torch", "scratch")][CPU] == "10.0 s (1 dev)"  # not the diverged 1 s
    assert best[("lenet", "jax", "scratch")][CPU] == "diverged at epoch 1 (1 dev)"
    assert best[("resnet50", "torch", "pipeline")][CPU] == "3.00 s (2 dev, split 2)"
    assert tables.DIVERGED_NOTE in md and "diverged at epoch 2" in "\n".join(lines)
    left = md.split("\n## Left out\n", 1)[1]
    assert "Unusable" not in left and "split 3" in left and ": diverged at epoch 1" in left
    readme_rows = readme.dp_table("lenet", records.read([path], [])[:3]).rows
    assert readme_rows[0][1:] == ["0.812 / –", "10.0 ± 0.5 s (n=3)", "diverged at epoch 2", "–"]


def test_a_record_dated_in_the_future_is_left_out_not_shown_over_later_runs(tmp_path):
    """A clock or an edit that dates a record 2099 would make it the newest of its cell forever."""
    now = fixture_records.resnet18("torch", "ddp", 1, 300.0, 0.61, True)
    later = fixture_records.resnet18("torch", "ddp", 1, 999.0, 0.11, True)
    later.timestamp = "2099-01-01T00:00:00+00:00"
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(now.to_dict()) + "\n" + json.dumps(later.to_dict()) + "\n")
    assert report.build([str(path)], tmp_path / "out", echo=lambda _: None) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    body, left = md.split("\n## Left out\n", 1)
    assert "300 ± 0 s" in body and "999" not in body
    assert "timestamp '2099-01-01T00:00:00+00:00' is in the future: fix the record" in left
