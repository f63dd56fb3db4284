"""common.cli in process; the bad inputs a user types are in tests/fixtures/bad_inputs.py."""

import argparse
import importlib

import pytest

from common import cli, config


def test_bad_setting_fails_before_the_framework_is_imported(monkeypatch, capsys):
    monkeypatch.setattr(importlib, "import_module", lambda name: pytest.fail("imported"))
    argv = [
        "--workload",
        "resnet50",
        "--platform",
        "cpu",
        "--preset",
        "smoke",
        "--split-size",
        "99",
    ]
    assert cli.run("torch", argv) == 2
    assert "split_size must be between 1 and the batch size 4" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("framework", "workload", "platform", "message"),
    [
        ("jax", "lenet", "cpu", "lenet runs in float32 only"),
        ("mxnet", "resnet18", "gpu", "on a GPU use --amp off"),
        ("mxnet", "resnet18", "cpu", None),
        ("torch", "resnet18", "gpu", None),
    ],
)
def test_bf16_where_a_bf16_path_exists(framework, workload, platform, message):
    args = argparse.Namespace(workload=workload, amp="bf16")
    if message is None:
        cli.check_amp(framework, args, platform)
    else:
        with pytest.raises(config.ConfigError, match=message):
            cli.check_amp(framework, args, platform)


@pytest.mark.parametrize(
    ("framework", "platform", "amp", "has_bf16", "noted"),
    [
        ("torch", "cpu", "bf16", False, True),
        ("jax", "cpu", "bf16", False, True),
        ("torch", "cpu", "bf16", True, False),  # bf16 arithmetic: it can pay
        ("torch", "gpu", "bf16", False, False),
        ("torch", "cpu", "off", False, False),
        ("mxnet", "cpu", "bf16", False, False),  # refused on AVX2 (use_bf16), emulated on AVX-512
    ],
)
def test_bf16_on_a_cpu_without_bf16_arithmetic_is_noted(
    monkeypatch, framework, platform, amp, has_bf16, noted
):
    monkeypatch.setattr(cli.devices, "cpu_has_bf16", lambda: has_bf16)
    note = cli.bf16_note(framework, argparse.Namespace(amp=amp), platform)
    assert (note is not None) is noted
    if noted:
        assert note.startswith("note: this CPU has no bf16 arithmetic") and "\n" not in note
        assert "measured" in note and "float32" in note


def test_missing_workload_module_says_not_implemented(monkeypatch, capsys):
    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(importlib, "import_module", missing)
    assert cli.run("jax", ["--workload", "lenet", "--platform", "cpu", "--preset", "smoke"]) == 3
    assert "not implemented yet for jax" in capsys.readouterr().err


def test_final_line_d2l_style():
    from common import devices

    plan = devices.DevicePlan(2, "cpu", True)
    assert (
        cli.final_line(0.8412, 2.84, plan, False)
        == "test acc: 0.84, 2.8 sec/epoch on [2 x cpu (virtual)]"
    )
    assert "(extrapolated)" in cli.final_line(0.1, 2.0, plan, True)
