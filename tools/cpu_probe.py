"""`python -m tools.cpu_probe`: a few seconds of fixed work that say how fast this machine is
for the test suites. `.ci/run` prints it beside its step times, and docs/results.md ("Test
suite times") beside each measured time, so that suite times taken on different CPU kinds can be
put side by side: a suite that took T s where the probe took P s would take about T * P' / P
where it takes P'. (The CPU kind of a CI machine varies, and so does its speed.)

Two kinds of work, each the median of three tries, on one core: the Python interpreter's (the
suites' imports, process starts and the frameworks' tracing run in it) and float32 matrix
products, numpy's, in one thread (their kernels). Then the same work in one process per core
this process may use, all at once: where those cores are hyperthreads sharing fewer physical
cores, together they do well under that many times one core's work, and pytest-xdist's
workers gain as little.
"""

import os
import statistics
import subprocess
import sys
import time

# One thread per process: the probe measures cores, one at a time, then side by side.
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
PYTHON_STEPS = 10_000_000  # about half a second on one core
MATMUL_SIZE, MATMUL_REPEATS = 256, 1500  # likewise
TRIES = 3


def python_seconds() -> float:
    """The median of TRIES runs of a fixed interpreter loop."""
    times = []
    for _ in range(TRIES):
        begun, total = time.perf_counter(), 0
        for i in range(PYTHON_STEPS):
            total += i * i % 7
        times.append(time.perf_counter() - begun)
    return statistics.median(times)


def matmul_gflops() -> float:
    """The median of TRIES rates of float32 matrix products in one thread (ONE_THREAD is in the
    environment before numpy loads: its BLAS reads it once)."""
    import numpy as np

    a = np.random.default_rng(0).random((MATMUL_SIZE, MATMUL_SIZE), dtype=np.float32)
    times = []
    for _ in range(TRIES):
        begun = time.perf_counter()
        for _ in range(MATMUL_REPEATS):
            a @ a
        times.append(time.perf_counter() - begun)
    return 2 * MATMUL_SIZE**3 * MATMUL_REPEATS / statistics.median(times) / 1e9


def one_core() -> str:
    return f"{python_seconds()!r} {matmul_gflops()!r}"


def side_by_side(n: int) -> list[tuple[float, float]]:
    """(python seconds, matmul GFLOP/s) of `n` processes started together, one per core."""
    env = {**os.environ, **ONE_THREAD}
    code = "from tools import cpu_probe; print(cpu_probe.one_core())"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, "-c", code]
    pipe = {"stdout": subprocess.PIPE, "text": True}
    procs = [subprocess.Popen(cmd, cwd=root, env=env, **pipe) for _ in range(n)]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    return [(float(py), float(mm)) for py, mm in outs]


def summary(one: tuple[float, float], together: list[tuple[float, float]]) -> str:
    """The probe's line: one core's measures, and the work of all cores at once in one core's."""
    py, mm = one
    python_work = sum(py / t for t, _ in together)
    matmul_work = sum(rate for _, rate in together) / mm
    return (
        f"cpu probe: one core: python {py:.2f} s, float32 matmul {mm:.1f} GFLOP/s; "
        f"{len(together)} cores at once: {python_work:.2f}x and {matmul_work:.2f}x one core's work"
    )


def main() -> int:
    cores = len(os.sched_getaffinity(0))
    [one] = side_by_side(1)
    print(summary(one, side_by_side(cores) if cores > 1 else [one]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
