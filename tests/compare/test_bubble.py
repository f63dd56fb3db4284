"""The pipeline's bubble (compare/resnet50.py): the schedule played out from each stage's measured
compute gives back GPipe's (p - 1) / (m + p - 1) on balanced stages and its known span on
unbalanced ones; the table reads each record's compute spans (not the CPU time older records
carry) and splits the wall time into the schedule's span, the step beyond it and the rest."""

import dataclasses
import json

import pytest

from compare import resnet50
from compare.records import Entry
from tests.compare import fixture_records
from tools import docs_hook

GPIPE_1F1B = [("gpipe", m) for m in (1, 2, 4, 8)] + [("1f1b", m) for m in (2, 4, 8)]


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize(("strategy", "m"), GPIPE_1F1B)
def test_balanced_stages_give_gpipes_formula(strategy, m, p):
    if m < p and strategy == "1f1b":
        return  # 1F1B needs a micro-batch per stage
    busy = resnet50.predicted_busy(strategy, m, [1.0] * p, [2.0] * p)
    assert busy == pytest.approx([1 - resnet50.bubble_fraction(m, p)] * p)


@pytest.mark.parametrize(("strategy", "m"), GPIPE_1F1B)
@pytest.mark.parametrize(
    ("forward", "backward"),
    [([1.0, 3.0], [2.0, 6.0]), ([3.0, 1.0], [2.0, 5.0]), ([1.0, 4.0, 2.0], [3.0, 2.0, 7.0])],
)
def test_unbalanced_stages_take_the_sum_and_the_slowest(strategy, m, forward, backward):
    """GPipe's span: every stage's forward and backward once, and m - 1 more of the slowest
    forward and the slowest backward. 1F1B on two stages, the second the slower: the first
    stage's forward, m of the second's forward and backward, the first's last backward."""
    span = resnet50.schedule_span(strategy, m, forward, backward)
    if strategy == "gpipe":
        slowest = max(forward) + max(backward)
        assert span == pytest.approx(sum(forward) + sum(backward) + (m - 1) * slowest)
    elif len(forward) == 2 and forward[1] + backward[1] >= forward[0] + backward[0]:
        assert span == pytest.approx(forward[0] + m * (forward[1] + backward[1]) + backward[0])
    elif m >= len(forward):  # every stage computes its m micro-batches at least
        assert span >= max(m * (f + b) for f, b in zip(forward, backward, strict=True))


def test_1f1b_runs_a_forward_per_stage_ahead_then_one_of_each():
    """As torch's Schedule1F1B runs them: stage s computes p - s forwards first."""

    def order(s):
        return " ".join(f"{kind}{i}" for kind, i in resnet50.stage_order("1f1b", 4, 2, s))

    assert order(0) == "F0 F1 B0 F2 B1 F3 B2 B3"
    assert order(1) == "F0 B0 F1 B1 F2 B2 F3 B3"


def stage(forward, backward, step, wall, count):
    return {"forward": forward, "backward": backward, "step": step, "wall": wall} | {
        "micro_batches": count
    }


def bubble_records():
    """gpipe at m = 1 and 2, 1f1b at m = 2 (the batch of 24 cut into split sizes 24 and 12),
    two timed batches each; older records carry the stages' CPU time (`stage_busy`) only or
    beside their spans, which the table must not read."""
    old = {"stage_busy": [0.9, 0.9]}
    spans_1 = [stage(0.4, 0.8, 4.0, 5.0, 2), stage(0.6, 1.2, 4.0, 5.0, 2)]
    spans_2 = [stage(0.6, 1.0, 4.2, 5.0, 4), stage(0.8, 1.6, 4.5, 5.0, 4)]
    make = fixture_records.resnet50
    return [
        make("torch", "gpipe", 2.5, 1, split=24, extra=old | {"stage_spans": spans_1}),
        make("torch", "gpipe", 2.5, 2, split=12, extra=old | {"stage_spans": spans_2}),
        make("torch", "1f1b", 2.5, 3, split=12, extra=old | {"stage_spans": spans_2}),
        make("torch", "gpipe", 2.5, 4, split=6, extra=old),  # CPU time only: not shown
    ]


def test_the_table_sets_the_measured_spans_beside_the_schedule():
    entries = [Entry(r, "r.jsonl", i) for i, r in enumerate(bubble_records())]
    table = resnet50.bubble_table(entries)
    rows = {(row[0], row[1]): dict(zip(table.headers, row, strict=True)) for row in table.rows}
    assert sorted(rows) == [("1f1b", "2"), ("gpipe", "1"), ("gpipe", "2")]
    one, two = rows[("gpipe", "1")], rows[("gpipe", "2")]
    # Measured: the compute spans over the wall time, not the CPU time beside them.
    assert one["busy, measured (stage 0 / 1 ...)"] == "0.24 / 0.36"
    assert two["busy, measured (stage 0 / 1 ...)"] == "0.32 / 0.48"
    # m = 1: the stages take turns (f0 + f1 + b1 + b0 per batch), each busy for its own part.
    assert one["busy, with imbalance"] == "0.40 / 0.60"
    assert one["busy, balanced"] == "0.50"
    assert one["compute per micro-batch, ms"] == "600 / 900"
    # m = 2, stage 1 the slower: a batch takes 0.15 + 2 x (0.2 + 0.4) + 0.25 = 1.6 s.
    assert two["busy, with imbalance"] == "0.50 / 0.75"
    assert two["busy, balanced"] == "0.67"
    # The wall time: two batches of that span, the step beyond it, the rest outside the step.
    shares = [two[h] for h in table.headers[-3:]]
    assert shares == ["0.64", "0.26", "0.10"]
    assert rows[("1f1b", "2")]["busy, with imbalance"] == "0.50 / 0.75"
    assert any("1f1b" in note and "per stage" in note for note in table.notes)


def test_measured_busy_is_the_schedules_share_of_the_wall_times_its_busy_share():
    """What the table says of the difference: measured = with imbalance x the span's share."""
    entries = [Entry(r, "r.jsonl", i) for i, r in enumerate(bubble_records())]
    for row in resnet50.bubble_table(entries).rows:
        measured, predicted = ([float(x) for x in cell.split(" / ")] for cell in row[3:5])
        share = float(row[7])
        for got, want in zip(measured, predicted, strict=True):
            assert got == pytest.approx(want * share, abs=0.011)
        assert sum(float(x) for x in row[7:10]) == pytest.approx(1, abs=0.011)


def test_records_of_cpu_time_only_make_no_table():
    make, old = fixture_records.resnet50, {"stage_busy": [0.4, 0.6]}
    records = [make("torch", "gpipe", 2.5, i, split=s, extra=old) for i, s in enumerate((12, 6))]
    assert resnet50.bubble_table([Entry(r, "r.jsonl", i) for i, r in enumerate(records)]) is None


def write(path, recs) -> str:
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in recs))
    return str(path)


def test_the_page_draws_the_bubble_from_the_newest_clean_records(tmp_path):
    """The docs hook's table (`--8<-- "FILE:resnet50:bubble"`): the report's rule (clean
    commits, the newest per cell) and the file, machine and commit it comes from."""
    spans = {"stage_spans": [stage(5.0, 0.0, 5.0, 5.0, 2)] * 2}
    dirty = fixture_records.resnet50("torch", "gpipe", 2.5, 9, split=24, extra=spans)
    dirty = dataclasses.replace(dirty, git_commit="0123456789ab-dirty")  # newer, but dirty
    path = write(tmp_path / "r.jsonl", [*bubble_records(), dirty])
    text = docs_hook._bubble(path)
    row = next(line for line in text.splitlines() if line.startswith("| gpipe | 1 |"))
    assert "| 0.24 / 0.36 | 0.40 / 0.60 | 0.50 |" in row, row
    assert f"`{path}`: Fixture CPU" in text and "commit " in text and "dirty" not in text


def test_a_page_of_records_without_spans_fails_in_one_line(tmp_path):
    make, old = fixture_records.resnet50, {"stage_busy": [0.4, 0.6]}
    path = write(tmp_path / "r.jsonl", [make("torch", "gpipe", 2.5, 1, split=12, extra=old)])
    with pytest.raises(LookupError, match="no gpipe or 1f1b runs with their stages' spans"):
        docs_hook._bubble(path)
