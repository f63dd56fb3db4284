"""What JAX's `sharding` step exchanges. With per-device BatchNorm (the default, as torch DDP
and MXNet Gluon) each device's share is normalised where it lives: the step all-reduces the
gradient (and the running statistics, small), nothing in the forward pass. With --sync-bn the
model sees the global batch: XLA all-reduces BatchNorm's statistics, and their gradients, in
every layer, each a barrier of every device (docs/results.md, "Scaling across nodes")."""

import math
import re

import jax
import numpy as np
import pytest

from common import collectives
from jax_impl import resnet18 as r18
from tests.fixtures import runs

BATCHNORMS = 17  # d2l's ResNet-18: the stem's and two per residual block (8); none on a shortcut


def all_reduces(devices, sync=False) -> list[str]:
    """The operand shapes of each all-reduce in the optimized program of one sharding step."""
    net, optimizer = r18.resnet18(axis_name=r18.AXIS if sync else None), r18.make_optimizer(0.1)
    place, shard, step, _, _ = r18.sharding(net, optimizer, runs.world_of(devices))
    variables = r18.init_weights(net, 0.01, 0)
    state = dict(variables, opt_state=optimizer.init(variables["params"]))
    x, y = np.zeros((64, 28, 28, 1), np.float32), np.zeros(64, np.int32)
    state, x, y = place((jax.tree.map(np.asarray, state), x, y))
    idx = next(iter(shard([np.arange(32)])))
    text = step.lower(state, x, y, idx).compile().as_text()
    return re.findall(r"= (\S+|\([^)]*\)) all-reduce(?:-start)?\(", text)


def conv_gradients(found: list[str]) -> int:
    return sum(shape.count("3,3,") for shape in found)  # the 3x3 kernels' gradients


def test_per_device_batchnorm_all_reduces_the_gradient_only():
    found = all_reduces(jax.devices("cpu")[:2])
    # the gradient and the running statistics, combined by XLA or not: no per-layer barrier
    assert len(found) <= 2, found
    assert conv_gradients(found) >= 16, found


@pytest.mark.parametrize("sync", [False, True])
def test_one_device_exchanges_nothing(sync):
    assert all_reduces(jax.devices("cpu")[:1], sync) == []


def test_sync_batchnorm_all_reduces_in_every_layer_and_the_gradient():
    found = all_reduces(jax.devices("cpu")[:2], sync=True)
    # at least one per BatchNorm forward (its batch statistics), then the gradients'
    assert len(found) > BATCHNORMS, found
    assert conv_gradients(found) >= 16, found


def operand_bytes(shape: str) -> list[int]:
    """The bytes of each float32 operand of an all-reduce: `f32[2,64]{1,0}`, or a tuple."""
    dims = re.findall(r"f32\[([0-9,]*)\]", shape)
    return [4 * math.prod(int(d) for d in each.split(",") if d) for each in dims]


@pytest.mark.parametrize("sync", [False, True], ids=["per-device", "sync-bn"])
def test_the_step_model_has_xlas_all_reduce_operands(sync):
    """compare.scaling times each of common.collectives.step_collectives at the engine's fitted
    alpha and busbw, one per operand of XLA's all-reduce ops (XLA:CPU reduces each operand by
    itself): their bytes are the optimized program's, operand for operand."""
    found = [b for shape in all_reduces(jax.devices("cpu")[:2], sync) for b in operand_bytes(shape)]
    modelled = [size for size, _ in collectives.step_collectives("jax", "sharding", sync)]
    assert sorted(modelled) == sorted(found)
