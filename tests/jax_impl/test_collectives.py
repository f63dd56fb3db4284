"""What JAX's steps exchange, counted in the optimized programs and held to the step model and
the lessons' tables (common.collectives.step_ops, moves). With per-device BatchNorm (the default,
as torch DDP and MXNet Gluon) each device's share is normalised where it lives and each device
keeps its own running statistics: a step all-reduces the gradient and the loss, nothing in the
forward pass, no statistics. With --sync-bn the model sees the global batch: XLA all-reduces
BatchNorm's statistics, and their gradients, in every layer, each a barrier of every device
(docs/results.md, "Scaling across nodes"). LeNet's allreduce is the lesson's own, counted as its
step calls it."""

import math
import re
from unittest import mock

import jax
import numpy as np
import pytest

from common import collectives
from jax_impl import lenet
from jax_impl import resnet18 as r18
from tests.fixtures import lenet_reference as ref
from tests.fixtures import runs

BATCHNORMS = 17  # d2l's ResNet-18: the stem's and two per residual block (8); none on a shortcut


def all_reduces(devices, sync=False, strategy="sharding", **kw) -> list[str]:
    """The operand shapes of each all-reduce in the optimized program of one `strategy` step;
    `kw`: the strategy's (shard_map's and pmap's `bucketed`)."""
    net, optimizer = r18.resnet18(axis_name=r18.AXIS if sync else None), r18.make_optimizer(0.1)
    place, shard, step, _, _ = getattr(r18, strategy)(net, optimizer, runs.world_of(devices), **kw)
    variables = r18.init_weights(net, 0.01, 0)
    state = dict(variables, opt_state=optimizer.init(variables["params"]))
    state = place(jax.tree.map(np.asarray, state))
    x, y = place((np.zeros((64, 28, 28, 1), np.float32), np.zeros(64, np.int32)))
    idx = next(iter(shard([np.arange(32)])))
    text = step.lower(state, x, y, idx).compile().as_text()
    return re.findall(r"= (\S+|\([^)]*\)) all-reduce(?:-start)?\(", text)


def conv_gradients(found: list[str]) -> int:
    return sum(shape.count("3,3,") for shape in found)  # the 3x3 kernels' gradients


def test_per_device_batchnorm_all_reduces_the_gradient_only():
    found = all_reduces(jax.devices("cpu")[:2])
    # the gradient and the loss, combined by XLA or not: no per-layer barrier
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


@pytest.mark.parametrize(
    ("strategy", "sync"),
    [("sharding", False), ("shard_map", False), ("pmap", False), ("sharding", True)],
    ids=["sharding", "shard_map", "pmap", "sharding+sync-bn"],
)
def test_the_step_model_has_xlas_all_reduce_operands(strategy, sync):
    """compare.scaling times each of common.collectives.step_collectives at the engine's fitted
    alpha and busbw, one per operand of XLA's all-reduce ops (XLA:CPU reduces each operand by
    itself), and the lesson's table counts them: their bytes are the optimized program's, operand
    for operand (shard_map's and pmap's --unbucketed). Per-device BatchNorm: the gradient and the
    loss, no running statistics."""
    kw = {} if strategy == "sharding" else {"bucketed": False}
    found = all_reduces(jax.devices("cpu")[:2], sync, strategy, **kw)
    found = [b for shape in found for b in operand_bytes(shape)]
    modelled = collectives.step_collectives("jax", strategy, sync, bucketed=False)
    assert sorted(size for size, _ in modelled) == sorted(found)


@pytest.mark.parametrize("strategy", ["shard_map", pytest.param("pmap", marks=pytest.mark.slow)])
def test_bucketed_steps_all_reduce_one_buffer(strategy):
    """shard_map's and pmap's gradients and loss packed into one flat buffer (`_bucket`): the
    optimized program all-reduces one float32 operand of every gradient and the loss (XLA may
    drop the duplicate the unbucketed program's pmean drops), where unbucketed it has one per
    array."""
    found = [
        b
        for shape in all_reduces(jax.devices("cpu")[:2], strategy=strategy)
        for b in operand_bytes(shape)
    ]
    gradients = sum(size for size, _ in collectives.step_collectives("jax", "sharding", False))
    assert found == [gradients], found  # the sharding model's operands: every gradient and the loss
    assert [size for size, _ in collectives.step_collectives("jax", strategy, False)] == found


@pytest.mark.multi_device
def test_lenets_step_calls_its_allreduce_as_the_table_counts():
    """LeNet's table (common.collectives.lenet_ops): one call of the lesson's allreduce a step,
    every device's gradients and loss at once, their bytes one device's."""
    calls = []

    def counted(data):
        calls.append([sum(a.nbytes for a in jax.tree.leaves(d)) for d in data])
        return allreduce(data)

    devs = jax.devices("cpu")[:2]
    device_params = [lenet.get_params(lenet.init_params(ref.STD, ref.SEED), d) for d in devs]
    X, y = np.zeros((8, 1, 28, 28), np.float32), np.zeros(8, np.int32)
    allreduce = lenet.allreduce
    with mock.patch.object(lenet, "allreduce", counted):
        lenet.train_batch(*jax.device_put((X, y), devs[0]), device_params, devs, 0.1)
    modelled = collectives.lenet_ops("jax")
    assert [[c.bytes] * len(devs) for c in modelled] == calls
