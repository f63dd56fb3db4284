import dataclasses
import json
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from common import cli, config, devices, harness, weights
from tests.fixtures import make_resnet50_fixture as gen
from tests.fixtures import numerics, runs
from torch_impl import devices as tdev
from torch_impl import pipelining
from torch_impl import resnet50 as r50

DEVS = [torch.device("cpu")] * 2
HOOKS = harness.Hooks("torch", tdev)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BATCH = 4
DEPTHS = runs.RESNET50_DEPTHS


def smoke_cfg(**kw):
    return config.get_config("resnet50", "smoke", batch_size=BATCH, **kw)


def toy_step(x, y, w1, b1, w2, b2, lr=0.1):
    """ToyModel's loss and its weights after one SGD step on MSE, in numpy float64."""
    pre = x @ w1.T + b1
    h = np.maximum(pre, 0)
    out = h @ w2.T + b2
    g_out = 2 * (out - y) / out.size
    g_h = (g_out @ w2) * (pre > 0)
    after = {"net1.weight": w1 - lr * g_h.T @ x, "net2.weight": w2 - lr * g_out.T @ h}
    return {"loss": np.mean((out - y) ** 2), **after}, pre


@pytest.mark.numerics
def test_toy_model_one_step_matches_numpy():
    """Rule 2 of tests/fixtures/numerics.py: torch's float32 step against numpy's float64 one.
    The 200 hidden pre-activations are checked to lie far from ReLU's kink (in units of
    float32's error bound), so float32 cannot decide one differently."""
    torch.manual_seed(0)
    ref = r50.ToyModel(DEVS)
    x, y = torch.randn(20, 10).numpy(), torch.randn(20, 5).numpy()
    params = [p.detach().numpy().copy() for p in ref.parameters()]
    w = dict(zip(("w1", "b1", "w2", "b2"), params, strict=True))
    model, loss = r50.train_toy(DEVS, lr=0.1, seed=0)
    want, pre = toy_step(x, y, **w)
    moved = numerics.perturb({**w, "x": x, "y": y})
    off, _ = toy_step(moved.pop("x"), moved.pop("y"), **moved)
    factor = numerics.rounding_factor(4, 100)  # 2 layers forward, 2 back; MSE sums 100 terms
    assert np.abs(pre).min() > 1e3 * factor * numerics.U32 * np.abs(pre).max()
    got = {"loss": loss, **{k: p.detach().numpy() for k, p in model.named_parameters()}}
    for key, value in want.items():
        sensitivity = numerics.rel_error(off[key], value)
        numerics.check_float32(f"torch toy {key}", got[key], value, sensitivity, 4, 100)
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
    """Weights of runs.RESNET50_DEPTHS's network, for the tests of the stages' arithmetic."""
    torch.manual_seed(0)
    return r50.get_weights(r50.resnet50(depths=DEPTHS))


def make(kind, start, train_bn, split=None):
    model = r50.build(kind, DEVS[:1] if kind == "single" else DEVS, split, 1000, DEPTHS)
    r50.set_weights(model, start)
    return model.train(train_bn)


@pytest.mark.numerics
@pytest.mark.multi_device
def test_model_parallel_equals_single_exactly_in_train_mode(data, start):
    """The same operations in the same order on the same device: bitwise equal."""
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


@pytest.fixture(scope="module")
def single64(data, start):
    """single's float64 step with BatchNorm on its running statistics: every split's reference."""
    x, y = (t.double() for t in data)
    return one_step(make("single", start, False).double(), x, y)


@pytest.mark.numerics
@pytest.mark.multi_device
@pytest.mark.parametrize("split", [1, 3, BATCH])  # 3 does not divide 4: micro-batches 3 and 1
def test_pipeline_equals_single_with_bn_on_running_stats(data, start, single64, split):
    """Rule 1 (float64): micro-batches change the blocking of every convolution, so in float32
    the two agree only to rounding, and gradients can take other sides of ReLU kinks.
    Train-mode BatchNorm normalises each micro-batch by its own statistics (as the tutorial
    does), so only with BN on its running statistics must the results agree for every split."""
    x, y = (t.double() for t in data)
    ref = single64
    got = one_step(make("pipeline", start, False, split).double(), x, y)
    name = f"torch resnet50 pipeline split {split} vs single"
    numerics.check_same_math(f"{name}: output", got[0], ref[0])
    numerics.check_same_math(f"{name}: gradients", _numpy(got[1]), _numpy(ref[1]))
    numerics.check_same_math(f"{name}: weights after", _numpy(got[2]), _numpy(ref[2]))


def _numpy(tensors):
    return {k: v.detach().cpu().numpy() for k, v in tensors.items()}


def test_bad_split_sizes_are_clear_errors(data, start):
    for split in (0, BATCH + 1):
        with pytest.raises(config.ConfigError, match="split_size must be between 1"):
            config.get_config("resnet50", "smoke", split_size=split)
    with pytest.raises(config.ConfigError, match="split_size must be between 1"):
        make("pipeline", start, False, split=BATCH + 1)(data[0])
    with pytest.raises(config.ConfigError, match="must divide"):
        pipelining.check("gpipe", 2, 3, BATCH)
    with pytest.raises(config.ConfigError, match="at least 2 micro-batches"):
        pipelining.check("1f1b", 2, BATCH, BATCH)


def _fixture_forward(dtype):
    fix = np.load(FIXTURES / "resnet50_forward.npz")
    shapes = {k: v.shape for k, v in r50.get_weights(r50.resnet50()).items()}
    params = weights.init_normal(shapes, float(fix["std"]), int(fix["seed"]))
    return gen.forward(params, fix["input"], dtype), fix


@pytest.mark.numerics
def test_float64_forward_reproduces_the_fixture():
    """Rule 1: the fixture is this program's float64 output (also checks its generator)."""
    out, fix = _fixture_forward(torch.float64)
    assert list(gen.make()["names"]) == list(fix["names"])
    assert np.abs(fix["output"]).mean() > 1e-2  # not vanishing: the comparison means something
    numerics.check_same_math("torch resnet50 float64 forward", out, fix["output"])


@pytest.mark.numerics
def test_float32_forward_matches_the_float64_fixture():
    """Rule 2: eval-mode forward, continuous in the input."""
    out, fix = _fixture_forward(torch.float32)
    sensitivity = float(fix["output.sensitivity"])
    numerics.check_float32(
        "torch resnet50 float32 forward", out, fix["output"], sensitivity, gen.STAGES, gen.REDUCTION
    )


def args_for(tmp_path, **kw):
    return runs.command_args("resnet50", **{"results": str(tmp_path / "r.jsonl"), **kw})


def read(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.multi_device
def test_main_default_and_sweep_write_records(tmp_path, monkeypatch):
    plan = devices.DevicePlan(2, "cpu", True)
    args = args_for(tmp_path, batch_size=3, split_size=2)
    r50.main(args, plan, cli.config_of(args), HOOKS)
    recs = read(args.results)
    assert [r["strategy"] for r in recs] == ["single", "model_parallel", "pipeline"]
    assert recs[0]["devices"] == 1 and recs[2]["split_size"] == 2
    for r in recs[1:]:
        e = r["extra"]
        assert e["num_stages"] == 2 and len(e["stage_blocks"]) == 2
        assert e["stage_params"] == [1_444_928, 24_112_104]  # 25,557,032 in all
    assert all(r["images_per_sec"] > 0 and r["seconds"]["n"] == 1 for r in recs)
    sweep = args_for(tmp_path, sweep=True)
    # the sweep's records, not the network's: the shallower one runs it in less time
    runs.shallow_resnet50(monkeypatch, r50)
    r50.main(sweep, plan, cli.config_of(sweep), HOOKS)  # split sizes 1, 2, 4 of batch 4
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


def test_one_gpu_runs_pipeline_with_both_stages_on_it(tmp_path):
    """A one-GPU plan, simulated with the CPU as its one device: two stages share it, and the
    record says so (it measures the per-micro-batch overhead, not overlap)."""
    plan = devices.DevicePlan(1, "gpu", False)
    args = args_for(tmp_path, gpus=1, strategy="pipeline", split_size=2)
    one_cpu = types.SimpleNamespace(**{**vars(tdev), "get_devices": lambda plan: DEVS[:1]})
    r50.main(args, plan, cli.config_of(args), harness.Hooks("torch", one_cpu))
    [rec] = read(args.results)
    assert rec["devices"] == 1 and rec["split_size"] == 2
    assert rec["extra"]["stages_share_device"] is True and rec["extra"]["num_stages"] == 2


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
            r50.main(args, plan, cli.config_of(args), HOOKS)
    assert not Path(args.results).exists()


def _single_losses(cfg, dtype, moved=False):
    """single's losses step after step (BatchNorm on running statistics), in `dtype`; `moved`:
    the weights perturbed by float32's rounding (rule 2's sensitivity; the input's rounding adds
    one layer's worth to 53 layers' and is left out)."""
    torch.manual_seed(cfg.seed)
    model = r50.resnet50().to(dtype)
    if moved:
        r50.set_weights(model, numerics.perturb(r50.get_weights(model)))
    repeats = r50.train(model, cfg, DEVS[:1], harness.Repeats(cfg), train_bn=False)
    [(_, losses)] = repeats.results().values()
    return losses


@pytest.mark.numerics
@pytest.mark.slow
@pytest.mark.multi_device
@pytest.mark.parametrize("strategy", ["gpipe", "1f1b"])
def test_pipelining_engine_matches_single(strategy):
    """Two processes exchanging activations over gloo (float32, the engine has no float64 mode)
    against single in float64, step after step, with rule 2; each stage's compute spans within
    its step, its step within the wall time. With BatchNorm on running statistics micro-batches
    change nothing but rounding. The second loss follows the first step's gradient, which jumps
    at ReLU kinks; at lr 0.001 such a jump moves that loss by about lr * |g| * |jump| / loss,
    below 1e-9 here: far inside the limit."""
    cfg = dataclasses.replace(smoke_cfg(image_size=32), num_batches=2, warmup=0)
    repeats = harness.Repeats(cfg, (2,))
    extra = pipelining.launch_stages(cfg, DEVS[:1] * 2, strategy, repeats, train_bn=False)
    want = _single_losses(cfg, torch.float64)
    off = _single_losses(cfg, torch.float64, moved=True)
    assert len(repeats.losses[2]) == len(want) == 2
    for step, (got, exact, moved) in enumerate(zip(repeats.losses[2], want, off, strict=True)):
        sensitivity = numerics.rel_error(moved, exact)
        name = f"torch resnet50 {strategy} loss {step + 1}"
        numerics.check_float32(name, got, exact, sensitivity, 2 * gen.STAGES, gen.REDUCTION)
    assert extra["stage_params"] == [1_444_928, 24_112_104]
    for spans in extra["stage_spans"]:  # each stage computed every micro-batch it was timed on
        assert spans["micro_batches"] == cfg.repeats * cfg.num_batches * BATCH // 2, spans
        assert 0 < spans["forward"] + spans["backward"] <= spans["step"] <= spans["wall"], spans
