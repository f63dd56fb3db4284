"""tests/fixtures/gpu_checks.SmokeRuns, the GPU tier's runner, on the CPU: the GPU tests start
their smoke runs together and finish them one by one, so each must keep to its own files."""

import pytest

from tests.fixtures import gpu_checks


@pytest.mark.slow
def test_runs_started_together_finish_one_by_one_and_close_stops_the_rest(tmp_path):
    runs = gpu_checks.SmokeRuns("torch", tmp_path, platform="cpu")
    try:
        runs.start("lenet", None, "off", ("--epochs", "2"))
        runs.start("lenet", None, "off")
        two, _ = runs.finish("lenet", None, "off", ("--epochs", "2"))
        one, output = runs.finish("lenet", None, "off")
        assert (len(two["train_loss"]), len(one["train_loss"])) == (2, 1)
        assert "on [1 x cpu" in output.splitlines()[-1]
        runs.start("lenet", None, "off", ("--epochs", "3"))
    finally:
        runs.close()  # the last one still going, or all of them after a failure
    proc, path, _, _ = runs.runs[("lenet", None, "off", ("--epochs", "3"))]
    assert proc.poll() is not None and not path.exists()
