import argparse
import dataclasses
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from common import config, devices, weights
from torch_impl import resnet50 as r50

DEVS = [torch.device("cpu")] * 2
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BATCH = 4
# float32, sums of a few thousand terms per output: micro-batches change the blocking of the
# convolutions, so results agree to rounding (~1e-6 relative), not bit for bit. The bound on
# gradients is relative to each tensor's largest entry (entries near zero have no own scale).
RTOL = 1e-5


def close(a, b, rtol=RTOL):
    a, b = np.asarray(a), np.asarray(b)
    return np.abs(a - b).max() <= rtol * max(np.abs(b).max(), 1e-30)


def smoke_cfg(**kw):
    return config.get_config("resnet50", "smoke", batch_size=BATCH, **kw)


def test_toy_model_one_step_matches_numpy():
    torch.manual_seed(0)
    ref = r50.ToyModel(DEVS)
    x, y = torch.randn(20, 10).numpy(), torch.randn(20, 5).numpy()
    w1, b1, w2, b2 = (p.detach().numpy().copy() for p in ref.parameters())
    model, loss = r50.train_toy(DEVS, lr=0.1, seed=0)
    h = np.maximum(x @ w1.T + b1, 0)
    out = h @ w2.T + b2
    assert loss == pytest.approx(np.mean((out - y) ** 2), rel=1e-6)
    g_out = 2 * (out - y) / out.size
    g_h = (g_out @ w2) * (h > 0)
    assert close(model.net2.weight.detach(), w2 - 0.1 * g_out.T @ h)
    assert close(model.net1.weight.detach(), w1 - 0.1 * g_h.T @ x)
    assert model.net1.weight.device == DEVS[0] and model.net2.weight.device == DEVS[1]


def test_parameter_count_and_tutorial_split():
    model = r50.ModelParallelResNet50(DEVS)
    assert sum(p.numel() for p in model.parameters()) == 25_557_032
    assert sum(p.numel() for p in r50.resnet50().parameters()) == 25_557_032
    # the stages share the model's parameters, each exactly once
    ids = [id(p) for s in model.stages for p in s.parameters()]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))


def test_stages_are_placed_on_their_devices():
    model = r50.PipelineParallelResNet50(DEVS, split_size=2)
    for stage, device in zip(model.stages, model.devices, strict=True):
        assert all(p.device == device for p in stage.parameters())


@pytest.mark.gpu
@pytest.mark.multi_device
def test_stages_are_placed_on_two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    gpus = [torch.device("cuda:0"), torch.device("cuda:1")]
    model = r50.PipelineParallelResNet50(gpus, split_size=2)
    for stage, device in zip(model.stages, gpus, strict=True):
        assert all(p.device == device for p in stage.parameters())
    assert model(torch.randn(4, 3, 64, 64, device=gpus[0])).device == gpus[1]


def one_step(model, x, y, lr=0.01):
    """Forward, MSE, backward, SGD: (output, gradients, parameters after the step)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    opt.zero_grad()
    out = model(x)
    torch.nn.functional.mse_loss(out, y.to(out.device)).backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    opt.step()
    return out.detach(), grads, {k: p.detach().clone() for k, p in model.named_parameters()}


@pytest.fixture(scope="module")
def data():
    x, y = r50.make_data(smoke_cfg(image_size=32), DEVS)
    return x[0], y[0]


@pytest.fixture(scope="module")
def start():
    torch.manual_seed(0)
    return r50.get_weights(r50.resnet50())


def make(kind, start, train_bn, split=None):
    model = {
        "single": lambda: r50.resnet50(),
        "model_parallel": lambda: r50.ModelParallelResNet50(DEVS),
        "pipeline": lambda: r50.PipelineParallelResNet50(DEVS, split),
    }[kind]()
    r50.set_weights(model, start)
    return model.train(train_bn)


@pytest.mark.multi_device
def test_model_parallel_equals_single_exactly_in_train_mode(data, start):
    ref = one_step(make("single", start, True), *data)
    for got in (
        one_step(make("model_parallel", start, True), *data),
        one_step(make("pipeline", start, True, split=BATCH), *data),  # one micro-batch
    ):
        for a, b in zip(got, ref, strict=True):
            if isinstance(a, dict):
                assert all(torch.equal(a[k], b[k]) for k in a)
            else:
                assert torch.equal(a, b)


@pytest.mark.multi_device
@pytest.mark.parametrize("split", [1, 3, BATCH])  # 3 does not divide 4: micro-batches 3 and 1
def test_pipeline_equals_single_with_bn_on_running_stats(data, start, split):
    # Train-mode BatchNorm normalises each micro-batch by its own statistics (as the tutorial
    # does), so only with BN on its running statistics must the outputs agree for every split.
    ref = one_step(make("single", start, False), *data)
    got = one_step(make("pipeline", start, False, split), *data)
    assert close(got[0], ref[0])
    for k in ref[1]:
        assert close(got[1][k], ref[1][k], rtol=1e-4), k  # summed over micro-batches
        assert close(got[2][k], ref[2][k]), k


def test_bad_split_sizes_are_clear_errors(data, start):
    for split in (0, BATCH + 1):
        with pytest.raises(config.ConfigError, match="split_size must be between 1"):
            config.get_config("resnet50", "smoke", split_size=split)
    with pytest.raises(config.ConfigError, match="split_size must be between 1"):
        make("pipeline", start, False, split=BATCH + 1)(data[0])
    with pytest.raises(config.ConfigError, match="must divide"):
        r50.check_pipelining("gpipe", 2, 3, BATCH)
    with pytest.raises(config.ConfigError, match="at least 2 micro-batches"):
        r50.check_pipelining("1f1b", 2, BATCH, BATCH)


def fixture_model():
    fix = np.load(FIXTURES / "resnet50_forward.npz")
    model = r50.resnet50().eval()
    shapes = {k: v.shape for k, v in r50.get_weights(model).items()}
    r50.set_weights(model, weights.init_normal(shapes, float(fix["std"]), int(fix["seed"])))
    return model, fix


def test_fixture_is_reproduced_by_its_generator():
    spec = importlib.util.spec_from_file_location("gen", FIXTURES / "make_resnet50_fixture.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    fresh, fix = gen.make(), np.load(FIXTURES / "resnet50_forward.npz")
    assert np.array_equal(fresh["input"], fix["input"])
    assert list(fresh["names"]) == list(fix["names"])
    assert close(fresh["output"], fix["output"])
    assert np.abs(fix["output"]).mean() > 1e-2  # not vanishing: the comparison means something


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
    args = args_for(tmp_path, batch_size=3, split_size=2)
    r50.main(args, plan)
    recs = read(args.results)
    assert [r["strategy"] for r in recs] == ["single", "model_parallel", "pipeline"]
    assert recs[0]["devices"] == 1 and recs[2]["split_size"] == 2
    for r in recs[1:]:
        e = r["extra"]
        assert e["num_stages"] == 2 and len(e["stage_seconds"]) == 2
        assert sum(e["stage_params"]) == 25_557_032
        assert e["memory_source"] == "param_grad_bytes" and len(e["stage_peak_memory_bytes"]) == 2
    assert all(r["images_per_sec"] > 0 and r["seconds"]["n"] == 1 for r in recs)
    r50.main(args_for(tmp_path, sweep=True), plan)  # split sizes 1, 2, 4 of batch 4
    sweep = read(args.results)[3:]
    assert [(r["strategy"], r["split_size"], r["extra"]["sweep"]) for r in sweep] == [
        ("pipeline", s, True) for s in (1, 2, 4)
    ]


def test_main_refuses_bad_requests_before_writing(tmp_path):
    one = devices.DevicePlan(1, "cpu", True)
    two = devices.DevicePlan(2, "cpu", True)
    cases = [
        (args_for(tmp_path, gpus=1, strategy="model_parallel"), one, "at least 2 devices"),
        (args_for(tmp_path, gpus=1, sweep=True), one, "at least 2 devices"),
        (args_for(tmp_path, strategy="ddp"), two, "unknown strategy"),
        (args_for(tmp_path, sweep=True), two, "between 1 and the batch size"),  # split 4 of 3
        (args_for(tmp_path, strategy="1f1b", split_size=4), two, "at least 2 micro-batches"),
    ]
    for args, plan, message in cases:
        if "between" in message:
            args.batch_size = 3
        with pytest.raises(config.ConfigError, match=message):
            r50.main(args, plan)
    assert not Path(args.results).exists()


@pytest.mark.slow
@pytest.mark.multi_device
@pytest.mark.parametrize("strategy", ["gpipe", "1f1b"])
def test_pipelining_engine_matches_single(strategy):
    # BatchNorm on running statistics (as above): micro-batches then change nothing, so two
    # processes exchanging activations over gloo must give single's losses, step after step.
    cfg = dataclasses.replace(smoke_cfg(image_size=32), num_batches=2, warmup=0)
    plan = devices.DevicePlan(2, "cpu", True)
    out = r50.launch_pipelining(cfg, plan, strategy, split_size=2, train_bn=False)
    torch.manual_seed(cfg.seed)
    _, losses = r50.train(r50.resnet50(), cfg, DEVS[:1], train_bn=False)
    assert len(out["losses"]) == len(losses) == 2
    assert np.allclose(out["losses"], losses, rtol=1e-5, atol=0)
    assert out["extra"]["stage_params"] == [1_444_928, 24_112_104]
