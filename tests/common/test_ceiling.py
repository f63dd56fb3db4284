"""common/ceiling.py without a framework: bad input is one line and no record, before any
measurement; the timing loop's step counts and the record's arithmetic."""

import pytest

from common import ceiling, config, timing, training


def refuse(*args, **kwargs):
    raise AssertionError("main must not run on bad input")


@pytest.mark.parametrize(
    ("framework", "extra", "message"),
    [
        (
            "torch",
            ["--workload", "resnet50"],
            "the ceiling covers lenet and resnet18, not resnet50",
        ),
        ("jax", ["--workload", "lenet", "--gpus", "2"], "the ceiling runs on one device"),
        ("jax", ["--workload", "resnet18", "--compile"], "JAX always compiles (jit); drop it"),
        ("mxnet", ["--workload", "resnet18", "--compile"], "--compile is for torch"),
        ("mxnet", ["--workload", "lenet", "--compile"], "its lenet runs NDArray operations"),
        ("torch", ["--workload", "lenet", "--amp", "bf16"], "lenet runs in float32 only"),
        ("mxnet", ["--workload", "lenet", "--amp", "bf16"], "lenet runs in float32 only"),
        ("torch", ["--workload", "lenet", "--steps", "0"], "--steps must be at least 1, got 0"),
        ("jax", ["--workload", "lenet", "--platform", "gpu"], "no CUDA GPU"),
    ],
)
def test_bad_input_is_one_line_and_no_record(
    tmp_path, capsys, monkeypatch, framework, extra, message
):
    monkeypatch.setattr("common.devices.count_accelerators", lambda: 0)
    argv = [*extra, "--preset", "smoke", "--results", str(tmp_path / "r.jsonl")]
    assert ceiling.run(framework, refuse, argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last
    assert not (tmp_path / "r.jsonl").exists()


def test_an_unwritable_results_path_is_refused_before_measuring(tmp_path, capsys):
    (tmp_path / "f").write_text("a file")
    argv = ["--workload", "lenet", "--preset", "smoke", "--results", str(tmp_path / "f" / "r")]
    assert ceiling.run("torch", refuse, argv) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_measure_runs_warmup_then_timed_repeats_with_one_sync_each():
    calls, syncs = [], []
    timer = ceiling.measure(lambda s: calls.append(s) or s + 1, 0, syncs.append, 2, 3, 4)
    assert calls == list(range(2 + 3 * 4))  # the state threads through every step
    assert len(timer.warmup_times) == 1 and len(timer.times) == 4
    assert len(syncs) == 2 * 5  # a barrier at the start and the end of each region, no more


def test_record_fields_project_the_step_to_an_epoch():
    timer = timing.Timer()
    timer.times = [3.0, 6.0, 4.5]  # seconds per repeat of 3 steps: 1, 2, 1.5 s per step
    timer.warmup_times = [9.0]
    cfg = config.get_config("lenet", "cpu")
    fields = ceiling.record_fields(timer, cfg, "off", 2, 3)  # 235 steps per epoch
    x = fields["extra"]
    assert (x["s_per_step"], x["s_per_epoch"], x["repeats"]) == (1.5, 1.5 * 235, 3)
    assert fields["sec_per_epoch"]["median"] == 1.5 * 235 and fields["sec_per_epoch"]["n"] == 3
    assert fields["images_per_sec"] == cfg.batch_size / 1.5
    assert (fields["strategy"], fields["steps_timed"], fields["extrapolated"]) == (
        "ceiling",
        3,
        True,
    )
    assert fields["warmup_seconds"] == 9.0


def test_steps_default_to_the_preset_and_never_exceed_a_bounded_epoch():
    args = ceiling.parser("torch").parse_args(["--workload", "resnet18"])
    assert ceiling.counts(args, config.get_config("resnet18", "cpu")) == (2, 10, 3)
    assert ceiling.counts(args, config.get_config("lenet", "cpu")) == (2, 20, 3)
    args = ceiling.parser("torch").parse_args(["--workload", "lenet", "--steps", "7"])
    assert ceiling.counts(args, config.get_config("lenet", "smoke")) == (1, 7, 2)


class Clock:
    """A clock that each step of the ceiling advances by `per_step[epoch]` seconds."""

    def __init__(self):
        self.now, self.per_step = 0.0, 1.0

    def __call__(self):
        return self.now

    def step(self, state):
        self.now += self.per_step
        return state + 1


def test_a_training_run_pairs_each_epoch_with_a_ceiling_repeat_beside_it():
    clock = Clock()
    probe = ceiling.Paired(clock.step, 0, lambda _: None, warmup=2, steps=4, clock=clock)
    log = training.EpochLog(epochs=3, full_steps=10, quiet=True, ceiling=probe)
    # The machine drifts (steps of 4, 1 and 2 s); the epochs are 1.1, 1.2 and 1.3x the pace of
    # the repeat beside them.
    for epoch, (pace, x) in enumerate(((4.0, 1.1), (1.0, 1.2), (2.0, 1.3))):
        clock.per_step = pace
        log.add(1.0, 0.5, seconds=x * pace * 5, steps=5, images=5 * 64)
        assert len(probe.timer.times) == epoch + 1 and probe.last == [2 + 4 * (epoch + 1)]
    assert probe.timer.warmup_times == [8.0]  # once, before the first repeat, untimed
    c = log.record_fields(warmup_seconds=0.0)["ceiling"]
    # paired: the median of 1.1, 1.2, 1.3; the medians' ratio (26 / 20 = 1.3) would mix states
    assert c["x_ceiling"] == pytest.approx(1.2)
    assert c["ratios"] == pytest.approx([1.1, 1.2, 1.3])
    assert c["sec_per_epoch"]["median"] == 20.0 and c["s_per_step"] == 2.0
    assert (c["repeats"], c["steps_timed"], c["warmup_steps"]) == (3, 4, 2)


def test_a_diverged_epoch_gets_no_repeat_and_no_ratio():
    clock = Clock()
    probe = ceiling.Paired(clock.step, 0, lambda _: None, warmup=1, steps=2, clock=clock)
    log = training.EpochLog(epochs=3, full_steps=4, quiet=True, ceiling=probe)
    log.add(1.0, 0.5, seconds=8.0, steps=4, images=4)
    log.add(float("nan"), 0.1, seconds=8.0, steps=4, images=4)
    assert log.diverged == 2 and len(probe.timer.times) == 1
    assert log.record_fields(0.0)["ceiling"]["x_ceiling"] == 2.0


def test_without_a_probe_the_record_has_no_ceiling():
    log = training.EpochLog(epochs=1, full_steps=4, quiet=True)
    log.add(1.0, 0.5, seconds=8.0, steps=4, images=4)
    assert "ceiling" not in log.record_fields(0.0)
