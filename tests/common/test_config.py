import pytest

from common import config


def test_full_presets_are_the_reference_protocol():
    lenet = config.get_config("lenet", "full")
    assert (lenet.batch_size, lenet.lr, lenet.epochs, lenet.init_std) == (256, 0.2, 10, 0.01)
    r18 = config.get_config("resnet18", "full")
    assert (r18.batch_size, r18.lr, r18.epochs) == (256, 0.1, 10)
    r18x2 = config.for_devices(r18, 2)
    assert (r18x2.batch_size, r18x2.lr) == (512, 0.2)
    assert config.for_devices(r18x2, 2) == r18x2  # resolving twice changes nothing
    r50 = config.get_config("resnet50", "full")
    assert (r50.num_batches, r50.batch_size, r50.image_size, r50.lr, r50.repeats) == (
        3,
        120,
        128,
        0.001,
        10,
    )
    assert r50.split_sizes == (1, 3, 5, 8, 10, 12, 20, 40, 60)


@pytest.mark.parametrize("workload", config.WORKLOADS)
@pytest.mark.parametrize("preset", config.PRESETS)
def test_every_preset_is_valid(workload, preset):
    cfg = config.get_config(workload, preset)
    assert cfg.preset == preset
    if workload == "resnet50":
        assert all(1 <= s <= cfg.batch_size for s in cfg.split_sizes)


def test_overrides_and_errors():
    assert config.get_config("lenet", "smoke", epochs=3, lr=None).epochs == 3
    with pytest.raises(config.ConfigError, match="unknown preset 'huge'"):
        config.get_config("lenet", "huge")
    with pytest.raises(config.ConfigError, match="unknown workload 'vgg'"):
        config.get_config("vgg", "smoke")
    with pytest.raises(config.ConfigError, match="no setting 'split_size'"):
        config.get_config("lenet", "smoke", split_size=2)
    with pytest.raises(config.ConfigError, match="epochs must be at least 1"):
        config.get_config("lenet", "smoke", epochs=0)


@pytest.mark.parametrize("split", [0, 121])
def test_split_size_out_of_range(split):
    with pytest.raises(config.ConfigError, match="split_size must be between 1 and"):
        config.get_config("resnet50", "full", split_size=split)


def test_divisibility_rule():
    config.check_divisible(256, 2)
    with pytest.raises(config.ConfigError, match="batch size 255 does not divide evenly over 2"):
        config.check_divisible(255, 2)


def test_epoch_split_rule_covers_the_last_batch():
    config.check_epoch_split(60000, 256, 2)  # last batch 96: splits
    with pytest.raises(config.ConfigError, match="last batch of each epoch has 1 images"):
        config.check_epoch_split(1025, 256, 2)
    with pytest.raises(config.ConfigError, match="batch size 255 does not divide"):
        config.check_epoch_split(1020, 255, 2)
