"""What MXNet's steps move between contexts, counted from the engine and held to the step model
and the lessons' tables (common.collectives.step_ops, lenet_ops, moves): the kvstore calls of
Gluon's Trainer in a real step on two contexts (`dist` makes the same calls on dist_sync's
kvstore), and LeNet's allreduce as its step calls it."""

from unittest import mock

import mxnet as mx
import numpy as np
import pytest
from mxnet import nd

from common import collectives
from mxnet_impl import devices as mdev
from mxnet_impl import lenet
from mxnet_impl import resnet18 as r18
from tests.fixtures import runs

pytestmark = pytest.mark.multi_device
CTXS = [mx.cpu(0), mx.cpu(1)]
CALLS = ("init", "broadcast", "push", "pull", "pushpull")  # the kvstore's data calls


def _kvstore_calls(step):
    """Every kvstore call `step()` makes: (method, the bytes of one context's array)."""
    calls, originals = [], {m: getattr(mx.kvstore.KVStore, m) for m in CALLS}

    def counting(method):
        def call(self, key, value=None, *args, **kwargs):
            first = value[0] if isinstance(value, list | tuple) else value
            size = 0 if first is None else first.size * np.dtype(first.dtype).itemsize
            calls.append((method, size))
            return originals[method](self, key, value, *args, **kwargs)

        return call

    patches = [mock.patch.object(mx.kvstore.KVStore, m, counting(m)) for m in CALLS]
    for p in patches:
        p.start()
    try:
        step()
        mdev.sync()
    finally:
        for p in patches:
            p.stop()
    return calls


def test_the_trainers_step_pushes_and_pulls_a_key_per_gradient():
    """After the first step (which sets the kvstore up, every parameter's copy included), each
    step pushes and pulls each parameter's gradient once, under a key of its own, and nothing
    else: BatchNorm's running statistics (grad_req "null") never move. The step model and the
    lesson's table count the same, key for key."""
    net = r18.init_weights(r18.resnet18(), 0.01, 0, CTXS[:1])
    net.hybridize()
    _, shard, step, _, _ = r18.context_list(net, r18.make_optimizer(0.1), runs.world_of(CTXS))
    x, y = mdev.to_device([np.zeros((4, 1, 28, 28), np.float32), np.zeros(4, np.int32)], CTXS[0])
    first, second = shard([np.arange(4)] * 2)
    step(x, y, first)
    calls = _kvstore_calls(lambda: step(x, y, second))
    modelled = collectives.step_ops("mxnet", "gluon", sync_bn=False)
    assert {method for method, _ in calls} == {"pushpull"}, calls
    assert sorted(size for _, size in calls) == sorted(c.bytes for c in modelled)
    assert collectives.step_ops("mxnet", "dist", sync_bn=False) == modelled


def test_lenets_step_calls_its_allreduce_as_the_table_counts():
    """LeNet's table (common.collectives.lenet_ops): a call of the lesson's allreduce per
    parameter tensor, each with every context's gradient of it."""
    calls = []

    def counted(data):
        calls.append([a.size * np.dtype(a.dtype).itemsize for a in data])
        return allreduce(data)

    device_params = [lenet.get_params(lenet.init_params(0.01, 0), c) for c in CTXS]
    X, y = nd.zeros((8, 1, 28, 28), ctx=CTXS[0]), nd.zeros(8, ctx=CTXS[0])
    allreduce = lenet.allreduce
    with mock.patch.object(lenet, "allreduce", counted):
        lenet.train_batch(X, y, device_params, CTXS, 0.1)
    modelled = [[c.bytes] * len(CTXS) for c in collectives.lenet_ops("mxnet")]
    assert sorted(modelled) == sorted(calls)  # in the parameters' order, which is the dict's
