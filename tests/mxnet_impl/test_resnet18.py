"""resnet18 in MXNet: model, weights, parity fixture, 2 contexts == 1 context, smoke run."""

import dataclasses
import json
from argparse import Namespace
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, nd

from common import config, devices
from mxnet_impl import resnet18 as r18

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PARAMS = 11_175_818  # d2l's ResNet-18 (conv biases, no shortcut BN), 1 channel in, 10 classes
PARITY_SEED, PARITY_STD, PARITY_LR = 0, 0.05, 0.1  # tests/fixtures/make_resnet18_parity.py


def test_parameter_count_and_names():
    shapes = r18.weight_shapes(r18.resnet18())
    stats = ("running_mean", "running_var")
    assert sum(int(np.prod(s)) for k, s in shapes.items() if not k.endswith(stats)) == PARAMS
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


def _parity_net():
    net = r18.init_weights(r18.resnet18(), PARITY_STD, PARITY_SEED)
    net.hybridize()
    return net


def test_forward_and_step_match_the_committed_torch_fixture():
    ref = np.load(FIXTURES / "resnet18_parity.npz")
    x, y = nd.array(ref["x"]), nd.array(ref["y"], dtype="int32")
    net = _parity_net()
    logits_eval = net(x).asnumpy()
    with autograd.train_mode():
        logits_train = net(x).asnumpy()
    net = _parity_net()
    loss = r18.train_step(net, r18.make_optimizer(net, PARITY_LR), [x], [y])[0]
    with autograd.train_mode():
        after = net(x).asnumpy()
    # Two libraries, 20 float32 layers, a well-conditioned input (see the fixture's generator):
    # within 1e-5 of the logits' scale (measured 3e-6 after the step, 2e-6 before).
    for got, key in (
        (logits_eval, "logits_eval"),
        (logits_train, "logits_train"),
        (after, "logits_after_step"),
    ):
        scale = np.abs(ref[key]).max()
        np.testing.assert_allclose(got, ref[key], rtol=1e-5, atol=1e-5 * scale, err_msg=key)
    np.testing.assert_allclose(loss.asscalar() / len(ref["y"]), ref["loss"], rtol=1e-5)


@pytest.mark.multi_device
def test_two_contexts_equal_one_context():
    """BatchNorm-free variant (Gluon keeps BN statistics per context); an even batch of 8 and an
    uneven last batch of 5 (split 2 + 3 by split_and_load)."""
    rng = np.random.default_rng(1)
    x = nd.array(rng.random((13, 1, 8, 8), dtype=np.float32))
    y = nd.array(rng.integers(0, 10, 13), dtype="int32")
    got, start = {}, None
    for n in (1, 2):
        ctxs = [mx.cpu(i) for i in range(n)]
        net = r18.init_weights(r18.resnet18(width=4, use_bn=False), 0.1, 0, ctxs)
        start = r18.get_weights(net)
        net.hybridize()
        trainer = r18.make_optimizer(net, 0.1)
        for idx in (np.arange(8), np.arange(8, 13)):
            r18.train_step(net, trainer, *r18.shard_batch(x, y, idx, ctxs))
        got[n] = {k: p.list_data() for k, p in r18._named_params(net).items()}
        got[n] = {k: [d.asnumpy() for d in v] for k, v in got[n].items()}
    assert any(not np.allclose(got[1][k][0], start[k]) for k in start)
    for k, (one,) in got[1].items():
        for copy in got[2][k]:  # every context's copy was updated the same way
            np.testing.assert_allclose(copy, one, rtol=1e-5, atol=1e-6, err_msg=k)


def _args(**kw):
    base = dict(
        workload="resnet18",
        gpus=2,
        platform="cpu",
        preset="smoke",
        strategy=None,
        epochs=None,
        batch_size=None,
        lr=None,
        split_size=None,
        sweep=False,
        amp="off",
        results="/nonexistent/never-written.jsonl",
        no_progress=True,
    )
    return Namespace(**{**base, **kw})


def test_bf16_and_unknown_strategy_are_config_errors():
    plan = devices.DevicePlan(2, "cpu", True)
    with pytest.raises(config.ConfigError, match="bf16 is not supported"):
        r18.main(_args(amp="bf16"), plan)
    with pytest.raises(config.ConfigError, match="unknown resnet18 strategy"):
        r18.main(_args(strategy="ddp"), plan)


@pytest.mark.slow
@pytest.mark.multi_device
def test_smoke_end_to_end(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    r18.main(_args(results=str(path)), devices.DevicePlan(2, "cpu", True))
    rec = json.loads(path.read_text().splitlines()[-1])
    assert rec["framework"] == "mxnet" and rec["strategy"] == "gluon"
    assert rec["devices"] == 2 and rec["batch_size"] == 32
    assert rec["device_names"] == ["cpu(0)", "cpu(1)"]
    assert rec["extrapolated"] is True and rec["steps_timed"] == 2 and rec["images_per_sec"] > 0
    assert np.isfinite(rec["train_loss"]).all() and 0 <= rec["test_acc"] <= 1
    assert rec["extra"]["utilization_source"] == "cpu_time"
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("test acc:") and "(extrapolated) on [2 x cpu (virtual)]" in last


@pytest.mark.multi_device
def test_warm_up_steps_leave_the_initial_weights():
    """`train` warms up on the batch shapes it will use, then sets the initial weights again
    (every context's copy and the kvstore's): its first epoch's loss is that of the same steps
    taken from the initial weights."""
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (20, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, 20)
    cfg = config.get_config("resnet18", "smoke", batch_size=8, lr=0.5, epochs=1)
    cfg = dataclasses.replace(cfg, steps_per_epoch=None, init_std=0.1)  # 8 + 8 + 4
    ctxs = [mx.cpu(0), mx.cpu(1)]
    net = r18.resnet18(width=4)
    out = r18.train(net, cfg, (images, labels, images, labels), ctxs)
    ref = r18.resnet18(width=4)
    r18.init_weights(ref, cfg.init_std, cfg.seed, ctxs)
    ref.hybridize()
    trainer = r18.make_optimizer(ref, cfg.lr)
    x = nd.array(r18.data.to_float(images), ctx=ctxs[0])
    y = nd.array(labels.astype(np.int32), ctx=ctxs[0], dtype="int32")
    total = 0.0
    for idx in r18.data.batches(20, 8, cfg.seed, 0):
        losses = r18.train_step(ref, trainer, *r18.shard_batch(x, y, idx, ctxs))
        total += sum(float(loss.asscalar()) for loss in losses)
    assert out["timed_steps"] == [3] and len(out["sec_per_epoch"]) == 1
    assert out["train_loss"][0] == pytest.approx(total / 20, rel=1e-6)
    got, want = r18.get_weights(net), r18.get_weights(ref)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-6, atol=1e-7, err_msg=k)
