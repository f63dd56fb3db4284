"""Lesson 4 in MXNet (mxnet_impl/zero.py): AdamW is torch's step, the update on the servers
equals the update on the workers, N devices equal one, and the record's state bytes and kvstore
calls are what the workers hold and make.

The in-process tests give the strategies a `local` kvstore over two contexts: Gluon's Trainer
makes the same calls on it as on dist_sync's (a local kvstore also runs an optimizer sent by
update_on_kvstore), so the mathematics is the same; the slow ones run ps-lite's processes.

`python -m tests.mxnet_impl.test_zero OUT STRATEGY`, started as every worker by
mxnet_impl.launch, is one worker of the slow test's run: it takes the steps on its one context
in float32 and saves its parameters to OUT/worker<rank>.npz.
"""

import json
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mxnet import nd

from common import config, devices, flops
from common.world import World
from mxnet_impl import launch, zero
from mxnet_impl import resnet18 as r18
from mxnet_impl import weights as mweights
from tests.fixtures import numerics
from tests.mxnet_impl import dist_steps

ROOT = Path(__file__).resolve().parents[2]
CTXS = [mx.cpu(0), mx.cpu(1)]
# Three steps, the second split unevenly over two contexts or workers (2 + 3): the global
# batch, not a part, divides the summed gradient.
BATCHES = [np.arange(8), np.arange(8, 13), np.arange(8)]
CFG = config.get_config("zero", "smoke")  # torch's AdamW defaults: lr 1e-3, decay 0.01


def _world(ctxs):
    """One process on `ctxs` with a local kvstore as its group, as a dist worker's world. Its
    set_optimizer updates with a pickled copy of the optimizer, as ps-lite's servers do: a local
    kvstore would hold the worker's own object and see every later change to it."""
    plan = devices.DevicePlan(len(ctxs), "cpu", True)
    kv = mx.kv.create("local")
    copy = lambda optimizer: pickle.loads(pickle.dumps(optimizer))  # noqa: E731
    kv.set_optimizer = lambda optimizer: kv._set_updater(mx.optimizer.get_updater(copy(optimizer)))
    return World(0, 1, ctxs, np.asarray, plan, kv)


def _steps(strategy, world, width=4, use_bn=False, dtype="float64"):
    """A narrow float64 ResNet-18 on `world`'s contexts: a warm-up step (frozen), then the
    three steps of BATCHES, as zero.train takes them. (initial weights, every parameter's
    copies, the optimizer, the kvstore's recorded calls)."""
    x, y = dist_steps.inputs()
    x = x.astype(dtype)
    net = r18.init_weights(r18.resnet18(width=width, use_bn=use_bn), 0.1, 0, world.devices[:1])
    net.cast(dtype)  # exact: the initial weights are float32 numbers
    start = r18.get_weights(net)
    net.hybridize()
    calls = zero._counting(world.group) if world.group is not None else []
    optimizer = zero.make_optimizer(CFG)
    _, shard, step, _, _ = strategy(net, optimizer, world)
    optimizer.frozen = True
    for part in shard(BATCHES[:1]):
        step(x, y, part)
    optimizer.frozen = False
    for part in shard(BATCHES):
        step(x, y, part)
    mx.nd.waitall()
    copies = {
        k: [d.asnumpy() for d in p.list_data()] for k, p in mweights.named_params(net).items()
    }
    return start, copies, optimizer, calls, net


def _moved(weights, start):
    """What the steps changed: AdamW's steps are ~lr per weight, far below the weights
    themselves, so the updates are compared, not the weights."""
    return {k: v - start[k] for k, v in weights.items()}


def _torch_adamw(w, grads, cfg):
    """torch.optim.AdamW's steps in numpy (float64), p -= lr * (m_hat / (sqrt(v_hat) + eps) +
    wd * p), with its numbers as MXNet's kernel takes them: lr, decay, betas, and the step's
    bias correction and epsilon rounded to float32 (its parameter struct's type, whatever the
    arrays' dtype; unrounded, the updates differ by 7e-6: float32's 0.999 is 1.3e-5 off in
    1 - b2)."""
    f32 = np.float32
    b1, b2, lr, wd = (float(f32(v)) for v in (cfg.b1, cfg.b2, cfg.lr, cfg.weight_decay))
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        c1, c2 = 1 - cfg.b1**t, math.sqrt(1 - cfg.b2**t)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - lr * (float(f32(c2 / c1)) * m / (np.sqrt(v) + float(f32(cfg.eps * c2))) + wd * w)
    return w


@pytest.mark.numerics
def test_adamw_takes_torchs_steps():
    """Rule 1 (tests/fixtures/numerics.py): the same mathematics in float64, so the updates
    agree to 2**-24: three steps of one weight array through Gluon's updater, against torch's
    AdamW written out, with torch's defaults (zero.make_optimizer). What each must get right
    shows at once: MXNet's kernel has no bias correction and scales its decay by `eta`, not by
    its learning rate; a wrong mapping (decay not times lr, bias correction left out, a step
    taken twice) changes the updates by 1e-3 and more."""
    rng = np.random.default_rng(0)
    w0 = rng.normal(0, 0.1, (64, 9))
    grads = [rng.normal(0, 1e-2, w0.shape) for _ in range(3)]
    update = mx.optimizer.get_updater(zero.make_optimizer(CFG))
    weight = nd.array(w0, dtype="float64")
    for g in grads:
        update(0, nd.array(g, dtype="float64"), weight)
    want = _torch_adamw(w0, grads, CFG)
    numerics.check_same_math("mxnet AdamW vs torch's, 3 steps", weight.asnumpy() - w0, want - w0)


@pytest.mark.numerics
@pytest.mark.multi_device
def test_the_update_on_the_servers_equals_the_update_on_the_workers():
    """Rule 1: float64, the same mathematics (the kvstore sums the contexts' gradients, then the
    same AdamW kernel updates either the kvstore's copy or each context's), after a frozen
    warm-up step and three steps, one split unevenly. Each context's copy is compared."""
    start, dist, _, _, _ = _steps(zero.dist_sync, _world(CTXS))
    _, server, _, _, _ = _steps(zero.server_update, _world(CTXS))
    for i in range(len(CTXS)):
        got = _moved({k: v[i] for k, v in server.items()}, start)
        want = _moved({k: v[i] for k, v in dist.items()}, start)
        numerics.check_same_math(f"mxnet zero server vs dist, context {i}", got, want)


@pytest.mark.numerics
@pytest.mark.multi_device
def test_two_contexts_equal_one_context():
    """Rule 1: float64; two contexts each take a part of every batch (4 + 4, 2 + 3), one takes
    it whole: the summed gradient over the global batch is the same, up to the order of its
    sums. A gradient averaged over each part instead of the global batch is off by far more
    (AdamW hides a constant factor only up to epsilon, an uneven split not at all)."""
    start, two, _, _, _ = _steps(zero.dist_sync, _world(CTXS))
    _, one, _, _, _ = _steps(zero.dist_sync, _world(CTXS[:1]))
    want = _moved({k: v[0] for k, v in one.items()}, start)
    for i in range(len(CTXS)):
        got = _moved({k: v[i] for k, v in two.items()}, start)
        numerics.check_same_math(f"mxnet zero dist 2 contexts vs 1, context {i}", got, want)


@pytest.mark.multi_device
@pytest.mark.parametrize("strategy", ["dist", "server"])
def test_the_records_state_bytes_and_kvstore_calls(strategy):
    """state_bytes reads what each context holds: the trained parameters (BatchNorm's running
    statistics aside) and their gradients, and under dist the two moments of each, under server
    none (the servers hold them). step_collectives counts the Trainer's kvstore calls per step:
    a pushpull of every trained parameter's gradient, world.sum's keys aside."""
    world = _world(CTXS)
    fn = {"dist": zero.dist_sync, "server": zero.server_update}[strategy]
    _, _, optimizer, calls, net = _steps(fn, world, use_bn=True)
    world.sum(np.zeros(3))  # the world's sums are not the step's
    trained = [p for p in net.collect_params().values() if p.grad_req != "null"]
    psi = sum(p.data(CTXS[0]).size for p in trained)
    assert len(trained) == 76 and psi < sum(
        p.data(CTXS[0]).size for p in net.collect_params().values()
    )
    held = {"params": 8 * psi, "grads": 8 * psi, "opt_state": 16 * psi if strategy == "dist" else 0}
    assert zero.state_bytes(net, optimizer, world) == {0: held, 1: held}
    per_step = [{"op": op, "count": 76, "bytes": 8 * psi} for op in ("push", "pull")]
    assert zero.step_collectives(calls) == per_step


@pytest.mark.multi_device
@pytest.mark.slow
def test_over_ps_lite_the_servers_update_equals_the_workers(tmp_path):
    """Two workers (a context each) under ps-lite, in float32, the runs' dtype: the server sums
    the same two gradients either way, and its AdamW (the workers' pickled copy, sent again
    after the frozen warm-up step) runs the same float32 kernel on the same float32 weights and
    sum as each worker's does: equal to the last bit. Not float64: MXNet 1.9's servers keep
    what is pushed as float32 (a float64 1/3 comes back 1e-8 off), so a float64 run over them
    is not the same mathematics as one without them."""
    runs = {}
    for strategy in ("dist", "server"):
        (tmp_path / strategy).mkdir()
        cmd = [sys.executable, "-m", "tests.mxnet_impl.test_zero", str(tmp_path / strategy)]
        launch.dist_sync([*cmd, strategy], 2, "zero_steps")
        runs[strategy] = [dict(np.load(tmp_path / strategy / f"worker{r}.npz")) for r in range(2)]
    start = r18.get_weights(r18.init_weights(r18.resnet18(width=4, use_bn=False), 0.1, 0))
    moved = _moved(runs["dist"][0], start)
    assert max(np.abs(v).max() for v in moved.values()) > 1e-4  # the steps moved the weights
    for r in range(2):
        for k, v in runs["server"][r].items():
            np.testing.assert_array_equal(v, runs["dist"][r][k], err_msg=f"worker {r}: {k}")


@pytest.mark.multi_device
@pytest.mark.slow
def test_a_server_run_records_what_the_servers_and_workers_hold(tmp_path):
    """`--strategy server --gpus 2` under the launcher: ZeRO stage 1 on the servers, each
    worker's device holding parameters and gradients (4 bytes each per parameter) and no
    moment, the servers 8 bytes per parameter, and every step a push and a pull of each of
    the 76 trained parameters. glibc's mmap threshold is fixed, so that a freed pushed message
    is unmapped at once: a server that still reads one after its handler returns (a frozen
    warm-up step's sum) then faults on every run, not on a few."""
    path = tmp_path / "r.jsonl"
    argv = ["--workload", "zero", "--strategy", "server", "--gpus", "2", "--preset", "smoke"]
    argv += ["--platform", "cpu", "--no-progress", "--results", str(path)]
    out = subprocess.run(
        [sys.executable, "-m", "mxnet_impl", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    extra = json.loads(path.read_text().splitlines()[-1])["extra"]
    psi = flops.PARAMETERS["resnet18"]
    assert (extra["optimizer"], extra["zero_stage"], extra["state_on"]) == ("adamw", 1, "servers")
    assert extra["parameters"] == psi and extra["server_state_bytes"] == 8 * psi
    assert extra["state_bytes"] == [{"params": 4 * psi, "grads": 4 * psi, "opt_state": 0}] * 2
    assert extra["step_collectives"] == [
        {"op": op, "count": 76, "bytes": 4 * psi} for op in ("push", "pull")
    ]
    assert len(extra["peak_bytes"]["bytes"]) == 2 and min(extra["peak_bytes"]["bytes"]) > psi


if __name__ == "__main__":
    world = launch.join(devices.DevicePlan(2, "cpu", True))  # one context per worker
    strategies = {"dist": zero.dist_sync, "server": zero.server_update}
    _, copies, _, _, _ = _steps(strategies[sys.argv[2]], world, dtype="float32")
    np.savez(Path(sys.argv[1]) / f"worker{world.rank}.npz", **{k: v for k, (v,) in copies.items()})
