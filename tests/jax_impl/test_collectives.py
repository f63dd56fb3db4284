"""What JAX's `sharding` step exchanges: the model sees the global batch, so besides the
gradient XLA all-reduces BatchNorm's statistics, and their gradients, in every layer, each a
barrier of every device (docs/results.md, "Scaling across nodes"); torch DDP and MXNet exchange
the gradient once and keep BatchNorm per device."""

import re

import jax
import numpy as np

from jax_impl import resnet18 as r18
from tests.fixtures import runs

BATCHNORMS = 20  # d2l's ResNet-18: the stem's and two per residual block, 8 blocks, + 3 shortcuts


def all_reduces(devices) -> list[str]:
    """The operand shapes of each all-reduce in the optimized program of one sharding step."""
    net, optimizer = r18.resnet18(), r18.make_optimizer(0.1)
    place, shard, step, _, _ = r18.sharding(net, optimizer, runs.world_of(devices))
    variables = r18.init_weights(net, 0.01, 0)
    state = dict(variables, opt_state=optimizer.init(variables["params"]))
    x, y = np.zeros((64, 28, 28, 1), np.float32), np.zeros(64, np.int32)
    state, x, y = place((jax.tree.map(np.asarray, state), x, y))
    idx = next(iter(shard([np.arange(32)])))
    text = step.lower(state, x, y, idx).compile().as_text()
    return re.findall(r"= (\S+|\([^)]*\)) all-reduce(?:-start)?\(", text)


def test_two_devices_all_reduce_batchnorm_in_every_layer_and_the_gradient():
    found = all_reduces(jax.devices("cpu")[:2])
    # at least one per BatchNorm forward (its batch statistics), then the gradients'
    assert len(found) > BATCHNORMS, found
    gradient = sum(shape.count("3,3,") for shape in found)  # the conv kernels' gradients
    assert gradient >= 16, found
    assert all_reduces(jax.devices("cpu")[:1]) == []  # one device exchanges nothing
