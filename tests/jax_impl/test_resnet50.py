import argparse
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import config, devices, weights
from jax_impl import resnet50 as r50

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BATCH = 4
# float32, sums of a few thousand terms per output: micro-batches change how XLA blocks the
# convolutions, so results agree to rounding (~1e-6 relative), not bit for bit. The bound is
# relative to each tensor's largest entry (entries near zero have no scale of their own).
RTOL = 1e-5


def close(a, b, rtol=RTOL):
    a, b = np.asarray(a), np.asarray(b)
    return np.abs(a - b).max() <= rtol * max(np.abs(b).max(), 1e-30)


@pytest.fixture(scope="module")
def devs():
    found = jax.devices("cpu")[:2]
    assert len(found) == 2 and found[0] != found[1]
    return found


def test_toy_model_one_step_matches_numpy(devs):
    k_init, k_x, k_y = jax.random.split(jax.random.key(0), 3)
    x, y = jax.random.normal(k_x, (20, 10)), jax.random.normal(k_y, (20, 5))
    p0 = jax.device_get(r50.ToyModel().init(k_init, x, devs[:1])["params"])
    params, loss = r50.train_toy(devs, lr=0.1, seed=0)
    x, y = np.asarray(x), np.asarray(y)
    w1, b1, w2, b2 = (p0[n][k] for n in ("net1", "net2") for k in ("kernel", "bias"))
    h = np.maximum(x @ w1 + b1, 0)
    out = h @ w2 + b2
    assert loss == pytest.approx(np.mean((out - y) ** 2), rel=1e-6)
    g_out = 2 * (out - y) / out.size
    assert close(params["net2"]["kernel"], w2 - 0.1 * h.T @ g_out)
    assert close(params["net1"]["kernel"], w1 - 0.1 * x.T @ ((g_out @ w2.T) * (h > 0)))
    assert params["net1"]["kernel"].devices() == {devs[0]}
    assert params["net2"]["kernel"].devices() == {devs[1]}


@pytest.fixture(scope="module")
def start():
    return r50.resnet50(seed=0)[1]


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
    assert sum(leaf.size for leaf in jax.tree.leaves(model.params)) == 25_557_032


def test_forward_matches_the_torch_fixture(start):
    fix = np.load(FIXTURES / "resnet50_forward.npz")
    shapes = {k: v.shape for k, v in r50.get_weights(start).items()}
    variables = r50.set_weights(start, weights.init_normal(shapes, float(fix["std"]), 0))
    x = jnp.asarray(fix["input"].transpose(0, 2, 3, 1))  # NCHW -> NHWC
    out = r50.ResNet50().apply(variables, x, train=False)
    assert close(out, fix["output"], rtol=1e-5)  # float32 through 50 layers: ~1e-6 seen


@pytest.fixture(scope="module")
def data(devs):
    x, y = r50.make_data(config.get_config("resnet50", "smoke", image_size=32), devs)
    return x[0], y[0]


def one_step(model, train_bn, x, y, lr=0.01, with_output=False):
    """(output or None, gradients, variables after one SGD step) as numpy dicts."""
    model.train_bn = train_bn
    out = np.asarray(model(x)) if with_output else None
    model.train_step(x, y, lr)
    grads = {}
    for g in jax.device_get(model.grads):
        for k, v in g.items():
            grads.setdefault(k, {}).update(v)
    return out, r50.get_weights({"params": grads}), r50.get_weights(model.variables)


@pytest.mark.multi_device
def test_model_parallel_equals_single_exactly_in_train_mode(devs, start, data):
    single = one_step(r50.ModelParallelResNet50(devs[:1], start), True, *data)
    for model in (
        r50.ModelParallelResNet50(devs, start),
        r50.PipelineParallelResNet50(devs, start, split_size=BATCH),  # one micro-batch
    ):
        _, grads, after = one_step(model, True, *data)
        # Not bitwise: one jit vs two differ in XLA's fusion choices; 1e-6 is float32 rounding.
        for k in single[1]:
            assert close(grads[k], single[1][k], rtol=1e-6), k
        for k in single[2]:
            assert close(after[k], single[2][k], rtol=1e-6), k


@pytest.mark.multi_device
@pytest.mark.parametrize("split", [1, 3, BATCH])  # 3 does not divide 4: micro-batches 3 and 1
def test_pipeline_equals_single_with_bn_on_running_stats(devs, start, data, split):
    # Train-mode BatchNorm normalises each micro-batch by its own statistics (as the tutorial
    # does), so only with BN on its running statistics must the results agree for every split.
    ref = one_step(r50.ModelParallelResNet50(devs[:1], start), False, *data, with_output=True)
    model = r50.PipelineParallelResNet50(devs, start, split)
    got = one_step(model, False, *data, with_output=split == 3)
    if split == 3:
        assert close(got[0], ref[0])
    for k in ref[1]:
        assert close(got[1][k], ref[1][k], rtol=1e-4), k  # summed over micro-batches
    for k in ref[2]:
        assert close(got[2][k], ref[2][k]), k


def test_bad_split_sizes_are_clear_errors(devs, start, data):
    for split in (0, BATCH + 1):
        with pytest.raises(config.ConfigError, match="split_size must be between 1"):
            config.get_config("resnet50", "smoke", split_size=split)
    model = r50.PipelineParallelResNet50(devs, start, split_size=BATCH + 1)
    with pytest.raises(config.ConfigError, match="split_size must be between 1"):
        model.train_step(*data, 0.01)


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


@pytest.fixture
def at_32(monkeypatch):
    """The smoke preset at 32x32, the size of the tests above, so their compiled stages are
    reused (each new shape costs XLA several seconds to compile on 2 cores)."""
    get_config = config.get_config
    monkeypatch.setattr(
        r50.config, "get_config", lambda *a, **kw: get_config(*a, **kw, image_size=32)
    )


@pytest.mark.multi_device
def test_main_default_writes_three_records(tmp_path, at_32):
    args = args_for(tmp_path)
    r50.main(args, devices.DevicePlan(2, "cpu", True))
    recs = read(args.results)
    assert [r["strategy"] for r in recs] == ["single", "model_parallel", "pipeline"]
    assert recs[0]["devices"] == 1 and recs[2]["split_size"] == 2
    for r in recs[1:]:
        e = r["extra"]
        assert e["num_stages"] == 2 and len(e["stage_seconds"]) == 2
        assert e["stage_params"] == [1_444_928, 24_112_104]
        assert len(e["stage_peak_memory_bytes"]) == 2 and e["memory_source"]
    assert all(r["images_per_sec"] > 0 and r["seconds"]["n"] == 1 for r in recs)


@pytest.mark.slow
@pytest.mark.multi_device
def test_main_sweep_writes_one_record_per_split(tmp_path, at_32):
    args = args_for(tmp_path, sweep=True)
    r50.main(args, devices.DevicePlan(2, "cpu", True))
    assert [(r["strategy"], r["split_size"], r["extra"]["sweep"]) for r in read(args.results)] == [
        ("pipeline", s, True) for s in (1, 2, 4)
    ]


def test_main_refuses_bad_requests_before_writing(tmp_path):
    one, two = devices.DevicePlan(1, "cpu", True), devices.DevicePlan(2, "cpu", True)
    cases = [
        (args_for(tmp_path, gpus=1, strategy="pipeline"), one, "at least 2 devices"),
        (args_for(tmp_path, strategy="gpipe"), two, "torch only"),
        (args_for(tmp_path, sweep=True, batch_size=3), two, "between 1 and the batch size"),
    ]
    for args, plan, message in cases:
        with pytest.raises(config.ConfigError, match=message):
            r50.main(args, plan)
    assert not (tmp_path / "r.jsonl").exists()
