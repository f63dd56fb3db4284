"""The ceiling benchmark in jax (jax_impl/ceiling.py): the smoke preset's run and record."""

import pytest

from jax_impl import ceiling, lenet
from tests.fixtures import ceiling_checks


def test_lenet_ceiling_writes_one_ceiling_record(tmp_path, capsys):
    rec = ceiling_checks.run("jax", ceiling.main, "lenet", tmp_path)
    ceiling_checks.check(rec, "jax", "lenet", steps=3, repeats=2)  # the smoke preset's
    ceiling_checks.check_output(capsys.readouterr().out)


@pytest.mark.slow
def test_resnet18_ceiling_runs_the_workload_step(tmp_path):
    extra = ["--steps", "1", "--repeats", "1", "--warmup", "1"]
    rec = ceiling_checks.run("jax", ceiling.main, "resnet18", tmp_path, *extra)
    ceiling_checks.check(rec, "jax", "resnet18", steps=1, repeats=1)


def test_a_training_run_times_its_ceiling_after_each_epoch(tmp_path):
    ceiling_checks.check_in_run("jax", lenet, tmp_path)
