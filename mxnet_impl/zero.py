"""Lesson 4 in MXNet Gluon: lesson 2's ResNet-18 trained with AdamW, whose two moments per
parameter are the state that ZeRO shards, over MXNet's parameter server (ps-lite).

Strategies (`--strategy`), each one function of (net, optimizer, world) that returns (place,
shard, step, correct, total) (common/training.py, "A strategy"); mxnet_impl/launch.py starts the
scheduler, DMLC_NUM_SERVER servers (default 1) and a worker per device, as lesson 2's dist:
  dist     `dist_sync`: lesson 2's kvstore dist_sync; the servers sum the gradients and every
           worker updates its whole copy with AdamW: each worker holds every parameter, gradient
           and moment (ZeRO stage 0, DDP's memory).
  server   `server_update`: the same kvstore with the update on the servers (Trainer
           update_on_kvstore=True, the optimizer pickled to them): the moments live on the
           servers alone, an array of more than MXNET_KVSTORE_BIGARRAY_BOUND elements (10**6)
           split evenly over them, a smaller one whole on one of them. ZeRO-1's parameter-server
           ancestor: the optimizer state sharded over servers, not over the workers, which
           still hold every parameter and gradient.
ZeRO-2 and ZeRO-3 (gradients, then parameters, sharded over the workers) have no equivalent in
MXNet.

MXNet 1.9 has no AdamW optimizer, only its kernel, nd.contrib.adamw_update, which has no bias
correction and scales the decay by the schedule's `eta`, not by its learning rate: `_AdamW` below
gives it both, so that its step is torch's, p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p).
BatchNorm as in lesson 2: each worker keeps its own running statistics; worker 0 evaluates.
"""

import math
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd
from mxnet.gluon.utils import split_and_load

from common import config, data, harness, training, utilization
from mxnet_impl import devices as mdev
from mxnet_impl import launch
from mxnet_impl import resnet18 as r18
from mxnet_impl import weights as mweights
from mxnet_impl.resnet18 import _check, _correct_on, _rows_of  # lesson 2's own

FRAMEWORK = "mxnet"
STRATEGIES = ("dist", "server")


class _AdamW(mx.optimizer.Optimizer):
    """torch's AdamW on MXNet's kernel: with eta = lr, learning_rate = sqrt(1 - b2**t) /
    (1 - b1**t) and epsilon = eps * sqrt(1 - b2**t), adamw_update's
    w -= eta * (learning_rate * m / (sqrt(v) + epsilon) + wd * w) is torch's step t. The kernel
    takes these numbers as float32, whatever the arrays' dtype. While `frozen` (the warm-up), a
    step leaves weights, moments and step count as they are."""

    def __init__(self, lr, weight_decay, b1, b2, eps):
        super().__init__(learning_rate=lr, wd=weight_decay)
        self.b1, self.b2, self.eps, self.frozen = b1, b2, eps, False
        self.moments = []  # every moment this process's copy made, for state_bytes

    def create_state(self, index, weight):  # the two moments and the steps taken
        made = [nd.zeros(weight.shape, weight.context, dtype=weight.dtype) for _ in "mv"]
        self.moments += made
        return [*made, 0]

    def update(self, index, weight, grad, state):
        if self.frozen:
            return
        state[2] += 1
        m, v, t = state
        c1, c2 = 1 - self.b1**t, math.sqrt(1 - self.b2**t)
        numbers = dict(lr=c2 / c1, eta=self.lr, epsilon=self.eps * c2, wd=self.wd)
        numbers |= dict(beta1=self.b1, beta2=self.b2, rescale_grad=self.rescale_grad)
        nd.contrib.adamw_update(weight, grad, m, v, out=weight, **numbers)

    def __getstate__(self):  # what a server's copy gets: no worker's moments
        return {**super().__getstate__(), "moments": []}


def make_optimizer(cfg):
    """AdamW from the config (torch's defaults), the update rule alone: each strategy's
    gluon.Trainer applies it, on the worker or on the servers."""
    return _AdamW(cfg.lr, cfg.weight_decay, cfg.b1, cfg.b2, cfg.eps)


def state_bytes(net, optimizer, world):
    """{device index: bytes of parameters, gradients and moments} of this worker's contexts,
    read from the arrays it holds: BatchNorm's running statistics are not parameters."""
    trained = [p for p in net.collect_params().values() if p.grad_req != "null"]
    first = world.rank * len(world.devices)  # one worker's contexts follow another's
    own = {}
    for i, ctx in enumerate(world.devices):
        moments = [a for a in optimizer.moments if a.context == ctx]
        own[first + i] = {
            "params": sum(_nbytes(p.data(ctx)) for p in trained),
            "grads": sum(_nbytes(p.grad(ctx)) for p in trained),
            "opt_state": sum(map(_nbytes, moments)),
        }
    return own


def step_collectives(calls):
    """The kvstore's pushes and pulls per worker per step, from `calls` (`_counting`'s record
    of every call the Trainer made, set-up aside): a pushpull is a push and a pull."""
    steps = max(1, [k for m, k, _ in calls if m != "init"].count(0))  # key 0: once a step
    moved = {op: [b for m, _, b in calls if op in m] for op in ("push", "pull")}
    return [
        {"op": op, "count": len(b) // steps, "bytes": sum(b) // steps}
        for op, b in moved.items()
        if b
    ]


def dist_sync(net, optimizer, world):
    """Lesson 2's dist_sync with AdamW: the servers sum the workers' gradients and each worker
    updates its whole copy with them (update_on_kvstore=False): every worker holds every moment
    (ZeRO stage 0)."""
    params = net.collect_params()
    params.reset_ctx(world.devices)  # a copy on each of this worker's contexts
    trainer = gluon.Trainer(params, optimizer, kvstore=world.group, update_on_kvstore=False)
    mdev.pull_weights_first(trainer)  # before any gradient is pushed on the same keys
    return _worker_steps(net, trainer, world)


def server_update(net, optimizer, world):
    """The update on the servers (update_on_kvstore=True), ZeRO-1's parameter-server ancestor:
    the Trainer sends the optimizer to the servers at its first step; each step pushes the
    gradients, which the servers sum and apply to their weights with their moments, and pulls
    the weights. A worker holds no moment."""
    params = net.collect_params()
    params.reset_ctx(world.devices)  # a copy on each of this worker's contexts
    trainer = gluon.Trainer(params, optimizer, kvstore=world.group, update_on_kvstore=True)
    place, shard, step, correct, total = _worker_steps(net, trainer, world)
    sent = [optimizer.frozen]  # what the servers' copy of the optimizer says

    def step_on_servers(x, y, part):
        if optimizer.frozen != sent[0]:  # Trainer never sends a change: send it, once every
            mdev.sync()  # pending step is done; the servers' updater starts afresh with it
            world.group.set_optimizer(optimizer)
            sent[0] = optimizer.frozen
        return step(x, y, part)

    return place, shard, step_on_servers, correct, total


def _worker_steps(net, trainer, world):
    """Lesson 2's dist_sync steps (place, shard, step, correct, total) with `trainer`."""
    devices = world.devices

    def place(arrays):  # every worker holds the whole data set on its first context
        return mdev.to_device(data.as_float(arrays, np.int32), devices[0])

    def shard(batches):  # this worker's share of every global batch, in one copy; and its size
        mine = [_rows_of(idx, world.rank, world.size, len(devices)) for idx in batches]
        rows = mdev.one_copy(mine, devices[0])
        return zip(rows, [len(idx) for idx in batches], strict=True)

    def step(x, y, part):  # this worker's rows over its contexts; the global batch's size
        rows, batch_size = part
        xs, ys = (split_and_load(a.take(rows), devices, even_split=False) for a in (x, y))
        return mdev.add_up(_train_step(net, trainer, xs, ys, batch_size))

    def correct(x, y, idx):  # worker 0's first context counts the test batch, the others none
        return _correct_on(net, devices[0], x, y, idx) if world.rank == 0 else nd.zeros(1)

    def total(losses, hits):  # summed over the workers: the servers add up what each pushes
        return world.sum(np.array([mdev.float_sum(losses), mdev.float_sum(hits)])).tolist()

    return place, shard, step, correct, total


def _restore(net, weights):
    """`weights` written into every context's copy in place: Gluon refuses set_data once a
    Trainer updates on a dist kvstore (the servers' weights are the ones that count there)."""
    for name, p in mweights.named_params(net).items():
        for copy in p.list_data():
            copy[:] = weights[name]


def _train_step(net, trainer, xs, ys, batch_size):
    """One AdamW step on this worker's part of a global batch of `batch_size`. The mean over the
    global batch is taken here, not by Trainer.step(batch_size): the servers' copy of the
    optimizer keeps the rescale it was sent with, and an epoch's last batch may be smaller."""
    with autograd.record():
        losses = [r18.loss_fn(net(x), y) for x, y in zip(xs, ys, strict=True)]
        means = [loss.sum() / batch_size for loss in losses]
    autograd.backward(means)
    trainer.step(1)
    return [loss.sum() for loss in losses]


def train(net, cfg, ds, strategy, run):
    """Lesson 2's loop with AdamW; the warm-up's steps do all the work of a step but the
    update (`frozen`), so the epochs start from the initial weights and fresh moments. Returns
    the optimizer, whose moments `state_bytes` reads."""
    optimizer = make_optimizer(cfg)
    place, shard, step, correct, total = strategy(net, optimizer, run.world)
    x_train, y_train, x_test, y_test = place(ds)
    initial = r18.get_weights(net)
    optimizer.frozen = True
    for part in run.warm_up(shard, sync=mdev.sync):  # each batch shape once (graphs, memory)
        step(x_train, y_train, part)
    optimizer.frozen = False
    _restore(net, initial)  # BatchNorm's running statistics moved in the warm-up
    for parts in run.epochs(shard):  # iterating `parts` is the timed epoch
        losses = [step(x_train, y_train, part) for part in parts]
        hits = [correct(x_test, y_test, idx) for idx in run.test_batches()]
        run.log(*total(losses, hits))
    return optimizer


def main(args, plan, cfg, hooks):
    """Check everything; then start the kvstore's scheduler, servers and workers on this
    machine (mxnet_impl/launch.py), or, as a worker, join it, train and record (worker 0)."""
    strategy = training.choose_strategy("zero", FRAMEWORK, args.strategy, STRATEGIES)
    _check(cfg, plan)
    if not launch.is_worker():  # the launcher: every kvstore process
        argv = launch.worker_argv(args, plan.count, strategy)
        launch.dist_sync([sys.executable, "-m", "mxnet_impl", *argv], plan.count, _WHAT, args)
        return
    world = launch.join(plan, args)
    cfg = config.for_devices(cfg, world.plan.count)
    ds = data.load_subsets(cfg.train_subset, cfg.test_subset, cfg.seed)
    net = r18.init_weights(r18.resnet18(), cfg.init_std, cfg.seed, world.devices[:1])
    net.hybridize()
    calls = _counting(world.group)
    run = harness.Run(args, cfg, ds, world, hooks=hooks)
    with run.sampling(utilization.sampler_for(plan.platform, len(world.devices))):
        strategies = {"dist": dist_sync, "server": server_update}
        optimizer = train(net, cfg, ds, strategies[strategy], run)
    names = [f"worker{r}:{n}" for r in range(world.size) for n in mdev.device_names(world.devices)]
    extra = run.usage() | launch.dist_fields(world.group)
    extra |= _memory_fields(net, optimizer, world, strategy)
    extra |= {"step_collectives": step_collectives(calls), "collectives_source": _COUNTED}
    run.save(strategy, extra, names)


# --- the record's fields: how they are read ----------------------------------------------------

_WHAT = "MXNet dist_sync training"
_COUNTED = (
    "the kvstore calls (push, pull, pushpull) that Gluon's Trainer makes on each worker, "
    "recorded on the worker's kvstore during the run and divided by its steps; a pushpull is a "
    "push and a pull of the same array's bytes"
)
_RSS = (
    "the whole worker process: the Fashion-MNIST arrays, MXNet's runtime and memory pools, "
    "the activations, parameters, gradients and, under dist, the moments; not the servers"
)


def _nbytes(array):
    return array.size * np.dtype(array.dtype).itemsize


def _counting(kv):
    """Record every data call on the kvstore `kv` as (method, key, bytes of one context's
    array), world.sum's own keys aside."""
    calls = []
    for method in ("init", "push", "pull", "pushpull"):
        original = getattr(kv, method)

        def counted(key, value=None, *args, _method=method, _original=original, **kwargs):
            if key < launch.SUM_KEY:
                first = value[0] if isinstance(value, list | tuple) else value
                first = kwargs["out"] if first is None else first
                first = first[0] if isinstance(first, list | tuple) else first
                calls.append((_method, key, _nbytes(first)))
            return _original(key, value, *args, **kwargs)

        setattr(kv, method, counted)
    return calls


def _memory_fields(net, optimizer, world, strategy):
    """zero_stage, the parameters' count, each device's state bytes and peak, the servers'."""
    trained = [p for p in net.collect_params().values() if p.grad_req != "null"]
    psi = sum(p.data(world.devices[0]).size for p in trained)
    rss = np.zeros(world.plan.count)
    first = world.rank * len(world.devices)
    rss[first : first + len(world.devices)] = utilization.peak_rss_bytes()
    on_servers = strategy == "server"
    moments = 2 * sum(_nbytes(p.data(world.devices[0])) for p in trained)
    return {
        "optimizer": "adamw",
        "zero_stage": 1 if on_servers else 0,
        "state_on": "servers" if on_servers else "devices",
        "parameters": int(psi),
        "state_bytes": training.state_table(world, state_bytes(net, optimizer, world)),
        "peak_bytes": {
            "bytes": [int(b) for b in np.asarray(world.sum(rss))],
            "source": "each worker process's peak resident set (getrusage ru_maxrss)",
            "includes": _RSS,
        },
        "server_state_bytes": moments if on_servers else 0,
        "server_state_source": (
            "two moments of each parameter's shape and dtype, as the servers' AdamW makes them: "
            "ps-lite gives a worker no view of the servers' memory"
        ),
    }
