"""Lesson 4's memory and bytes tables (compare/memory.py): ZeRO's closed forms against bytes
worked out by hand, the tables of the fixture records (tests/compare/fixture_zero.py), the
checks a zero record must pass, the report's section and `make compare`'s zero runs."""

from __future__ import annotations

import dataclasses

import pytest

from common.results import Record
from compare import checks, memory, plan, readme, records, report
from tests.compare import fixture_zero

PSI = 1000


def entries():
    warnings = []
    found = records.read([fixture_zero.FIXTURE], warnings)
    valid, invalid = records.check(found)
    assert not warnings and not invalid
    return valid


def row(table, name: str, n: int) -> dict:
    rows = [r for r in table.rows if r[0] == name and r[table.headers.index("N")] == str(n)]
    assert len(rows) == 1, (name, n, table.rows)
    return dict(zip(table.headers, rows[0], strict=True))


def test_the_fixture_file_is_what_its_module_makes():
    assert fixture_zero.FIXTURE.read_text() == fixture_zero.text(), (
        "regenerate: .venv/base/bin/python -m tests.compare.fixture_zero"
    )


# Per device, Ψ = 1000 on 4 devices: 4 bytes a parameter, 4 a gradient, 8 of AdamW's state,
# each kind a quarter where its stage shards it.
BY_HAND = {
    0: {"params": 4000, "grads": 4000, "opt_state": 8000},
    1: {"params": 4000, "grads": 4000, "opt_state": 2000},
    2: {"params": 4000, "grads": 1000, "opt_state": 2000},
    3: {"params": 1000, "grads": 1000, "opt_state": 2000},
}


@pytest.mark.parametrize("stage", sorted(BY_HAND))
def test_closed_forms_are_zeros_per_device_bytes(stage):
    assert memory.closed_form(stage, PSI, 4) == BY_HAND[stage]
    assert memory.closed_form(stage, PSI, 1) == BY_HAND[0]  # one device holds everything


def test_the_update_on_the_servers_leaves_the_state_off_the_devices():
    held = memory.closed_form(1, PSI, 4, state_on=memory.SERVERS)
    assert held == {"params": 4000, "grads": 4000, "opt_state": 0}


def test_formulas_read_as_the_paper_writes_them():
    forms = [memory.formula(s) for s in range(4)]
    assert forms == ["4Ψ + 4Ψ + 8Ψ", "4Ψ + 4Ψ + 8Ψ/N", "4Ψ + (4 + 8)Ψ/N", "(4 + 4 + 8)Ψ/N"]
    mixed = [memory.formula(s, memory.MIXED) for s in range(4)]
    assert mixed == ["2Ψ + 2Ψ + 12Ψ", "2Ψ + 2Ψ + 12Ψ/N", "2Ψ + (2 + 12)Ψ/N", "(2 + 2 + 12)Ψ/N"]


def test_the_textbook_moves_two_psi_and_three_under_stage_three():
    assert [memory.textbook_moved(s) for s in range(4)] == [2, 2, 2, 3]
    both = [
        {"op": "all_reduce", "count": 3, "bytes": 40},
        {"op": "all_gather", "count": 1, "bytes": 8},
    ]
    assert memory.moved(both) == 88  # an all-reduce is a reduce-scatter and an all-gather


def test_the_memory_table_reads_each_device_against_its_closed_form():
    table = memory.memory_table(entries())
    zero2 = row(table, "torch zero2", 2)  # fully_shard pads: 8 bytes more gradients, 16 state
    assert [zero2[k] for k in ("params", "grads", "optimizer state")] == [
        "4.00 kB",
        "2.01 kB",
        "4.02 kB",
    ]
    assert zero2["closed form"] == "4Ψ + (4 + 8)Ψ/N" and zero2["= bytes"] == "10.0 kB"
    assert zero2["most / closed form"] == f"{(10_000 + 24) / 10_000:.3f}"
    # ZeRO-1 in torch splits the state by whole parameters: device 0 holds 60% of it.
    zero1 = row(table, "torch zero1", 2)
    assert zero1["optimizer state"] == "4.80 kB" and zero1["most / closed form"] == "1.067"
    server = row(table, "mxnet server", 2)
    assert server["optimizer state"] == "0 B" and server["closed form"].endswith("on servers)")
    assert row(table, "torch zero3", 4)["= bytes"] == "4.00 kB"
    assert row(table, "jax fsdp", 2)["peak"] == "300 MB (2)"
    assert any("memory_analysis()" in n for n in table.notes)


def test_the_bytes_table_sums_the_ops_in_psi_beside_the_textbook():
    table = memory.bytes_table(entries())
    assert [r[0] for r in table.rows if r[2] == "1"] == []  # one device moves nothing
    zero1 = row(table, "torch zero1", 2)  # an all-reduce (twice) and a broadcast: 3Ψ, not 2Ψ
    assert zero1["all-reduce"] == "4 × 4.00 kB" and zero1["broadcast"] == "2 × 4.00 kB"
    assert (zero1["moved, Ψ"], zero1["textbook, Ψ"]) == ("3.00", "2")
    fsdp = row(table, "jax fsdp", 2)
    assert (fsdp["moved, Ψ"], fsdp["textbook, Ψ"]) == ("3.00", "3")
    assert row(table, "mxnet dist", 2)["push"] == "62 × 4.00 kB"


def test_the_idea_table_sets_each_stage_beside_the_runs():
    table = memory.holds_table(entries(), 2)
    stages = {r[0]: r for r in table.rows}
    assert stages["ZeRO-2"][3] == "10.0 kB" and stages["ZeRO-2"][4] == "zero2: 10.0 kB"
    assert stages["ZeRO-3 / FSDP"][5] == "fsdp: 8.00 kB, fsdp_explicit: 8.00 kB"
    assert stages["ZeRO-2"][6] == "–"  # MXNet: no equivalent
    assert any("parameter-server ancestor" in n for n in table.notes)


def test_the_time_table_sets_each_strategy_against_plain_data_parallel_of_like_cores():
    """A row per run, a column per device count and cores per device; each speedup over the
    1-device baseline of as many cores per device (a core each: 200 s; shared: 150 s)."""
    table = memory.time_table(entries())
    rows = {r[0]: r for r in table.rows}
    assert rows["torch zero3"][-1] == f"{200 / 103:.2f}x at N = 2; {150 / 60:.2f}x at N = 4"
    assert rows["jax fsdp"][-1] == f"{200 / 103:.2f}x at N = 2"
    assert rows["torch zero1"][1:-1] == ["–", "–", "101*", "–"]
    assert table.headers[1:-1] == [
        "N = 1, a core each",
        "N = 1, shared cores",
        "N = 2, a core each",
        "N = 4, shared cores",
    ]


def test_the_pages_memory_grid_has_a_column_per_device_count():
    table = memory.memory_grid(entries())
    grid = {r[0]: dict(zip(table.headers, r, strict=True)) for r in table.rows}
    assert grid["torch zero3"]["N = 4"] == "4.03 kB (1.008); peak 300 MB (1)"
    assert grid["torch zero1"]["N = 2"].startswith("12.8 kB (1.067)")
    assert grid["torch zero1"]["N = 1"] == "–" and grid["mxnet server"]["closed form"].startswith(
        "4Ψ + 4Ψ"
    )


def test_the_pages_bytes_table_keeps_one_device_count():
    assert {r[2] for r in memory.bytes_table(entries(), 2).rows} == {"2"}
    assert {r[2] for r in memory.bytes_table(entries()).rows} == {"2", "4"}


def zero_record(**extra) -> Record:
    fields = fixture_zero.zero("torch", "zero3", 3, "devices", 2, 100.0)
    fields["extra"] = {**fields["extra"], **extra}
    return Record.from_dict(fields)


@pytest.mark.parametrize(
    "extra, why",
    [
        ({"zero_stage": 4}, "extra.zero_stage"),
        ({"zero_stage": True}, "extra.zero_stage"),
        ({"parameters": None}, "extra.parameters"),
        ({"state_bytes": [{"params": 1, "grads": 1, "opt_state": 1}]}, "one per device"),
        ({"state_bytes": [{"params": 1, "grads": -1, "opt_state": 1}] * 2}, "extra.state_bytes"),
        ({"step_collectives": [{"op": "gather", "count": 1, "bytes": 4}]}, "step_collectives"),
        ({"peak_bytes": {"bytes": [1, 2], "source": "rss"}}, "extra.peak_bytes"),
        ({"state_on": "host"}, "extra.state_on"),
    ],
)
def test_a_zero_record_with_a_bad_field_is_left_out_with_its_reason(extra, why):
    assert checks.problem(zero_record()) is None
    assert why in (checks.problem(zero_record(**extra)) or "")


def test_the_report_has_the_memory_and_bytes_tables(tmp_path):
    assert report.build([fixture_zero.FIXTURE], tmp_path, echo=lambda *a: None) == 0
    text = (tmp_path / "report.md").read_text()
    for heading in (report.HEADINGS["zero"], "Memory per device", "What a step moves"):
        assert heading in text
    assert "(4 + 4 + 8)Ψ/N" in text


def test_make_compare_runs_every_zero_strategy_on_two_devices_and_the_baselines_on_one():
    made = plan.make_plan(plan.ALL, ["zero"], "cpu", accelerators=0, cpu_cores=2)
    runs = {(s.framework, s.strategy, s.gpus) for s in made.steps}
    every = {(fw, s, 2) for fw, strategies in plan.ZERO_STRATEGIES.items() for s in strategies}
    baselines = {(fw, s, 1) for fw, s in plan.ZERO_BASELINES.items()}
    assert runs == every | baselines
    assert all(s.cores == 1 for s in made.steps)  # a core per device
    one_gpu = plan.make_plan(plan.ALL, ["zero"], "gpu", accelerators=1)
    assert {s.gpus for s in one_gpu.steps} == {1} and len(one_gpu.skipped) == len(every)


def test_a_record_of_another_engine_field_is_not_read_as_zero():
    e = entries()[0]
    other = dataclasses.replace(e.rec, workload="resnet18")
    assert memory.runs([records.Entry(other, "x", 0)]) == []


def test_the_readme_tables_of_zero_records_hold_the_memory_grid():
    (machine,) = readme.load([str(fixture_zero.FIXTURE)])
    found = readme.machine_tables(machine)
    assert [t.headers[:2] for t in found][-1] == ["run", "closed form"]
    assert found[0].headers[0].startswith("zero")  # the time table first, as lesson 2's
