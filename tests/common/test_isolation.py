"""common/ is framework-free (docs/design.md): it must import with every framework blocked,
common.traces too, which reads every framework's traces."""

import subprocess
import sys

BLOCK = """
import importlib.abc, sys
BLOCKED = {"torch", "torchvision", "jax", "jaxlib", "flax", "optax", "mxnet"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, Block())
import common.cli, common.config, common.data, common.devices, common.info
import common.processes, common.profiling, common.results, common.stages, common.timing
import common.utilization, common.traces
import common.weights
loaded = BLOCKED & {m.split(".")[0] for m in sys.modules}
assert not loaded, loaded
print("ok")
"""


def test_common_imports_without_any_framework():
    out = subprocess.run([sys.executable, "-c", BLOCK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
