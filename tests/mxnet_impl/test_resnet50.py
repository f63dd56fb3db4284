"""resnet50 in MXNet: the tutorial's toy, names, stages, the forward fixture, model parallel and
pipelined == one device, main. Numbers are compared under tests/fixtures/numerics.py's rules."""

import dataclasses
import json
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, nd

from common import cli, config, devices, harness, weights
from mxnet_impl import resnet50 as r50
from mxnet_impl.__main__ import load
from tests.fixtures import make_resnet50_fixture as fixture_gen
from tests.fixtures import numerics, runs

DEVS = [mx.cpu(0), mx.cpu(1)]
HOOKS = load("resnet50")[1]  # what python -m mxnet_impl hands to main
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BATCH = 4
DEPTHS = runs.RESNET50_DEPTHS
# Rule 2's rounding factor for the toy's step: net1, net2 and the loss forward, then the
# output gradient, the hidden gradient and the weight gradients; the longest reduction is the
# loss's mean over 20 x 5 values.
TOY_STAGES, TOY_REDUCTION = 6, 100


def _toy_reference(p, mask, lr):
    """The toy's loss and parameters after one SGD step, in numpy float64, with the hidden
    ReLU's decisions `mask` given (rule 2 of numerics.py: float32's side of every kink)."""
    h = (p["x"] @ p["w1"].T + p["b1"]) * mask
    out = h @ p["w2"].T + p["b2"]
    g_out = 2 * (out - p["y"]) / out.size
    g_h = (g_out @ p["w2"]) * mask
    return {
        "loss": np.mean((out - p["y"]) ** 2),
        "net1.weight": p["w1"] - lr * g_h.T @ p["x"],
        "net1.bias": p["b1"] - lr * g_h.sum(0),
        "net2.weight": p["w2"] - lr * g_out.T @ h,
        "net2.bias": p["b2"] - lr * g_out.sum(0),
    }


@pytest.mark.numerics
def test_toy_model_one_step_matches_numpy():
    """Rule 2: the float32 loss and parameters after the step against numpy in float64 with
    float32's ReLU decisions, each within the rounding factor times its sensitivity to float32's
    rounding of the inputs and weights. Standard-normal data and the default init keep it well
    conditioned: the step moves the weights by 1-3 %, far above float32's noise."""
    mx.random.seed(0)
    ref = r50.ToyModel(DEVS)  # the same seed: train_toy's model before its step
    x, y = nd.random.normal(shape=(20, 10)), nd.random.normal(shape=(20, 5))
    mask = ref.net1(x).asnumpy() > 0
    p = {"x": x.asnumpy(), "y": y.asnumpy()}
    for i in (1, 2):
        layer = getattr(ref, f"net{i}")
        p[f"w{i}"], p[f"b{i}"] = layer.weight.data().asnumpy(), layer.bias.data().asnumpy()
    model, loss = r50.train_toy(DEVS, lr=0.1, seed=0)
    got = {"loss": loss}
    for name in ("net1", "net2"):
        for leaf in ("weight", "bias"):
            got[f"{name}.{leaf}"] = getattr(getattr(model, name), leaf).data().asnumpy()
    want = _toy_reference({k: np.float64(v) for k, v in p.items()}, mask, 0.1)
    moved = _toy_reference(numerics.perturb(p), mask, 0.1)
    for key, value in want.items():
        numerics.check_float32(
            f"mxnet resnet50 toy float32 {key}",
            got[key],
            value,
            numerics.rel_error(moved[key], value),
            TOY_STAGES,
            TOY_REDUCTION,
        )
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


@pytest.fixture(scope="module")
def forward_fixture():
    """The fixture and its weights, redrawn from the generator's STD and SEED (the stored `std`
    is a float32: float(0.04f) would draw every weight 2e-8 off, 3e-7 in the output)."""
    fix = np.load(FIXTURES / "resnet50_forward.npz")
    model = r50.resnet50()
    model.initialize(r50.INIT)
    shapes = {k: v.shape for k, v in r50.get_weights(model).items()}
    return fix, weights.init_normal(shapes, fixture_gen.STD, fixture_gen.SEED)


def _forward(forward_fixture, dtype):
    fix, params = forward_fixture
    model = r50.resnet50()
    model.initialize(r50.INIT)
    model.cast(dtype)  # then the weights, which set_weights keeps in the model's dtype
    r50.set_weights(model, params)
    return model(nd.array(fix["input"], dtype=dtype)).asnumpy()  # outside autograd: eval mode


@pytest.mark.numerics
def test_float64_forward_reproduces_the_torch_fixture(forward_fixture):
    """Rule 1: the same mathematics as torch's float64 forward, to 2**-24 (measured 1e-15)."""
    got = _forward(forward_fixture, "float64")
    numerics.check_same_math("mxnet resnet50 float64 forward", got, forward_fixture[0]["output"])


@pytest.mark.numerics
def test_float32_forward_matches_the_float64_fixture(forward_fixture):
    """Rule 2: eval mode has no kink in the forward's value; 107 rounding stages, reductions up
    to 4608 (the fixture's generator), times the output's sensitivity."""
    fix = forward_fixture[0]
    numerics.check_float32(
        "mxnet resnet50 float32 forward",
        _forward(forward_fixture, "float32"),
        fix["output"],
        float(fix["output.sensitivity"]),
        fixture_gen.STAGES,
        fixture_gen.REDUCTION,
    )


@pytest.fixture(scope="module")
def data():
    x, y = r50.make_data(config.get_config("resnet50", "smoke", image_size=32), DEVS)
    return x[0], y[0]


@pytest.fixture(scope="module")
def start():
    """Weights of runs.RESNET50_DEPTHS's network, for the tests of the stages' arithmetic."""
    mx.random.seed(0)
    return r50.get_weights(r50.build("single", DEVS, None, 1000, DEPTHS))


def make(kind, start, split=None, dtype="float32"):
    model = r50.build(kind, DEVS[:1] if kind == "single" else DEVS, split, 1000, DEPTHS)
    model.cast(dtype)  # exact: `start` holds float32 numbers
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


@pytest.mark.numerics
@pytest.mark.multi_device
def test_model_parallel_equals_single_in_train_mode(start, data):
    """The same float32 operators on the same shapes, only on other contexts: equal to the last
    bit (no rounding rule needed; this holds for any instruction set, as kernels are chosen by
    shape)."""
    ref = one_step(make("single", start), True, *data)
    for model in (make("model_parallel", start), make("pipeline", start, BATCH)):
        out, grads, after = one_step(model, True, *data)
        assert np.array_equal(out, ref[0])
        assert all(np.array_equal(grads[k], ref[1][k]) for k in grads)
        assert all(np.array_equal(after[k], ref[2][k]) for k in after)


@pytest.fixture(scope="module")
def single64(start, data):
    """The one-context step in float64 with BatchNorm on its running statistics."""
    data64 = tuple(a.astype("float64") for a in data)
    return data64, one_step(make("single", start, dtype="float64"), False, *data64)


@pytest.mark.numerics
@pytest.mark.multi_device
@pytest.mark.parametrize("split", [1, 3, BATCH])  # 3 does not divide 4: micro-batches 3 and 1
def test_pipeline_equals_single_with_bn_on_running_stats(start, single64, split):
    """Rule 1: micro-batches compute the same mathematics as the whole batch (gradients summed
    over micro-batches), so in float64 output, gradients and stepped weights agree to 2**-24
    (measured 4e-16). Train-mode BatchNorm normalises each micro-batch by its own statistics
    (as the tutorial does), so only with BN on its running statistics must they agree."""
    data64, ref = single64
    got = one_step(make("pipeline", start, split, "float64"), False, *data64)
    for i, what in enumerate(("output", "gradients", "weights after the step")):
        numerics.check_same_math(f"mxnet resnet50 pipeline split {split} {what}", got[i], ref[i])


def test_bad_split_sizes_are_clear_errors(start, data):
    for split in (0, BATCH + 1):
        with pytest.raises(config.ConfigError, match="split_size must be between 1"):
            config.get_config("resnet50", "smoke", split_size=split)
    with pytest.raises(config.ConfigError, match="split_size must be between 1"):
        make("pipeline", start, BATCH + 1)(data[0])


def args_for(tmp_path, **kw):
    return runs.command_args("resnet50", **{"results": str(tmp_path / "r.jsonl"), **kw})


def read(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.multi_device
def test_main_default_and_sweep_write_records(tmp_path, monkeypatch):
    plan = devices.DevicePlan(2, "cpu", True)
    args = args_for(tmp_path)
    r50.main(args, plan, cli.config_of(args), HOOKS)
    recs = read(args.results)
    assert [r["strategy"] for r in recs] == ["single", "model_parallel", "pipeline"]
    assert recs[0]["devices"] == 1 and recs[2]["split_size"] == 2
    for r in recs[1:]:
        e = r["extra"]
        assert e["num_stages"] == 2 and len(e["stage_blocks"]) == 2
        assert e["stage_params"] == [1_444_928, 24_112_104]  # torch's split
    assert all(r["images_per_sec"] > 0 and r["seconds"]["n"] == 1 for r in recs)
    sweep = args_for(tmp_path, sweep=True)
    # the sweep's records, not the network's: the shallower one runs it in less time
    runs.shallow_resnet50(monkeypatch, r50)
    r50.main(sweep, plan, cli.config_of(sweep), HOOKS)
    sweep = read(args.results)[3:]
    assert [(r["strategy"], r["split_size"], r["extra"]["sweep"]) for r in sweep] == [
        ("pipeline", s, True) for s in (1, 2, 4)
    ]
    assert all(r["extra"]["round_robin"] and r["seconds"]["n"] == 1 for r in sweep)


def test_sweep_takes_the_split_sizes_round_robin(tmp_path):
    """One model for the whole sweep, its split size changed between repeats: each forward
    sees the split size of harness.round_robin's order, and each split size has its repeats."""
    cfg = dataclasses.replace(cli.config_of(args_for(tmp_path)), warmup=1, repeats=2)
    model, seen = r50.build("pipeline", DEVS, 1, cfg.num_classes, DEPTHS), []
    forward = model.forward
    model.forward = lambda x: seen.append(model.split_size) or forward(x)
    runs = r50.train(model, cfg, DEVS, harness.Repeats(cfg, (1, 2, 4))).results()
    order = harness.round_robin((1, 2, 4), cfg.warmup, cfg.repeats)
    assert seen == [s for s in order for _ in range(cfg.num_batches)]
    assert {s: len(t.times) for s, (t, _) in runs.items()} == {1: 2, 2: 2, 4: 2}
    assert all(len(losses) == 3 * cfg.num_batches for _, losses in runs.values())


def test_main_refuses_bad_requests_before_writing(tmp_path):
    one, two = devices.DevicePlan(1, "cpu", True), devices.DevicePlan(2, "cpu", True)
    cases = [
        (args_for(tmp_path, gpus=1, strategy="pipeline"), one, "at least 2 devices"),
        (args_for(tmp_path, strategy="1f1b"), two, "torch only"),
        (args_for(tmp_path, sweep=True, batch_size=3), two, "between 1 and the batch size"),
    ]
    for args, plan, message in cases:
        with pytest.raises(config.ConfigError, match=message):
            r50.main(args, plan, cli.config_of(args), HOOKS)
    assert not (tmp_path / "r.jsonl").exists()
