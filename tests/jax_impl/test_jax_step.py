"""tools/jax_step.py, the probe of JAX's ResNet-18 step three ways, runs on a CPU at tiny sizes
and appends one line with every variant."""

import json

import pytest

from tools import jax_step


@pytest.mark.slow
def test_probe_appends_one_line_with_every_variant(tmp_path, capsys):
    out = tmp_path / "probe.jsonl"
    argv = ["--width", "4", "--residuals", "1", "--batch", "8", "--steps", "2", "--rounds", "1"]
    assert jax_step.main([*argv, "--results", str(out), "--hlo", str(tmp_path / "hlo")]) == 0
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert set(line["variants"]) == set(jax_step.VARIANTS)
    assert all(v["ms_per_step"] > 0 for v in line["variants"].values())
    # every program's entry runs its convolutions (as such or fused), and is written whole
    for variant in line["variants"].values():
        ops = variant["entry_opcodes"]
        assert ops.get("convolution", 0) + ops.get("fusion", 0) + ops.get("custom-call", 0) > 0
    assert len(list((tmp_path / "hlo").glob("*.hlo.txt"))) == len(jax_step.VARIANTS)
    project, two_pass = line["variants"]["project"], line["variants"]["two-pass variance"]
    # the one-pass variance reads the activations once less: fewer bytes, where XLA counts them
    if project["bytes_accessed"] is not None:
        assert project["bytes_accessed"] < two_pass["bytes_accessed"]
    # every BatchNorm input (the stem's, two per residual block: 4 blocks), each float32 variance
    # close to float64's: a variance taken over the wrong axes or of the wrong layer is off by O(1)
    variance = line["batch_norm_variance"]
    assert len(variance) == 1 + 2 * 4 and line["residuals"] == 1
    for row in variance.values():
        assert row["kappa"] >= 1 and max(row["one_pass"], row["two_pass"]) < 1e-4
    assert "on cpu" in capsys.readouterr().out


def test_bad_sizes_are_one_line(capsys):
    assert jax_step.main(["--steps", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


HLO = """HloModule jit_step

%fused_computation (p0: f32[4]) -> f32[4] {
  %p0 = f32[4]{0} parameter(0)
  ROOT %negate.1 = f32[4]{0} negate(%p0)
}

ENTRY %main.9 (Arg_0.1: f32[4], Arg_1.2: f32[4]) -> (f32[4], f32[]) {
  %Arg_0.1 = f32[4]{0} parameter(0)
  %Arg_1.2 = f32[4]{0} parameter(1)
  %fusion = f32[4]{0} fusion(%Arg_0.1), kind=kLoop, calls=%fused_computation
  %copy.3 = f32[4]{0} copy(%fusion)
  %all-reduce.4 = f32[] all-reduce(%Arg_1.2), replica_groups={}, to_apply=%add
  ROOT %tuple.5 = (f32[4]{0}, f32[]) tuple(%copy.3, %all-reduce.4)
}
"""


def test_entry_opcodes_count_the_entry_only():
    """Each fusion counts once (its body is not the entry); parameters and tuples are plumbing."""
    assert jax_step.entry_opcodes(HLO) == {"all-reduce": 1, "copy": 1, "fusion": 1}
