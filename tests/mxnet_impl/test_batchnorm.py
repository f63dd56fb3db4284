"""BatchNorm under Gluon's context list (mxnet_impl/resnet18.py, `context_list`, `--strategy
gluon`): each context normalises its own part of the batch and keeps running statistics of its
own, so N contexts take the step that one context takes on a ghost batch (the batch in N parts,
each normalised by its own statistics); the first context evaluates the whole test batch with its
running statistics (worker 0's first context under `dist`), as DDP's ranks with rank 0's.

The reference is one context that runs each part of the batch through the net alone, with a set
of running statistics per part, and one Trainer step on the parts' summed gradient."""

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

from common.devices import DevicePlan
from common.world import World, alone
from mxnet_impl import devices as mdev
from mxnet_impl import resnet18 as r18
from mxnet_impl import weights as mweights
from tests.fixtures import numerics, runs

CTXS = [mx.cpu(0), mx.cpu(1)]
STATS = ("running_mean", "running_var")
LR = 0.1
# `train` warms up on the first batch's shape, then the steps: 8 rows split 4 + 4, then 2 + 2.
WARM_UP, STEPS = np.arange(8), [np.arange(8), np.arange(8, 12)]
# Rule 2's rounding factor for the forward's statistics: the stem's conv and BatchNorm and four
# blocks of two convs and two BatchNorms in sequence; the longest sum is a 3x3 conv over 32
# channels (288; a part's BatchNorm statistic sums 4 x 8 x 8 = 256).
STAGES, REDUCTION = 18, 288


def _data(dtype):
    """12 zero-mean images (BatchNorm well conditioned, as tests/fixtures/make_resnet18_parity.py
    says) and labels."""
    rng = np.random.default_rng(1)
    return rng.standard_normal((12, 1, 8, 8)).astype(dtype), rng.integers(0, 10, 12)


def _initial():
    """The narrow net's initial weights and statistics (float32 numbers: exact in float64)."""
    return r18.get_weights(r18.init_weights(r18.resnet18(width=4, residuals=1), 0.1, 0))


def _net(dtype, ctxs, weights):
    net = r18.init_weights(r18.resnet18(width=4, residuals=1), 0.1, 0, ctxs[:1])
    net.cast(dtype)
    r18.set_weights(net, weights)
    net.hybridize()
    return net


def _split(params):
    """(trained parameters, running statistics) of named_params."""
    stats = {k: p for k, p in params.items() if k.endswith(STATS)}
    return {k: p for k, p in params.items() if k not in stats}, stats


def _stats(net, ctx):
    return {k: p.data(ctx).asnumpy() for k, p in _split(mweights.named_params(net))[1].items()}


def _set_stats(net, stats, ctx):
    for k, p in _split(mweights.named_params(net))[1].items():
        p.data(ctx)[:] = stats[k]


def _state(net, ctx, stats=None):
    """What a step leaves on `ctx`: weights, gradients (the step's summed gradient, which the
    Trainer leaves on every context) and running statistics (`stats`, else `ctx`'s own)."""
    trained = _split(mweights.named_params(net))[0]
    return {
        "weights": {k: p.data(ctx).asnumpy() for k, p in trained.items()},
        "gradients": {k: p.grad(ctx).asnumpy() for k, p in trained.items()},
        "statistics": _stats(net, ctx) if stats is None else stats,
    }


def _contexts_run(dtype, weights, x, y):
    """The lesson's steps on two contexts, as `train` takes them: a warm-up step (it sets the
    Trainer's kvstore up), the initial weights set again on every context, then STEPS.
    (each context's statistics after the warm-up, the steps' losses, each step's state on each
    context)."""
    net = _net(dtype, CTXS, weights)
    world = runs.world_of(CTXS)
    _, shard, step, _, _ = r18.context_list(net, r18.make_optimizer(LR), world)
    x, y = mdev.to_device([x, y.astype(np.int32)], CTXS[0])  # where `place` puts the data
    (warm_up,) = shard([WARM_UP])
    step(x, y, warm_up)
    warmed = [_stats(net, ctx) for ctx in CTXS]
    r18.set_weights(net, weights)
    losses, states = [], []
    for part in shard(STEPS):
        losses.append(float(step(x, y, part).asscalar()))
        states.append([_state(net, ctx) for ctx in CTXS])
    return warmed, losses, states


def _ghost_batch_run(dtype, weights, x, y, n):
    """STEPS on one context, each batch in `n` equal parts in order: part i runs through the net
    alone, with running statistics of its own (set i, which part i of every batch updates), its
    gradient added to the others' (grad_req "add"); the Trainer steps over the whole batch.
    Gluon's BatchNorm updates its running statistics in the backward pass, so each part's
    backward comes before the next part's statistics are put in. n = 1: the plain step on the
    whole batch. (the steps' losses, each step's state per part)."""
    ctx = CTXS[0]
    net = _net(dtype, [ctx], weights)
    trained = _split(mweights.named_params(net))[0]
    for p in trained.values():
        p.grad_req = "add"
    trainer = gluon.Trainer(net.collect_params(), r18.make_optimizer(LR))
    x, y = nd.array(x, ctx=ctx, dtype=dtype), nd.array(y, ctx=ctx, dtype="int32")
    sets = [_stats(net, ctx) for _ in range(n)]
    losses, states = [], []
    for idx in STEPS:
        for p in trained.values():
            p.zero_grad()
        loss = 0.0
        for i, rows in enumerate(np.split(idx, n)):
            _set_stats(net, sets[i], ctx)
            rows = nd.array(rows, ctx=ctx, dtype="int64")
            with autograd.record():
                part = r18.loss_fn(net(x.take(rows)), y.take(rows))
            part.backward()
            sets[i] = _stats(net, ctx)
            loss += float(part.sum().asscalar())
        trainer.step(len(idx))
        losses.append(loss)
        states.append([_state(net, ctx, sets[i]) for i in range(n)])
    return losses, states


def _per_context(states, kind):
    """One kind of state of every context (or part) as one dict: `name@i`."""
    return {f"{k}@{i}": v for i, s in enumerate(states) for k, v in s[kind].items()}


@pytest.mark.numerics
@pytest.mark.multi_device
def test_two_contexts_step_as_a_ghost_batch():
    """Rule 1 (tests/fixtures/numerics.py): in float64, two contexts and the ghost batch of two
    parts compute the same mathematics, so each step's loss, every context's weights and
    gradients, and context i's running statistics against part i's agree to 2**-24.
    Rule 2: the lesson's own float32 run, for what the first step's forward computes (continuous
    in the inputs; the gradients jump at ReLU kinks): each context's running statistics, within
    the rounding factor times their sensitivity to float32's rounding of inputs and weights.
    The Trainer's first step sets its kvstore up, which copies context 0's values to every
    context, the running statistics included: the one time they are synced. `train` takes that
    step in its warm-up and sets the initial weights again after it."""
    x, y = _data(np.float64)
    weights = _initial()
    warmed, losses, states = _contexts_run("float64", weights, x, y)
    ghost_losses, ghost = _ghost_batch_run("float64", weights, x, y, 2)
    whole = _ghost_batch_run("float64", weights, x, y, 1)[1]
    limit = 1e3 * numerics.SAME_MATH_LIMIT
    # The check can tell the ghost batch from the whole batch, and the parts' statistics apart.
    first = ghost[0]
    assert numerics.rel_error(first[0]["gradients"], whole[0][0]["gradients"]) > limit
    assert numerics.rel_error(first[1]["statistics"], first[0]["statistics"]) > limit
    moved = ghost[-1][0]["weights"]
    assert numerics.rel_error(moved, {k: weights[k] for k in moved}) > limit  # the steps moved
    for k, v in warmed[0].items():  # the warm-up on the first batch: context 0's, copied
        np.testing.assert_array_equal(warmed[1][k], v, err_msg=k)
    numerics.check_same_math(
        "mxnet batchnorm warm-up statistics vs part 0's", warmed[0], first[0]["statistics"]
    )
    for s, (got, want) in enumerate(zip(states, ghost, strict=True)):
        name = f"mxnet batchnorm 2 contexts vs ghost batch, step {s}"
        numerics.check_same_math(f"{name} loss", losses[s], ghost_losses[s])
        for kind in ("gradients", "weights"):  # every context's against the one context's
            want_all = _per_context([want[0]] * len(CTXS), kind)
            numerics.check_same_math(f"{name} {kind}", _per_context(got, kind), want_all)
        stats = _per_context(got, "statistics")  # context i's against part i's
        numerics.check_same_math(f"{name} statistics", stats, _per_context(want, "statistics"))
    float32 = _contexts_run("float32", weights, x.astype(np.float32), y)[2][0]
    moved = numerics.perturb({**weights, "input": x})
    off = _ghost_batch_run("float64", moved, moved.pop("input"), y, 2)[1][0]
    want = _per_context(first, "statistics")
    numerics.check_float32(
        "mxnet batchnorm float32 2 contexts vs float64 ghost batch, step 0 statistics",
        _per_context(float32, "statistics"),
        want,
        numerics.rel_error(_per_context(off, "statistics"), want),
        STAGES,
        REDUCTION,
    )


def _far_statistics(net, ctx, seed):
    """Running statistics far from `ctx`'s (variances kept positive)."""
    rng = np.random.default_rng(seed)
    other = {k: v + rng.standard_normal(v.shape) for k, v in _stats(net, ctx).items()}
    return {k: np.abs(v) if k.endswith("running_var") else v for k, v in other.items()}


def _predicted(net, x, rows, ctx):
    """Predictions of `rows` on `ctx`, outside autograd.record: BatchNorm on ctx's statistics."""
    return net(nd.array(x[rows], ctx=ctx)).argmax(axis=1).asnumpy().astype(np.int32)


@pytest.mark.multi_device
def test_the_first_context_evaluates_the_test_batch_on_its_statistics():
    """`correct` counts the whole test batch on the first context, with its running statistics
    (every device evaluates with device 0's in this project's torch and JAX). Context 1 is given
    statistics far from context 0's, and the labels are context 0's predictions of every row:
    evaluated that way every row counts; split over the contexts, each on its own statistics (d2l's
    evaluate_accuracy_gpus), the rows on context 1 do not all count."""
    x, _ = _data(np.float32)
    net = _net("float32", CTXS, _initial())
    _, _, _, correct, _ = r18.context_list(net, r18.make_optimizer(LR), runs.world_of(CTXS))
    _set_stats(net, _far_statistics(net, CTXS[0], 3), CTXS[1])
    idx = np.arange(8)
    labels = np.zeros(len(x), np.int32)
    labels[idx] = _predicted(net, x, idx, CTXS[0])
    second = np.split(idx, len(CTXS))[1]
    assert (_predicted(net, x, second, CTXS[1]) != labels[second]).any()  # the statistics matter
    x_dev, y_dev = mdev.to_device([x, labels], CTXS[0])
    assert float(correct(x_dev, y_dev, idx).asscalar()) == len(idx)


@pytest.mark.multi_device
@pytest.mark.parametrize("rank", [0, 1])
def test_dist_sync_counts_the_test_batch_on_worker_0_alone(rank):
    """Under `dist`, worker 0's first context counts the whole test batch (its statistics) and
    every other worker counts nothing; `total` adds up the workers' counts. The worker's world
    here is the kvstore `local` (the Trainer takes it as it takes dist_sync's)."""
    x, _ = _data(np.float32)
    net = _net("float32", CTXS, _initial())
    world = World(rank, 2, CTXS, alone, DevicePlan(4, "cpu", True), mx.kv.create("local"))
    _, _, _, correct, _ = r18.dist_sync(net, r18.make_optimizer(LR), world)
    _set_stats(net, _far_statistics(net, CTXS[0], 3), CTXS[1])
    idx = np.arange(8)
    labels = np.zeros(len(x), np.int32)
    labels[idx] = _predicted(net, x, idx, CTXS[0])
    x_dev, y_dev = mdev.to_device([x, labels], CTXS[0])
    assert float(correct(x_dev, y_dev, idx).asscalar()) == (len(idx) if rank == 0 else 0)
