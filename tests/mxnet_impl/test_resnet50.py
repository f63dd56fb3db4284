import argparse
import json
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, nd

from common import config, devices, weights
from mxnet_impl import resnet50 as r50

DEVS = [mx.cpu(0), mx.cpu(1)]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BATCH = 4
# float32, sums of a few thousand terms per output: micro-batches change the blocking of the
# convolutions, so results agree to rounding (~1e-6 relative), not bit for bit. The bound is
# relative to each tensor's largest entry (entries near zero have no scale of their own).
RTOL = 1e-5


def close(a, b, rtol=RTOL):
    a, b = np.asarray(a), np.asarray(b)
    return np.abs(a - b).max() <= rtol * max(np.abs(b).max(), 1e-30)


def test_toy_model_one_step_matches_numpy():
    mx.random.seed(0)
    ref = r50.ToyModel(DEVS)
    x, y = nd.random.normal(shape=(20, 10)).asnumpy(), nd.random.normal(shape=(20, 5)).asnumpy()
    w1, b1 = ref.net1.weight.data().asnumpy(), ref.net1.bias.data().asnumpy()
    w2, b2 = ref.net2.weight.data().asnumpy(), ref.net2.bias.data().asnumpy()
    model, loss = r50.train_toy(DEVS, lr=0.1, seed=0)
    h = np.maximum(x @ w1.T + b1, 0)
    out = h @ w2.T + b2
    assert loss == pytest.approx(np.mean((out - y) ** 2), rel=1e-6)
    g_out = 2 * (out - y) / out.size
    g_h = (g_out @ w2) * (h > 0)
    assert close(model.net2.weight.data().asnumpy(), w2 - 0.1 * g_out.T @ h)
    assert close(model.net1.weight.data().asnumpy(), w1 - 0.1 * g_h.T @ x)
    assert model.net1.weight.list_ctx() == [DEVS[0]] and model.net2.weight.list_ctx() == [DEVS[1]]


def trainable(block):
    return sum(p.data().size for p in block.collect_params().values() if p.grad_req != "null")


def test_parameter_count_names_and_tutorial_split():
    model = r50.ModelParallelResNet50(DEVS)
    assert trainable(model) == 25_557_032
    assert [trainable(s) for s in model.stages] == [1_444_928, 24_112_104]
    fix = np.load(FIXTURES / "resnet50_forward.npz")
    assert sorted(r50.get_weights(model)) == list(fix["names"])  # torchvision's names


def test_stages_live_on_different_contexts():
    model = r50.PipelineParallelResNet50(DEVS, split_size=2)
    for stage, device in zip(model.stages, DEVS, strict=True):
        assert {c for p in stage.collect_params().values() for c in p.list_ctx()} == {device}


def test_forward_matches_the_torch_fixture():
    fix = np.load(FIXTURES / "resnet50_forward.npz")
    model = r50.resnet50()
    model.initialize(r50.INIT)
    shapes = {k: v.shape for k, v in r50.get_weights(model).items()}
    r50.set_weights(model, weights.init_normal(shapes, float(fix["std"]), int(fix["seed"])))
    out = model(nd.array(fix["input"])).asnumpy()  # outside autograd.record: eval mode
    assert close(out, fix["output"], rtol=1e-5)  # float32 through 50 layers: ~1e-6 seen


@pytest.fixture(scope="module")
def data():
    x, y = r50.make_data(config.get_config("resnet50", "smoke", image_size=32), DEVS)
    return x[0], y[0]


@pytest.fixture(scope="module")
def start():
    mx.random.seed(0)
    return r50.get_weights(r50.build("single", DEVS, None, 1000))


def make(kind, start, split=None):
    model = r50.build(kind, DEVS[:1] if kind == "single" else DEVS, split, 1000)
    r50.set_weights(model, start)
    return model


def one_step(model, train_bn, x, y, lr=0.01):
    """Forward, MSE, backward, SGD: (output, gradients, parameters after the step)."""
    r50.use_running_stats(model, not train_bn)
    with autograd.record():
        out = model(x)
        loss = ((out - y.as_in_context(out.context)) ** 2).mean()
    loss.backward()
    params = model._collect_params_with_prefix()
    grads = {
        k: p.grad(p.list_ctx()[0]).asnumpy() for k, p in params.items() if p.grad_req != "null"
    }
    for p in params.values():
        if p.grad_req != "null":
            p.set_data(p.data(p.list_ctx()[0]) - lr * p.grad(p.list_ctx()[0]))
    return out.asnumpy(), grads, r50.get_weights(model)


@pytest.mark.multi_device
def test_model_parallel_equals_single_in_train_mode(start, data):
    ref = one_step(make("single", start), True, *data)
    for model in (make("model_parallel", start), make("pipeline", start, BATCH)):
        out, grads, after = one_step(model, True, *data)
        # The same operators on the same shapes: equal to the last bit.
        assert np.array_equal(out, ref[0])
        assert all(np.array_equal(grads[k], ref[1][k]) for k in grads)
        assert all(np.array_equal(after[k], ref[2][k]) for k in after)


@pytest.mark.multi_device
@pytest.mark.parametrize("split", [1, 3, BATCH])  # 3 does not divide 4: micro-batches 3 and 1
def test_pipeline_equals_single_with_bn_on_running_stats(start, data, split):
    # Train-mode BatchNorm normalises each micro-batch by its own statistics (as the tutorial
    # does), so only with BN on its running statistics must the results agree for every split.
    ref = one_step(make("single", start), False, *data)
    got = one_step(make("pipeline", start, split), False, *data)
    assert close(got[0], ref[0])
    for k in ref[1]:
        assert close(got[1][k], ref[1][k], rtol=1e-4), k  # summed over micro-batches
    for k in ref[2]:
        assert close(got[2][k], ref[2][k]), k


def test_bad_split_sizes_are_clear_errors(start, data):
    for split in (0, BATCH + 1):
        with pytest.raises(config.ConfigError, match="split_size must be between 1"):
            config.get_config("resnet50", "smoke", split_size=split)
    with pytest.raises(config.ConfigError, match="split_size must be between 1"):
        make("pipeline", start, BATCH + 1)(data[0])


def args_for(tmp_path, **kw):
    base = dict(
        workload="resnet50",
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
        results=str(tmp_path / "r.jsonl"),
        no_progress=True,
    )
    return argparse.Namespace(**{**base, **kw})


def read(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.multi_device
def test_main_default_and_sweep_write_records(tmp_path):
    plan = devices.DevicePlan(2, "cpu", True)
    args = args_for(tmp_path)
    r50.main(args, plan)
    recs = read(args.results)
    assert [r["strategy"] for r in recs] == ["single", "model_parallel", "pipeline"]
    assert recs[0]["devices"] == 1 and recs[2]["split_size"] == 2
    for r in recs[1:]:
        e = r["extra"]
        assert e["num_stages"] == 2 and len(e["stage_seconds"]) == 2
        assert e["stage_params"] == [1_444_928, 24_112_104]
        assert e["memory_source"] == "param_grad_bytes"
        assert e["stage_peak_memory_bytes"] == [8 * n for n in e["stage_params"]]
    assert all(r["images_per_sec"] > 0 and r["seconds"]["n"] == 1 for r in recs)
    r50.main(args_for(tmp_path, sweep=True), plan)
    assert [
        (r["strategy"], r["split_size"], r["extra"]["sweep"]) for r in read(args.results)[3:]
    ] == [("pipeline", s, True) for s in (1, 2, 4)]


def test_main_refuses_bad_requests_before_writing(tmp_path):
    one, two = devices.DevicePlan(1, "cpu", True), devices.DevicePlan(2, "cpu", True)
    cases = [
        (args_for(tmp_path, gpus=1, strategy="pipeline"), one, "at least 2 devices"),
        (args_for(tmp_path, strategy="1f1b"), two, "torch only"),
        (args_for(tmp_path, sweep=True, batch_size=3), two, "between 1 and the batch size"),
    ]
    for args, plan, message in cases:
        with pytest.raises(config.ConfigError, match=message):
            r50.main(args, plan)
    assert not (tmp_path / "r.jsonl").exists()
