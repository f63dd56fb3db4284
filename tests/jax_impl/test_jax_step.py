"""tools/jax_step.py, the probe of JAX's ResNet-18 step three ways, runs on a CPU at tiny sizes
and appends one line with every variant."""

import json

import pytest

from tools import jax_step


@pytest.mark.slow
def test_probe_appends_one_line_with_every_variant(tmp_path, capsys):
    out = tmp_path / "probe.jsonl"
    argv = ["--width", "4", "--batch", "8", "--steps", "2", "--rounds", "1"]
    assert jax_step.main([*argv, "--results", str(out)]) == 0
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert set(line["variants"]) == set(jax_step.VARIANTS)
    assert all(v["ms_per_step"] > 0 for v in line["variants"].values())
    project, one_pass = line["variants"]["project"], line["variants"]["one-pass variance"]
    # the one-pass variance reads the activations once less: fewer bytes, where XLA counts them
    if project["bytes_accessed"] is not None:
        assert one_pass["bytes_accessed"] < project["bytes_accessed"]
    assert "on cpu" in capsys.readouterr().out


def test_bad_sizes_are_one_line(capsys):
    assert jax_step.main(["--steps", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: ")
