import numpy as np
import pytest

from common import weights

SHAPES = {
    "conv1.weight": (4, 1, 3, 3),
    "conv1.bias": (4,),
    "bn1.weight": (4,),
    "bn1.running_var": (4,),
    "fc.weight": (10, 4),
    "fc.bias": (10,),
}


def test_init_is_seeded_and_follows_d2l():
    a = weights.init_normal(SHAPES, std=0.01, seed=0)
    b = weights.init_normal(dict(reversed(SHAPES.items())), std=0.01, seed=0)
    for k in SHAPES:
        assert np.array_equal(a[k], b[k]) and a[k].dtype == np.float32
    assert np.all(a["conv1.bias"] == 0) and np.all(a["bn1.weight"] == 1)
    assert np.all(a["bn1.running_var"] == 1)
    assert 0.005 < a["conv1.weight"].std() < 0.02


def test_round_trip_and_shape_check(tmp_path):
    a = weights.init_normal(SHAPES, std=0.01, seed=0)
    path = weights.save(tmp_path / "w.npz", a)
    b = weights.load(path)
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)
    weights.check_shapes(b, SHAPES)
    with pytest.raises(weights.WeightsError, match="fc.weight has shape"):
        weights.check_shapes(b, {**SHAPES, "fc.weight": (4, 10)})
    with pytest.raises(weights.WeightsError, match="missing"):
        weights.check_shapes(b, {**SHAPES, "fc2.bias": (1,)})


def test_unreadable_file(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(weights.WeightsError, match="not a readable weights file"):
        weights.load(bad)
