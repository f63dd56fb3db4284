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
