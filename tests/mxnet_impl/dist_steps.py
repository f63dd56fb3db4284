"""The steps of test_dist's equivalence check, in one process or as a dist_sync worker.

`python -m tests.mxnet_impl.dist_steps OUT`, started as every worker by mxnet_impl.launch: the
worker joins the kvstore (launch.join), takes the steps on its one context through the
`dist_sync` strategy, saves its parameters to OUT/worker<rank>.npz, and checks the world's sum
over the workers.
"""

import sys
from pathlib import Path

import numpy as np
from mxnet import nd

from common import devices
from mxnet_impl import launch
from mxnet_impl import resnet18 as r18
from mxnet_impl import weights as mweights

BATCHES = [np.arange(8), np.arange(8, 13)]  # 8, then an uneven 5: two workers take 4 + 4, 2 + 3


def inputs():
    """13 float64 images of 8x8 and their labels."""
    rng = np.random.default_rng(1)
    x = nd.array(rng.random((13, 1, 8, 8)), dtype="float64")
    y = nd.array(rng.integers(0, 10, 13), dtype="int32")
    return x, y


def run(world, strategy=r18.context_list):
    """The BatchNorm-free net in float64 on the world's contexts, trained by `strategy`
    (context_list, or dist_sync in a worker that joined the kvstore): (initial weights, every
    parameter's copies after the two steps)."""
    x, y = inputs()
    net = r18.init_weights(r18.resnet18(width=4, use_bn=False), 0.1, 0, world.devices[:1])
    net.cast("float64")  # exact: the initial weights are float32 numbers
    start = r18.get_weights(net)
    net.hybridize()
    _, shard, step, _, _ = strategy(net, r18.make_optimizer(0.1), world)
    for part in shard(BATCHES):
        step(x, y, part)
    copies = {
        k: [d.asnumpy() for d in p.list_data()] for k, p in mweights.named_params(net).items()
    }
    return start, copies


if __name__ == "__main__":
    world = launch.join(devices.DevicePlan(2, "cpu", True))  # one context per worker
    _, copies = run(world, r18.dist_sync)
    np.savez(Path(sys.argv[1]) / f"worker{world.rank}.npz", **{k: v for k, (v,) in copies.items()})
    # Summed over both workers, under a key of each size: a pair, then a number.
    assert world.sum(np.array([world.rank, 1.0])).tolist() == [1.0, 2.0]
    assert world.sum(world.rank + 2.0) == 5.0
