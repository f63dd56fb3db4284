"""The collectives benchmark's measuring loop, its cost-model fit and its report section
(common/collectives.py, cluster/allreduce.py, compare/collectives.py), on a world of numpy ranks
and made-up records.
Each engine's own smoke run is in tests/<framework>_impl/test_allreduce.py."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from cluster import allreduce
from cluster import train as cluster
from common import collectives, config, results
from compare import collectives as report
from compare import render

ALPHA, BUSBW = 250e-6, 1.2e9  # a made-up engine: 250 us per all-reduce, 1.2 GB/s per link


class NumpyWorld:
    """`ranks` ranks in one process, every one's call of the collective answered at once: rank
    0 runs the loop, the others' buffers are its own with their values (r + 1, or zeros)."""

    def __init__(self, ranks: int):
        self.rank, self.size = 0, ranks
        self.plan = SimpleNamespace(count=ranks)

    def sum(self, x):
        return np.asarray(x) * self.size  # every rank timed the same


def engine(ranks: int, planted: str | None = None):
    def buffer(elements, check):
        values = np.arange(1, ranks + 1, dtype=np.float32) if check else np.zeros(ranks)
        return np.repeat(values[:, None], elements, axis=1).astype(np.float32)

    def reduce(buf):
        if planted == "one rank lost":
            return buf[1:].sum(axis=0)
        if planted == "no reduce":
            return buf[0]
        return buf.sum(axis=0)

    return buffer, reduce, lambda out: out


CFG = config.get_config("allreduce", "smoke")


def test_every_size_is_checked_and_timed():
    rows = collectives.time_sizes(*engine(4), NumpyWorld(4), CFG)
    assert [r["bytes"] for r in rows] == [4, 16, 64, 256, 1024, 4096]
    for r in rows:
        assert collectives.MIN_ITERS <= r["iters"] <= collectives.MAX_ITERS
        assert r["algbw_Bps"] == pytest.approx(r["bytes"] / r["time_s"])
        assert r["busbw_Bps"] == pytest.approx(r["algbw_Bps"] * 2 * 3 / 4)  # 2(n-1)/n


@pytest.mark.parametrize("planted", ["one rank lost", "no reduce"])
def test_a_wrong_sum_ends_the_run(planted):
    with pytest.raises(RuntimeError, match="summed wrong"):
        collectives.time_sizes(*engine(3, planted), NumpyWorld(3), CFG)


def test_the_sizes_are_powers_of_4_up_to_64_mib():
    full = collectives.sizes(config.get_config("allreduce", "cpu").max_bytes)
    assert full[0] == 4 and full[-1] == 64 * 2**20 and len(full) == 13


def test_training_options_are_refused():
    args = SimpleNamespace(compile=True, amp="off", ceiling=False, profile=None, sync_bn=False)
    with pytest.raises(config.ConfigError, match="--compile applies to training"):
        collectives.check(args)


def rows_of(sizes, ranks, alpha=ALPHA, busbw=BUSBW, noise=None):
    f = 2 * (ranks - 1) / ranks
    rows = []
    for i, s in enumerate(sizes):
        t = (alpha + f * s / busbw) * (1 + (noise[i] if noise is not None else 0))
        rows.append(collectives.row(s, 5, t, ranks))
    return rows


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_the_fit_recovers_alpha_and_busbw(ranks):
    alpha, busbw, error = report.fit(rows_of(collectives.sizes(4**13), ranks), ranks)
    assert alpha == pytest.approx(ALPHA, rel=1e-9)
    assert busbw == pytest.approx(BUSBW, rel=1e-9)
    assert error < 1e-9


def test_the_fit_holds_under_noise_and_says_how_well():
    noise = np.random.default_rng(0).uniform(-0.1, 0.1, 13)
    alpha, busbw, error = report.fit(rows_of(collectives.sizes(4**13), 4, noise=noise), 4)
    assert alpha == pytest.approx(ALPHA, rel=0.15) and busbw == pytest.approx(BUSBW, rel=0.15)
    assert 0.01 < error < 0.15


def test_one_size_far_faster_than_the_rest_does_not_pull_alpha_down():
    """gloo's 4 B all-reduce can take a tenth of its 16 B one: weighed by 1 / its own time, that
    one size would set alpha near its time and leave every other small size ~90% off."""
    rows = rows_of(collectives.sizes(4**13), 2)
    rows[0] = collectives.row(4, 5, ALPHA / 15, 2)
    alpha, busbw, error = report.fit(rows, 2)
    # its -93% among 13 squared errors still moves alpha by about a tenth; 1 / t moved it 90%
    assert alpha == pytest.approx(ALPHA, rel=0.15) and busbw == pytest.approx(BUSBW, rel=0.15)
    assert error < 0.15


def test_a_latency_bound_run_fits_no_bandwidth():
    alpha, busbw, _ = report.fit(rows_of(collectives.sizes(4**6), 2), 2)
    assert busbw is None and alpha == pytest.approx(ALPHA, rel=1e-3)


def test_no_negative_latency():
    alpha, busbw, _ = report.fit(rows_of(collectives.sizes(4**13), 2, alpha=0.0), 2)
    assert alpha >= 0 and busbw == pytest.approx(BUSBW, rel=1e-6)


def record(fw="torch", ranks=2, link="loopback", rate=None, when="2026-11-29T05:00:00+00:00"):
    return {
        "workload": "allreduce",
        "framework": fw,
        "collective": "a <b>collective</b> | of its own",
        "ranks": ranks,
        "rows": rows_of(collectives.sizes(4**13), ranks),
        "link": {"name": link, "rate_bps": rate},
        "extra": {},
        "hardware": {"cpu": "x"},
        "platform": "cpu",
        "timestamp": when,
    }


def write(path, lines):
    path.write_text("".join(json.dumps(x) + "\n" if not isinstance(x, str) else x for x in lines))
    return path


def test_a_results_file_holds_both_kinds(tmp_path):
    """The training report leaves the all-reduce lines out silently; this module reads only
    them, and names a broken one."""
    bad = record(ranks=1)
    path = write(tmp_path / "mixed.jsonl", [record(), bad, "not json\n"])
    assert results.load(path, skip_bad=True, warnings=(w := [])) == []
    assert len(w) == 1 and "mixed.jsonl:3" in w[0]
    warnings = []
    assert len(report.load(path, warnings)) == 1
    assert len(warnings) == 1 and "mixed.jsonl:2" in warnings[0] and "ranks" in warnings[0]


def test_the_section_keeps_the_newest_run_of_each_setting(tmp_path):
    records = [
        record(when="2026-11-28T00:00:00+00:00", ranks=4),
        record(ranks=4),
        record(fw="mxnet", link="1gbit", rate=1e9),
        record(fw="jax", ranks=8),
    ]
    kept = report.latest(records)
    assert [(r["framework"], r["ranks"]) for r in kept] == [("torch", 4), ("jax", 8), ("mxnet", 2)]
    assert kept[0]["timestamp"].startswith("2026-11-29")
    doc = render.Doc()
    report.section(doc, records, tmp_path)
    text = doc.markdown(tmp_path)
    assert "<b>" not in text and "&lt;b>collective" in text  # what records carry is escaped
    fitted = [line for line in text.splitlines() if line.startswith("| torch | a")]
    assert len(fitted) == 1 and "| 250 | 1.2 | 0% |" in fitted[0], fitted
    assert (tmp_path / "collectives.png").stat().st_size > 0
    assert "2 ranks, link 1gbit" in text and "8 ranks, loopback, shared cores" in text


def namespaces_refused() -> str | None:
    from common import netns

    try:
        netns.check_can_make()
    except netns.NetnsError as e:
        return str(e)
    return None


VENVS = [cluster.ROOT / ".venv" / fw / "bin" / "python" for fw in cluster.ENGINES]


@pytest.mark.slow
@pytest.mark.xdist_group("netns")  # the cluster's cores and namespaces: one at a time
@pytest.mark.skipif(not all(p.exists() for p in VENVS), reason="needs every framework's venv")
@pytest.mark.skipif(bool(namespaces_refused()), reason=f"no namespaces: {namespaces_refused()}")
def test_every_engine_all_reduces_over_a_link_between_two_namespaces(tmp_path):
    """Two nodes of a core each in the cluster in one box, at a link rate that tc holds: every
    engine checks its sums and writes one record, which says where it ran."""
    out = tmp_path / "c.jsonl"
    argv = ["--ranks", "--links", "100mbit", "--preset", "smoke", "--results", str(out)]
    assert allreduce.main(argv) == 0
    records = report.load(out)
    assert sorted(r["framework"] for r in records) == sorted(cluster.ENGINES)
    for rec in records:
        assert rec["link"] == {"name": "100mbit", "rate_bps": 100e6}
        assert rec["nodes"] == 2 and rec["extra"]["cores"] == "a core per node"
        assert [r["bytes"] for r in rec["rows"]][-1] == 4096


def test_the_report_shows_the_all_reduce_beside_the_training_records(tmp_path):
    from compare import report as training_report

    fixture = cluster.ROOT / "tests" / "fixtures" / "compare_results.jsonl"
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(fixture.read_text() + json.dumps(record(fw="jax", ranks=4)) + "\n")
    assert training_report.build([mixed], tmp_path / "out", echo=lambda *_: None) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## Each engine's all-reduce" in text and "4 ranks, loopback, shared cores" in text
    assert (tmp_path / "out" / "collectives.png").is_file()
