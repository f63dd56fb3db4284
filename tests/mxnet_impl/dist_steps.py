"""The steps of test_dist's equivalence check, in one process or as a dist_sync worker.

`python -m tests.mxnet_impl.dist_steps OUT`, started as every worker by mxnet_impl.launch: the
worker joins the kvstore, takes the steps on its one context and saves its parameters to
OUT/worker<rank>.npz.
"""

import sys
from pathlib import Path

import mxnet as mx
import numpy as np
from mxnet import nd

from common import processes
from mxnet_impl import resnet18 as r18
from mxnet_impl import weights as mweights

BATCHES = (np.arange(8), np.arange(8, 13))  # 8, then an uneven 5: 4 + 4, then 2 + 3


def inputs():
    """13 float64 images of 8x8 and their labels."""
    rng = np.random.default_rng(1)
    x = nd.array(rng.random((13, 1, 8, 8)), dtype="float64")
    y = nd.array(rng.integers(0, 10, 13), dtype="int32")
    return x, y


def run(ctxs, kv=None):
    """The BatchNorm-free net in float64 on `ctxs`, `gluon` (kv None) or `dist` (this worker's
    kvstore): (initial weights, every parameter's copies after the two steps)."""
    x, y = inputs()
    net = r18.init_weights(r18.resnet18(width=4, use_bn=False), 0.1, 0, ctxs)
    net.cast("float64")  # exact: the initial weights are float32 numbers
    start = r18.get_weights(net)
    net.hybridize()
    split = r18.gluon(net, ctxs) if kv is None else r18.dist(net, ctxs, kv)
    trainer = r18.make_optimizer(net, 0.1, "device" if kv is None else kv)
    for idx in BATCHES:
        r18.train_step(net, trainer, *split(x, y, idx), len(idx))
    copies = {
        k: [d.asnumpy() for d in p.list_data()] for k, p in mweights.named_params(net).items()
    }
    return start, copies


if __name__ == "__main__":
    with processes.deadline(60, "error: dist_steps: the kvstore peers did not join in 60 s", 2):
        kv = mx.kv.create("dist_sync")
    _, copies = run([mx.cpu(0)], kv)
    np.savez(Path(sys.argv[1]) / f"worker{kv.rank}.npz", **{k: v for k, (v,) in copies.items()})
