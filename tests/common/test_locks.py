"""The lock files (locks/, `make lock`) and the environment the tests run in (base or mxnet)."""

from pathlib import Path

from tests.fixtures import locks

LOCKS = Path(__file__).resolve().parents[2] / "locks"


def test_this_environment_is_its_lock():
    locks.check_environment()


def test_pins_follow_the_markers_of_this_python(tmp_path):
    lock = tmp_path / "x.txt"
    lock.write_text(
        "# header\n"
        "numpy==1.23.5\n"
        "    # via mxnet\n"
        "fonttools==4.65.0 ; python_full_version < '3.0'\n"
        "fonttools==4.68.0 ; python_full_version >= '3.0'\n"
        "colorama==0.4.6 ; sys_platform == 'no-such-platform'\n"
        "Ml_Dtypes==0.6.0\n"
    )
    assert locks.pins(lock) == {"numpy": "1.23.5", "fonttools": "4.68.0", "ml-dtypes": "0.6.0"}


def test_every_lock_pins_its_framework_and_the_tools():
    want = {
        "base": ["numpy", "pytest", "ruff"],
        "torch": ["torch", "torchvision", "numpy"],
        "jax": ["jax", "jaxlib", "flax", "optax", "numpy"],
        "jax-cuda": ["jax", "jaxlib", "jax-cuda12-plugin", "flax", "optax", "numpy"],
        "mxnet": ["mxnet", "numpy"],
    }
    assert sorted(p.stem for p in LOCKS.glob("*.txt")) == sorted(want)
    for name, packages in want.items():
        text = (LOCKS / f"{name}.txt").read_text()
        assert "make lock" in text.splitlines()[1]  # the command that rewrites it
        for package in packages:
            assert f"\n{package}==" in text, f"locks/{name}.txt does not pin {package}"
