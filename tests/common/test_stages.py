from types import SimpleNamespace

import pytest

from common import config, stages


def test_tutorial_split_for_two_stages():
    first, second = stages.stage_blocks(2)
    assert first[0] == "stem" and first[-1] == "layer2.3" and second[0] == "layer3.0"
    assert second[-1] == "head" and len(stages.BLOCKS) == 18


@pytest.mark.parametrize("n", [1, 3, 4, 18])
def test_n_stage_split_is_contiguous_and_flop_balanced(n):
    parts = stages.stage_blocks(n)
    assert len(parts) == n and [b for s in parts for b in s] == list(stages.BLOCKS)
    flops = dict(zip(stages.BLOCKS, stages.block_flops(), strict=True))
    per_stage = [sum(flops[b] for b in s) for s in parts]
    # no stage carries more than a fair share plus the largest single block
    assert max(per_stage) <= sum(per_stage) / n + max(flops.values())


def test_too_many_stages_is_a_config_error():
    with pytest.raises(config.ConfigError, match="18 blocks"):
        stages.stage_blocks(19)


def test_a_shallower_network_keeps_each_layers_first_blocks_and_the_tutorials_cut():
    blocks = stages.blocks_of((1, 2, 1, 1))
    assert blocks == ("stem", "layer1.0", "layer2.0", "layer2.1", "layer3.0", "layer4.0", "head")
    assert stages.stage_blocks(2, blocks) == [blocks[:4], blocks[4:]]
    parts = stages.stage_blocks(3, blocks)
    assert [b for s in parts for b in s] == list(blocks) and len(parts) == 3
    for depths in ((0, 4, 6, 3), (3, 5, 6, 3), (3, 4, 6)):
        with pytest.raises(ValueError, match="depths must be 4 numbers"):
            stages.blocks_of(depths)


def args(strategy=None, sweep=False, amp="off"):
    return SimpleNamespace(strategy=strategy, sweep=sweep, amp=amp)


def test_choose_strategies():
    torch_all = ("single", "model_parallel", "pipeline", "gpipe", "1f1b")
    assert stages.choose_strategies(args(), 1, torch_all, "torch") == ["single"]
    assert stages.choose_strategies(args(), 2, torch_all, "torch") == list(stages.DEFAULT)
    assert stages.choose_strategies(args(sweep=True), 2, torch_all, "torch") == ["pipeline"]
    assert stages.choose_strategies(args("1f1b"), 2, torch_all, "torch") == ["1f1b"]
    with pytest.raises(config.ConfigError, match="gpipe and 1f1b are torch only"):
        stages.choose_strategies(args("gpipe"), 2, stages.DEFAULT, "jax")
    with pytest.raises(config.ConfigError, match="needs at least 2 devices"):
        stages.choose_strategies(args("pipeline"), 1, stages.DEFAULT, "jax")
    with pytest.raises(config.ConfigError, match="drop --strategy"):
        stages.choose_strategies(args("single", sweep=True), 2, stages.DEFAULT, "jax")
    with pytest.raises(config.ConfigError, match="float32 only"):
        stages.choose_strategies(args(amp="bf16"), 2, stages.DEFAULT, "mxnet")


def test_one_gpu_runs_the_split_strategies_with_both_stages_on_it():
    chosen = stages.choose_strategies(args(), 1, stages.DEFAULT, "jax", one_gpu=True)
    assert chosen == ["single"]  # the default on one device stays `single`
    for strategy in ("model_parallel", "pipeline"):
        got = stages.choose_strategies(args(strategy), 1, stages.DEFAULT, "jax", one_gpu=True)
        assert got == [strategy]
    assert stages.choose_strategies(args(sweep=True), 1, stages.DEFAULT, "jax", True) == [
        "pipeline"
    ]
    with pytest.raises(config.ConfigError, match="at least 2 devices"):
        stages.choose_strategies(args("1f1b"), 1, ("1f1b",), "torch", one_gpu=True)
    assert stages.stage_devices(["gpu0"], "pipeline") == ["gpu0", "gpu0"]
    assert stages.stage_devices(["gpu0", "gpu1"], "pipeline") == ["gpu0", "gpu1"]
    assert stages.stage_devices(["gpu0", "gpu1"], "single") == ["gpu0"]
