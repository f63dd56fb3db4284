"""resnet18 in MXNet: model, weights, parity fixture, 2 contexts == 1 context, smoke run."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

from common import cli, config, data, devices, flops
from mxnet_impl import devices as mdev
from mxnet_impl import resnet18 as r18
from mxnet_impl import weights as mweights
from mxnet_impl.__main__ import load
from tests.fixtures import make_resnet18_parity as parity
from tests.fixtures import numerics, runs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HOOKS = load("resnet18")[1]  # what python -m mxnet_impl hands to main
PARAMS = flops.PARAMETERS["resnet18"]  # d2l's ResNet-18 (conv biases, no shortcut BN)


def test_parameter_count_and_names():
    shapes = r18.weight_shapes(r18.resnet18())
    stats = ("running_mean", "running_var")
    assert sum(int(np.prod(s)) for k, s in shapes.items() if not k.endswith(stats)) == PARAMS
    trained = {k: s for k, s in shapes.items() if not k.endswith(stats)}
    assert trained == flops.parameter_shapes("resnet18")  # the step model's (compare.scaling)
    assert shapes["stem.conv.weight"] == (64, 1, 3, 3)
    assert shapes["stem.bn.weight"] == (64,)  # Gluon's gamma
    assert shapes["layer2.0.shortcut.weight"] == (128, 64, 1, 1)
    assert shapes["fc.weight"] == (10, 512)
    assert "layer1.0.shortcut.weight" not in shapes


def test_weights_round_trip():
    net = r18.init_weights(r18.resnet18(width=8), 0.01, seed=3)
    w = r18.get_weights(net)
    assert abs(float(w["layer4.1.conv2.weight"].std()) - 0.01) < 1e-3
    assert not w["fc.bias"].any() and (w["layer1.0.bn1.running_var"] == 1).all()
    other = r18.set_weights(r18.init_weights(r18.resnet18(width=8), 0.01, seed=4), w)
    for k, v in r18.get_weights(other).items():
        np.testing.assert_array_equal(v, w[k])


def test_a_float64_net_keeps_float64_weights():
    """set_weights must not round through float32 (nd.array's default): the float64 tests
    compare to 2**-24, and weights that are not float32 numbers would lose ~1e-8."""
    net = r18.init_weights(r18.resnet18(width=8), 0.01, seed=3)
    net.cast("float64")
    w = {k: np.float64(v) / 3 + 1e-3 for k, v in r18.get_weights(net).items()}
    for k, v in r18.get_weights(r18.set_weights(net, w)).items():
        np.testing.assert_array_equal(v, w[k], err_msg=k)


def _parity_net(dtype):
    # The parity weights are float32 numbers (common.weights), so the cast to float64 is exact.
    net = r18.init_weights(r18.resnet18(), parity.STD, parity.SEED)
    net.cast(dtype)
    net.hybridize()
    return net


def _parity_outputs(dtype):
    """The fixture's protocol (tests/fixtures/make_resnet18_parity.py) in MXNet, in `dtype`."""
    ref = np.load(FIXTURES / "resnet18_parity.npz")
    x, y = nd.array(ref["x"], dtype=dtype), nd.array(ref["y"], dtype="int32")
    out, net = {}, _parity_net(dtype)
    out["logits_eval"] = net(x).asnumpy()  # outside autograd: BatchNorm on running statistics
    with autograd.train_mode():
        out["logits_train"] = net(x).asnumpy()
    net = _parity_net(dtype)
    trainer = gluon.Trainer(net.collect_params(), r18.make_optimizer(parity.LR))
    (loss,) = r18.train_step(net, trainer, [x], [y], len(ref["y"]))
    # Gluon's loss is per sample and train_step returns its sum; the fixture's is the batch mean.
    out["loss"] = loss.asnumpy()[0] / len(ref["y"])
    with autograd.train_mode():
        out["logits_after_step"] = net(x).asnumpy()
    return ref, out


@pytest.mark.numerics
def test_float64_run_reproduces_the_fixture():
    """Rule 1 (tests/fixtures/numerics.py): MXNet's float64 run computes the fixture's mathematics,
    so every output agrees to 2**-24 on any machine. The forward outputs agree to ~1e-15. After
    the step ~1.7e-8: MXNet's sgd_update takes the learning rate as a C++ float, so the float64
    step uses fl32(0.1) = 0.1 * (1 + 1.5e-8) (a manual float64 step gives 1e-15); a fixed,
    machine-independent amount below the limit, which float32 could not resolve either."""
    ref, got = _parity_outputs("float64")
    for key in parity.OUTPUTS:
        numerics.check_same_math(f"mxnet resnet18 float64 {key}", got[key], ref[key])


@pytest.mark.numerics
def test_float32_forward_matches_the_float64_fixture():
    """Rule 2: the float32 forward outputs (continuous in the input; the logits after the step
    are not: the step's gradient jumps at ReLU kinks) within the rounding factor times their
    sensitivity. The input is zero-mean, which keeps BatchNorm well conditioned (see the
    fixture's generator). The loss sits at about half its limit (21 x U32: its sensitivity is
    below U32), most of that from MXNet's float32 log_softmax, which runs in oneDNN and is
    biased by ~6 U32 per element (see test_lenet.log_softmax_error)."""
    ref, got = _parity_outputs("float32")
    for key in parity.FORWARD:
        numerics.check_float32(
            f"mxnet resnet18 float32 {key}",
            got[key],
            ref[key],
            float(ref[f"{key}.sensitivity"]),
            parity.STAGES,
            parity.REDUCTION,
        )


def _two_context_run(n, x, y):
    """Two steps (8, then an uneven 5 split 3 + 2) of the BatchNorm-free net on n contexts by
    the context_list strategy, in float64: (initial weights, every parameter's copies after
    the steps)."""
    ctxs = [mx.cpu(i) for i in range(n)]
    net = r18.init_weights(r18.resnet18(width=4, use_bn=False, residuals=1), 0.1, 0, ctxs[:1])
    net.cast("float64")  # exact: the initial weights are float32 numbers
    start = r18.get_weights(net)
    net.hybridize()
    _, shard, step, _, _ = r18.context_list(net, r18.make_optimizer(0.1), runs.world_of(ctxs))
    for part in shard([np.arange(8), np.arange(8, 13)]):
        step(x, y, part)
    params = mweights.named_params(net)
    copies = {k: [d.asnumpy() for d in p.list_data()] for k, p in params.items()}
    return start, copies


@pytest.mark.numerics
@pytest.mark.multi_device
def test_two_contexts_equal_one_context():
    """Rule 1: two contexts and one compute the same mathematics, so in float64 (kvstore
    `device` sums float64 as it is, and each context updates its copy) they agree to 2**-24.
    BatchNorm-free: Gluon keeps BN statistics per context. Both runs round the learning rate
    and 1/batch the same way (sgd_update's float parameters), so that cancels here."""
    rng = np.random.default_rng(1)
    x = nd.array(rng.random((13, 1, 8, 8)), dtype="float64")
    y = nd.array(rng.integers(0, 10, 13), dtype="int32")
    start, one = _two_context_run(1, x, y)
    two = _two_context_run(2, x, y)[1]
    one = {k: v for k, (v,) in one.items()}
    # The steps moved the weights far more than the limit: the check can see a wrong step.
    assert numerics.rel_error(one, start) > 1e3 * numerics.SAME_MATH_LIMIT
    numerics.check_same_math(
        "mxnet resnet18 2 contexts vs 1", {k: v[0] for k, v in two.items()}, one
    )
    for k, (first, second) in two.items():
        # Every context applies the same update to the same summed gradient: equal to the
        # last bit.
        np.testing.assert_array_equal(second, first, err_msg=k)


def _args(**kw):
    return runs.command_args("resnet18", **{"results": "/nonexistent/never-written.jsonl", **kw})


# AMP patches MXNet's operators for the whole process (r18.use_bf16): a process of its own.
BF16_STEPS = """
import json, sys
import numpy as np
from mxnet import gluon, nd
from mxnet_impl import resnet18 as r18
if sys.argv[1] == "bf16":
    r18.use_bf16()
net = r18.init_weights(r18.resnet18(width=8), 0.1, 0)
net.hybridize()
trainer = gluon.Trainer(net.collect_params(), r18.make_optimizer(0.05))
x = nd.array(np.random.default_rng(0).random((4, 1, 8, 8), dtype=np.float32))
y = nd.array(np.arange(4), dtype="int32")
losses = [r18.train_step(net, trainer, [x], [y], 4)[0] for _ in range(5)]
dtypes = {np.dtype(p.data().dtype).name for p in net.collect_params().values()}
dtypes.add(np.dtype(losses[0].dtype).name)
print(json.dumps({"losses": [float(v.asscalar()) for v in losses], "dtypes": sorted(dtypes)}))
"""


def _bf16_steps(amp):
    proc = subprocess.run(
        [sys.executable, "-c", BF16_STEPS, amp], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.slow
def test_bf16_compute_keeps_float32_params():
    if not mdev.has_bf16():
        pytest.skip("MXNet's oneDNN has no bf16 kernels for this CPU (AVX-512 needed)")
    bf16, fp32 = _bf16_steps("bf16"), _bf16_steps("off")
    assert bf16["dtypes"] == ["float32"]  # parameters and loss
    losses = bf16["losses"]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    assert losses[0] != fp32["losses"][0]  # the convolutions did run in bf16


def test_unknown_strategy_is_a_config_error():
    plan = devices.DevicePlan(2, "cpu", True)
    with pytest.raises(config.ConfigError, match="unknown resnet18 strategy 'ddp' for mxnet"):
        r18.main(_args(strategy="ddp"), plan, cli.config_of(_args()), HOOKS)


@pytest.mark.slow
@pytest.mark.multi_device
def test_smoke_end_to_end(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    args = _args(results=str(path))
    r18.main(args, devices.DevicePlan(2, "cpu", True), cli.config_of(args), HOOKS)
    rec = json.loads(path.read_text().splitlines()[-1])
    assert rec["framework"] == "mxnet" and rec["strategy"] == "gluon"
    assert rec["devices"] == 2 and rec["batch_size"] == 32
    assert rec["device_names"] == ["cpu(0)", "cpu(1)"]
    assert rec["extrapolated"] is True and rec["steps_timed"] == 2 and rec["images_per_sec"] > 0
    assert np.isfinite(rec["train_loss"]).all() and 0 <= rec["test_acc"] <= 1
    assert rec["extra"]["utilization_source"] == "cpu_time"
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("test acc:") and "(extrapolated) on [2 x cpu (virtual)]" in last


@pytest.mark.numerics
@pytest.mark.multi_device
def test_warm_up_steps_leave_the_initial_weights():
    """`train` warms up on the batch shapes it will use, then sets the initial weights again
    (on every context; the kvstore `device` keeps no copy of its own): its first epoch is the
    same steps taken from the initial weights, the same float32 operations in the same order,
    so its loss and weights are equal to the last bit."""
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (20, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, 20)
    ds = (images, labels, images, labels)
    cfg = config.get_config("resnet18", "smoke", batch_size=8, lr=0.5, epochs=1)
    cfg = dataclasses.replace(cfg, steps_per_epoch=None, init_std=0.1)  # 8 + 8 + 4
    ctxs = [mx.cpu(0), mx.cpu(1)]

    def initialised():
        net = r18.resnet18(width=4, residuals=1)
        net = r18.init_weights(net, cfg.init_std, cfg.seed, ctxs[:1])
        net.hybridize()
        return net

    net = initialised()
    with runs.run_for("resnet18", cfg, ds, ctxs) as run:
        r18.train(net, cfg, ds, r18.context_list, run)
    ref = initialised()
    world = runs.world_of(ctxs)
    place, shard, step, _, total = r18.context_list(ref, r18.make_optimizer(cfg.lr), world)
    x, y, _, _ = place(ds)
    losses = [step(x, y, part) for part in shard(data.batches(20, 8, cfg.seed, 0))]
    log = run.epoch_log
    assert log.timed_steps == [3] and len(log.sec_per_epoch) == 1
    assert log.train_loss[0] == total(losses, [])[0] / 20
    # The reference's first step sets its Trainer's kvstore up, which copies context 0's values
    # to every context, BatchNorm's running statistics included (the run's warm-up did that):
    # the statistics are compared on context 0, the weights on every context.
    for k, p in mweights.named_params(ref).items():
        got = mweights.named_params(net)[k]
        for ctx in ctxs if p.grad_req != "null" else ctxs[:1]:
            np.testing.assert_array_equal(got.data(ctx).asnumpy(), p.data(ctx).asnumpy(), k)
