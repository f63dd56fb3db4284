"""resnet50 in JAX: the toy model, the tutorial's split, model parallel and pipelined == one
device, the committed forward fixture, main's records and refusals.
Two virtual CPU devices come from tests/jax_impl/conftest.py."""

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import cli, config, devices, harness, stages, weights
from common.stages import blocks_of
from jax_impl import devices as jdev
from jax_impl import resnet50 as r50
from jax_impl.__main__ import load
from tests.fixtures import make_resnet50_fixture as gen
from tests.fixtures import numerics, runs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BATCH = 4
DEPTHS = runs.RESNET50_DEPTHS
HOOKS = load("resnet50")[1]  # what python -m jax_impl hands to main: harness.Hooks


@pytest.fixture(scope="module")
def devs():
    found = jax.devices("cpu")[:2]
    assert len(found) == 2 and found[0] != found[1]
    return found


def toy_step(x, y, w1, b1, w2, b2, lr=0.1):
    """ToyModel's loss and its kernels after one SGD step on MSE, in numpy float64 (flax's
    (in, out) kernels)."""
    pre = x @ w1 + b1
    h = np.maximum(pre, 0)
    out = h @ w2 + b2
    g_out = 2 * (out - y) / out.size
    g_h = (g_out @ w2.T) * (pre > 0)
    after = {"net1": w1 - lr * x.T @ g_h, "net2": w2 - lr * h.T @ g_out}
    return {"loss": np.mean((out - y) ** 2), **after}, pre


@pytest.mark.numerics
def test_toy_model_one_step_matches_numpy(devs):
    """Rule 2 of tests/fixtures/numerics.py: JAX's float32 step against numpy's float64 one.
    The 200 hidden pre-activations are checked to lie far from ReLU's kink (in units of
    float32's error bound), so float32 cannot decide one differently."""
    k_init, k_x, k_y = jax.random.split(jax.random.key(0), 3)
    x, y = jax.random.normal(k_x, (20, 10)), jax.random.normal(k_y, (20, 5))
    p0 = jax.device_get(r50.ToyModel().init(k_init, x, devs[:1])["params"])
    params, loss = r50.train_toy(devs, lr=0.1, seed=0)
    w = {
        f"{k[0]}{n[-1]}": np.asarray(p0[n][m])
        for n in ("net1", "net2")
        for k, m in (("w", "kernel"), ("b", "bias"))
    }
    x, y = np.asarray(x), np.asarray(y)
    want, pre = toy_step(x, y, **w)
    moved = numerics.perturb({**w, "x": x, "y": y})
    off, _ = toy_step(moved.pop("x"), moved.pop("y"), **moved)
    factor = numerics.rounding_factor(4, 100)  # 2 layers forward, 2 back; MSE sums 100 terms
    assert np.abs(pre).min() > 1e3 * factor * numerics.U32 * np.abs(pre).max()
    got = {"loss": loss, **{n: np.asarray(params[n]["kernel"]) for n in ("net1", "net2")}}
    for key, value in want.items():
        sensitivity = numerics.rel_error(off[key], value)
        numerics.check_float32(f"jax toy {key}", got[key], value, sensitivity, 4, 100)
    assert params["net1"]["kernel"].devices() == {devs[0]}
    assert params["net2"]["kernel"].devices() == {devs[1]}


@pytest.fixture(scope="module")
def start():
    return r50.resnet50(seed=0)[1]


@pytest.fixture(scope="module")
def shallow():
    """The variables of runs.RESNET50_DEPTHS's network, for the tests of the stages' arithmetic."""
    return r50.resnet50(seed=0, depths=DEPTHS)[1]


def test_parameter_count_names_and_tutorial_split(start):
    assert sum(leaf.size for leaf in jax.tree.leaves(start["params"])) == 25_557_032
    fix = np.load(FIXTURES / "resnet50_forward.npz")
    assert sorted(r50.get_weights(start)) == list(fix["names"])  # torchvision's names


def test_stages_live_on_different_devices(devs, start):
    model = r50.PipelineParallelResNet50(devs, start, split_size=2)
    for params, stats, device in zip(model.params, model.stats, devs, strict=True):
        assert {d for leaf in jax.tree.leaves((params, stats)) for d in leaf.devices()} == {device}
    assert set(model.params[0]) == {"conv1", "bn1", "layer1", "layer2"}
    assert set(model.params[1]) == {"layer3", "layer4", "fc"}
    sizes = [sum(leaf.size for leaf in jax.tree.leaves(p)) for p in model.params]
    assert sizes == [1_444_928, 24_112_104]


def _as(tree, dtype):
    """Every array of `tree` in `dtype` (exact upwards: the weights are float32 numbers)."""
    return jax.tree.map(lambda a: jnp.asarray(a, dtype), tree)


def _fixture_forward(start, dtype):
    fix = np.load(FIXTURES / "resnet50_forward.npz")
    shapes = {k: v.shape for k, v in r50.get_weights(start).items()}
    params = weights.init_normal(shapes, float(fix["std"]), int(fix["seed"]))
    variables = r50.set_weights(_as(start, dtype), params)
    x = jnp.asarray(fix["input"].transpose(0, 2, 3, 1), dtype)  # NCHW -> NHWC
    # one jitted program: eager dispatch compiles a program per operation and shape
    out = jax.jit(lambda v: r50.ResNet50().apply(v, x, train=False))(variables)
    assert out.dtype == dtype
    return np.asarray(out, np.float64), fix


@pytest.mark.numerics
def test_float64_forward_reproduces_the_fixture(start):
    """Rule 1: JAX's float64 eval-mode forward computes the fixture's mathematics."""
    with jax.enable_x64(True):
        out, fix = _fixture_forward(start, jnp.float64)
    assert np.abs(fix["output"]).mean() > 1e-2  # not vanishing: the comparison means something
    numerics.check_same_math("jax resnet50 float64 forward", out, fix["output"])


@pytest.mark.numerics
def test_float32_forward_matches_the_float64_fixture(start):
    """Rule 2: eval-mode forward, continuous in the input."""
    out, fix = _fixture_forward(start, jnp.float32)
    sensitivity = float(fix["output.sensitivity"])
    numerics.check_float32(
        "jax resnet50 float32 forward", out, fix["output"], sensitivity, gen.STAGES, gen.REDUCTION
    )


@pytest.fixture(scope="module")
def data(devs):
    x, y = r50.make_data(config.get_config("resnet50", "smoke", image_size=32), devs)
    return np.asarray(x[0], np.float64), np.asarray(y[0], np.float64)


def merged(parts):
    """The whole network's tree from the stages' parts (each on its device), on the host."""
    whole = {}
    for part in jax.device_get(parts):
        for k, v in part.items():
            whole.setdefault(k, {}).update(v)
    return whole


def vector(weights):
    """A weights dict as one float64 vector, its keys sorted, as numerics compares a dict: each
    result is flattened once, not once per comparison (25M numbers)."""
    return np.concatenate([np.asarray(weights[k], np.float64).ravel() for k in sorted(weights)])


def one_step(model, train_bn, x, y, lr=0.01):
    """(output, gradients, variables after one SGD step) as numpy vectors."""
    model.train_bn = train_bn
    out = np.asarray(model(x))
    model.train_step(x, y, lr)
    variables = {"params": merged(model.params), "batch_stats": merged(model.stats)}
    grads = r50.get_weights({"params": merged(model.grads)})
    return out, vector(grads), vector(r50.get_weights(variables))


def compare(name, got, ref):
    numerics.check_same_math(f"{name}: output", got[0], ref[0])
    numerics.check_same_math(f"{name}: gradients", got[1], ref[1])
    numerics.check_same_math(f"{name}: weights after", got[2], ref[2])


@pytest.mark.numerics
@pytest.mark.multi_device
def test_model_parallel_equals_single_in_train_mode(devs, shallow, data):
    """Rule 1 (float64): one jit against a jit per stage differ in XLA's fusion choices, so in
    float32 they agree only to rounding; in float64 to 2**-24."""
    with jax.enable_x64(True):
        start = _as(shallow, jnp.float64)
        ref = one_step(r50.ModelParallelResNet50(devs[:1], start, depths=DEPTHS), True, *data)
        # The step moved the weights far more than the limit: the check can see a wrong step.
        moved = numerics.rel_error(ref[2], vector(r50.get_weights(start)))
        assert moved > 1e3 * numerics.SAME_MATH_LIMIT, moved
        for name, model in (
            ("model_parallel", r50.ModelParallelResNet50(devs, start, depths=DEPTHS)),
            (
                "pipeline one micro-batch",
                r50.PipelineParallelResNet50(devs, start, BATCH, 1000, DEPTHS),
            ),
        ):
            compare(f"jax resnet50 {name} vs single", one_step(model, True, *data), ref)


@pytest.fixture(scope="module")
def single_on_running_stats(devs, shallow, data):
    """One device's float64 step with BatchNorm on its running statistics: every split size's
    reference, computed once."""
    with jax.enable_x64(True):
        model = r50.ModelParallelResNet50(devs[:1], _as(shallow, jnp.float64), depths=DEPTHS)
        return one_step(model, False, *data)


@pytest.mark.numerics
@pytest.mark.multi_device
# 3 does not divide 4: micro-batches 3 and 1. One micro-batch (split BATCH) is the train-mode
# test's; each further split size costs XLA its own compilations.
@pytest.mark.parametrize("split", [1, 3])
def test_pipeline_equals_single_with_bn_on_running_stats(
    devs, shallow, data, single_on_running_stats, split
):
    """Rule 1 (float64). Train-mode BatchNorm normalises each micro-batch by its own statistics
    (as the tutorial does), so only with BN on its running statistics must the results agree
    for every split; the micro-batches' gradients add up to the batch's."""
    with jax.enable_x64(True):
        variables = _as(shallow, jnp.float64)
        model = r50.PipelineParallelResNet50(devs, variables, split, 1000, DEPTHS)
        got = one_step(model, False, *data)
    compare(f"jax resnet50 pipeline split {split} vs single", got, single_on_running_stats)


def test_bad_split_sizes_are_clear_errors(devs, start, data):
    for split in (0, BATCH + 1):
        with pytest.raises(config.ConfigError, match="split_size must be between 1"):
            config.get_config("resnet50", "smoke", split_size=split)
    model = r50.PipelineParallelResNet50(devs, start, split_size=BATCH + 1)
    with pytest.raises(config.ConfigError, match="split_size must be between 1"):
        model.train_step(*data, 0.01)


def args_for(tmp_path, **kw):
    return runs.command_args("resnet50", **{"results": str(tmp_path / "r.jsonl"), **kw})


def at_32(args):
    """The smoke preset at 32x32, the size of the tests above, so their compiled stages are
    reused (each new shape costs XLA a compilation of its own)."""
    return dataclasses.replace(cli.config_of(args), image_size=32)


def read(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.fixture
def shallow_main(monkeypatch, shallow):
    """main's records from runs.RESNET50_DEPTHS's network (its stages' sizes are checked above
    on the whole network's); returns that network's parameter count."""
    runs.shallow_resnet50(monkeypatch, r50)
    return sum(leaf.size for leaf in jax.tree.leaves(shallow["params"]))


@pytest.mark.slow
@pytest.mark.multi_device
def test_main_default_writes_three_records(tmp_path, shallow_main):
    args = args_for(tmp_path)
    r50.main(args, devices.DevicePlan(2, "cpu", True), at_32(args), HOOKS)
    recs = read(args.results)
    assert [r["strategy"] for r in recs] == ["single", "model_parallel", "pipeline"]
    assert recs[0]["devices"] == 1 and recs[2]["split_size"] == 2
    for r in recs[1:]:
        e = r["extra"]
        assert e["num_stages"] == 2 and sum(e["stage_params"]) == shallow_main
        assert e["stage_blocks"] == [list(b) for b in stages.stage_blocks(2, blocks_of(DEPTHS))]
    assert all(r["images_per_sec"] > 0 and r["seconds"]["n"] == 1 for r in recs)


@pytest.mark.slow
@pytest.mark.multi_device
def test_main_sweep_writes_one_record_per_split(tmp_path, shallow_main):
    args = args_for(tmp_path, sweep=True)
    r50.main(args, devices.DevicePlan(2, "cpu", True), at_32(args), HOOKS)
    recs = read(args.results)
    assert [(r["strategy"], r["split_size"], r["extra"]["sweep"]) for r in recs] == [
        ("pipeline", s, True) for s in (1, 2, 4)
    ]
    assert all(r["extra"]["round_robin"] and r["seconds"]["n"] == 1 for r in recs)


@pytest.mark.slow
def test_sweep_takes_the_split_sizes_round_robin(tmp_path, devs):
    """One model for the whole sweep, its split size changed between repeats: each step sees
    the split size of harness.round_robin's order, and each split size has its repeats. The
    order is the loop's, not the devices': both stages share one device, as in the one-GPU test
    below, which then runs the programs compiled here (micro-batches of 2; its stage
    measurements take the whole batch of 4)."""
    cfg = dataclasses.replace(at_32(args_for(tmp_path)), warmup=1, repeats=2)
    used = stages.stage_devices(devs[:1], "pipeline")
    model, seen = r50.build("pipeline", used, 1, cfg.num_classes, cfg.seed, DEPTHS), []
    step = model.train_step
    model.train_step = lambda *a: seen.append(model.split_size) or step(*a)
    sizes = (2, 4)  # two sizes show the order; each costs XLA compilations of its own
    runs = r50.train(model, cfg, used, harness.Repeats(cfg, sizes)).results()
    order = harness.round_robin(sizes, cfg.warmup, cfg.repeats)
    assert seen == [s for s in order for _ in range(cfg.num_batches)]
    assert {s: len(t.times) for s, (t, _) in runs.items()} == {2: 2, 4: 2}
    assert all(len(losses) == 3 * cfg.num_batches for _, losses in runs.values())


def test_one_gpu_runs_pipeline_with_both_stages_on_it(tmp_path, devs, monkeypatch):
    """A one-GPU plan, simulated with one CPU device: two stages share it, and the record says
    so (it measures the per-micro-batch overhead, not overlap)."""
    plan = devices.DevicePlan(1, "gpu", False)
    args = args_for(tmp_path, gpus=1, strategy="pipeline", split_size=2)
    monkeypatch.setattr(jdev, "get_devices", lambda plan: devs[:1])  # the "GPU"
    runs.shallow_resnet50(monkeypatch, r50)
    r50.main(args, plan, at_32(args), HOOKS)
    [rec] = read(args.results)
    assert rec["devices"] == 1 and rec["split_size"] == 2
    assert rec["extra"]["stages_share_device"] is True and rec["extra"]["num_stages"] == 2


def test_main_refuses_bad_requests_before_writing(tmp_path):
    one, two = devices.DevicePlan(1, "cpu", True), devices.DevicePlan(2, "cpu", True)
    cases = [
        (args_for(tmp_path, gpus=1, strategy="pipeline"), one, "at least 2 devices"),
        (args_for(tmp_path, strategy="gpipe"), two, "torch only"),
        (args_for(tmp_path, sweep=True, batch_size=3), two, "between 1 and the batch size"),
    ]
    for args, plan, message in cases:
        with pytest.raises(config.ConfigError, match=message):
            r50.main(args, plan, cli.config_of(args), HOOKS)
    assert not (tmp_path / "r.jsonl").exists()
