"""common.harness without a framework: Run's and Repeats' clocks wait for what `train` says,
resnet50's repeats and their records, d2l's closing line."""

import json
from types import SimpleNamespace

import numpy as np

from common import config, devices, harness, stages
from tests.fixtures import runs


def test_final_line_d2l_style():
    plan = devices.DevicePlan(2, "cpu", True)
    assert (
        harness.final_line(0.8412, 2.84, plan, False)
        == "test acc: 0.84, 2.8 sec/epoch on [2 x cpu (virtual)]"
    )
    assert "(extrapolated)" in harness.final_line(0.1, 2.0, plan, True)


def test_a_non_finite_loss_marks_the_repeat_that_diverged():
    assert harness.diverged_repeat([2.3, 2.2, 2.1, 2.0], 2) is None
    assert harness.diverged_repeat([2.3, 2.2, 2.1, float("nan")], 2) == 2  # warm-up is repeat 1
    assert harness.diverged_repeat([float("inf"), float("nan")], 1) == 1


def test_round_robin_warms_every_split_size_up_then_takes_each_once_per_round():
    assert harness.round_robin((1, 2, 4), 2, 3) == [1, 1, 2, 2, 4, 4] + [1, 2, 4] * 3
    assert harness.round_robin((None,), 1, 2) == [None] * 3


def test_the_epochs_clock_waits_with_the_sync_given_to_warm_up(capsys):
    """`train` hands its barrier to warm_up; the warm-up and every epoch begin and end with it."""
    cfg = SimpleNamespace(batch_size=4, epochs=2, seed=0)
    ds = (np.zeros((8, 1)), np.zeros(8), np.zeros((4, 1)), np.zeros(4))
    waits = []
    with runs.run_for("lenet", cfg, ds, ["dev0"]) as run:
        for _ in run.warm_up(lambda batches: batches, sync=lambda: waits.append("warm-up")):
            pass
        for parts in run.epochs(lambda batches: batches):
            assert sum(1 for _ in parts) == 2  # 8 images in batches of 4
            run.log(1.0, 3)
    assert waits == ["warm-up"] * 2 * 3  # at the start and end of each timed region
    assert len(run.timer.times) == 2 and len(run.timer.warmup_times) == 1
    assert "epoch 2/2" in capsys.readouterr().out


def filled(repeats, loss=2.0, sync=lambda: None, read=float):
    for _, batches in repeats.timed(sync=sync, read=read):
        for _ in batches:
            repeats.add(loss)
    return repeats


def test_repeats_wait_with_trains_sync_and_read_the_losses_after():
    """Each repeat begins and ends with `train`'s sync; the kept losses are read with its
    `read` once every clock has stopped."""
    cfg = config.get_config("resnet50", "smoke")
    waits, reads = [], []

    def read(loss):
        reads.append(loss)
        return loss

    repeats = filled(harness.Repeats(cfg, (1, 2)), sync=lambda: waits.append(1), read=read)
    n = 2 * (cfg.warmup + cfg.repeats)  # repeats of both split sizes
    assert len(waits) == 2 * n and reads == []
    assert all(len(losses) == n // 2 * cfg.num_batches for _, losses in repeats.results().values())
    assert len(reads) == n * cfg.num_batches


def test_repeats_save_a_record_per_split_size(tmp_path, capsys):
    """A sweep's records, one per split size, marked as such, with what every record says."""
    cfg = config.get_config("resnet50", "smoke")
    fake = SimpleNamespace(device_names=lambda devs: list(devs), versions=dict, threads=lambda: 2)
    args = runs.command_args("resnet50", results=str(tmp_path / "r.jsonl"), sweep=True)
    plan = devices.DevicePlan(2, "cpu", True)
    extra = {"stage_blocks": stages.stage_blocks(2)}
    repeats = filled(harness.Repeats(cfg, (1, 2), sweep=True))
    repeats.save(args, plan, harness.Hooks("jax", fake), "pipeline", extra, ["cpu:0", "cpu:1"])
    recs = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["split_size"] for r in recs] == [1, 2]
    for rec in recs:
        assert rec["extra"]["sweep"] and rec["extra"]["round_robin"]
        assert rec["extra"]["amp"] == "off" and rec["extra"]["threads"] == 2
        assert rec["seconds"]["n"] == cfg.repeats and rec["device_names"] == ["cpu:0", "cpu:1"]
    assert "stages stem..layer2.3 | layer3.0..head" in capsys.readouterr().out
