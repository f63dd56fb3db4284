"""The suite's comparison rules (tests/fixtures/numerics.py): numpy only."""

import json

import numpy as np
import pytest

from tests.fixtures import numerics


def test_rel_error_is_norm_wise_over_all_arrays():
    want = {"a": np.array([3.0, 0.0]), "b": np.array([[4.0]])}
    got = {"b": np.array([[4.0]]), "a": np.array([3.0, 1.0])}  # key order does not matter
    assert numerics.rel_error(got, want) == pytest.approx(1 / 5)
    assert numerics.rel_error([1.0, 2.0], [0.0, 0.0]) == pytest.approx(np.sqrt(5))


def test_rounding_factor_grows_with_depth_and_reduction():
    assert numerics.rounding_factor(0, 1000) == 1.0
    assert numerics.rounding_factor(39, 3136) == pytest.approx(np.sqrt(1 + 39 * np.log2(3136)))
    assert numerics.rounding_factor(78, 6272) > numerics.rounding_factor(39, 6272)


def test_perturb_draws_float32_sized_noise_the_same_way_every_time():
    arrays = {"w": np.ones((1000,), np.float32), "x": np.full((3, 3), 2.0)}
    a, b = numerics.perturb(arrays), numerics.perturb(dict(reversed(arrays.items())))
    assert all(np.array_equal(a[k], b[k]) for k in arrays) and a["w"].dtype == np.float64
    relative = a["w"] - 1.0
    assert 0.5 * numerics.U32 < relative.std() < 2 * numerics.U32


def test_report_passes_below_the_limit_fails_above_and_logs(tmp_path, monkeypatch, capsys):
    log = tmp_path / "n.jsonl"
    monkeypatch.setenv("NUMERICS_LOG", str(log))
    numerics.report("ok", 1e-9, 1e-8)
    with pytest.raises(AssertionError, match="numerics bad: error 2.00e-08, limit 1.00e-08"):
        numerics.report("bad", 2e-8, 1e-8)
    with pytest.raises(AssertionError):
        numerics.report("nan", float("nan"), 1e-8)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["name"] for x in lines] == ["ok", "bad", "nan"]
    assert "numerics ok: error 1.00e-09" in capsys.readouterr().out


def test_float32_limit_never_goes_below_float32s_own_rounding():
    want = np.array([1.0, 2.0])
    got = want * (1 + 3 * numerics.U32)  # three ulps off, with a "sensitivity" of 0
    numerics.check_float32("floor", got, want, 0.0, stages=4, reduction=100)
    with pytest.raises(AssertionError):
        numerics.check_float32("far", want * (1 + 1e-3), want, 0.0, stages=4, reduction=100)
    with pytest.raises(AssertionError):
        numerics.check_same_math("float64", want * (1 + 1e-6), want)


def test_every_planted_bug_still_applies():
    """Each mutant's text occurs exactly once in its file and its test exists, so a refactor
    cannot silently turn `make mutants` into a list of bugs that no longer plant."""
    from pathlib import Path

    from tests.numerics_mutants import ROOT, all_mutants
    from tests.torch_impl.mutants import GPU_MUTANTS

    # The GPU tier's bugs too: planted only where a GPU is, their text is checked everywhere.
    for m in {m.id: m for m in [*all_mutants(), *GPU_MUTANTS]}.values():
        text = (ROOT / m.path).read_text()
        assert text.count(m.old) == 1, f"{m.id}: its text occurs {text.count(m.old)}x in {m.path}"
        test_file, _, name = m.test.partition("::")
        name = name.split("[")[0]
        assert f"def {name}(" in Path(ROOT / test_file).read_text(), f"{m.id}: no {m.test}"
