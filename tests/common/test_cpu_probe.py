"""tools/cpu_probe.py: the line .ci/run prints to put suite times of CPU kinds side by side."""

from tools import cpu_probe


def test_cores_that_share_one_core_do_one_cores_work():
    """Two hyperthreads of one core each take twice as long: together, one core's work."""
    line = cpu_probe.summary((0.5, 100.0), [(1.0, 50.0), (1.0, 50.0)])
    assert line.endswith("2 cores at once: 1.00x and 1.00x one core's work"), line
    line = cpu_probe.summary((0.5, 100.0), [(0.5, 100.0), (0.625, 80.0)])
    assert "python 0.50 s, float32 matmul 100.0 GFLOP/s" in line
    assert line.endswith("1.80x and 1.80x one core's work"), line


def test_one_core_measures_both_kinds_of_work(monkeypatch):
    monkeypatch.setattr(cpu_probe, "PYTHON_STEPS", 1000)
    monkeypatch.setattr(cpu_probe, "MATMUL_REPEATS", 2)
    seconds, rate = map(float, cpu_probe.one_core().split())
    assert 0 < seconds < 1 and rate > 0
