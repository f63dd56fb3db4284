"""Each lesson's "What moves between devices" shows a table the docs hook writes from
common.collectives.moves (tools/docs_hook.py, `--8<-- "common/collectives.py:moves:WORKLOAD"`),
the collectives each framework's suite counts from its engine (tests/*_impl/test_collectives.py),
BatchNorm's share in it. Framework-free: the docs build runs in .venv/base."""

import re
from pathlib import Path

import pytest

from common import collectives, flops
from compare.scaling_report import fmt_bytes
from tools import docs_hook

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## What moves between devices\n"


def rows_of(workload: str) -> list[dict[str, str]]:
    """The hook's table for `workload`, a dict per row under its header's names."""
    lines = [x for x in docs_hook._moves_table(workload).splitlines() if x.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines]
    return [dict(zip(cells[0], row, strict=True)) for row in cells[2:]]


@pytest.mark.parametrize("workload", ["lenet", "resnet18"])
def test_each_lessons_what_moves_is_the_generated_table(workload):
    page = (ROOT / "docs" / "lessons" / f"{workload}.md").read_text()
    section = page.split(SECTION, 1)[1].split("\n## ", 1)[0]
    assert f'--8<-- "common/collectives.py:moves:{workload}"' in section
    assert not re.search(r"^\|", section, re.M)  # no table typed beside it


def test_resnet18s_table_counts_each_engines_collectives_with_batchnorms_share():
    rows = {(r["engine"], r["carrying"]): r for r in rows_of("resnet18")}
    gradient = fmt_bytes(flops.gradient_bytes("resnet18"))
    buffers = rows[("torch ddp", collectives.BN_BUFFERS)]
    assert buffers["op"] == collectives.BROADCAST and buffers["of them BatchNorm's"] == "all"
    assert rows[("torch ddp", "gradients")]["bytes a step"] == gradient
    for engine in ("jax sharding", "mxnet gluon, dist"):
        assert rows[(engine, "gradients")]["bytes a step"] == gradient
        assert rows[(engine, "gradients")]["of them BatchNorm's"].startswith("34 ops, ")
    for engine in ("jax sharding", "jax shard_map, pmap", "mxnet gluon, dist"):
        none = rows[(engine, collectives.BN_RUNNING)]  # each device keeps its own
        assert (none["per step"], none["bytes a step"]) == ("0", "–")
    bucket = rows[("jax shard_map, pmap", "gradients and the loss, one buffer")]  # `_bucket`
    assert (bucket["per step"], bucket["bytes a step"]) == ("1", gradient)
    modelled = collectives.step_ops("jax", "sharding", sync_bn=False)
    assert int(rows[("jax sharding", "gradients")]["per step"]) == len(modelled) - 1  # the loss


def test_lenets_table_counts_the_allreduce_calls():
    rows = {r["engine"]: r for r in rows_of("lenet")}
    assert list(rows) == ["torch", "jax", "mxnet"]
    assert [rows[f]["per step"] for f in rows] == ["8", "1", "8"]  # a tensor a call; all at once
    assert sum(collectives.LENET_TENSORS) == flops.PARAMETERS["lenet"]


def test_a_workload_without_a_table_is_an_error():
    with pytest.raises(LookupError, match="no table of what moves for 'resnet50'"):
        docs_hook._moves_table("resnet50")
