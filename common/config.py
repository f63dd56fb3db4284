"""One frozen dataclass per workload, with three presets.

`full` is the book / tutorial protocol (docs/design.md), the default with accelerators.
`cpu` fits a 2-core machine in minutes; `smoke` runs in seconds, for tests.
Values that depend on the device count (resnet18 batch and lr) are resolved by `for_devices`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

PRESETS = ("smoke", "cpu", "full")
WORKLOADS = ("lenet", "resnet18", "resnet50", "zero", "allreduce")
# The workloads that train d2l's ResNet-18 on Fashion-MNIST: lesson 2, and lesson 4 (`zero`), its
# state sharded over the devices.
RESNET18_WORKLOADS = ("resnet18", "zero")


class ConfigError(ValueError):
    """A bad preset, workload or override: the message is one line for the user."""


@dataclass(frozen=True)
class LenetConfig:
    preset: str
    batch_size: int = 256
    lr: float = 0.2
    epochs: int = 10
    init_std: float = 0.01
    train_subset: int | None = None  # None: all 60k images
    test_subset: int | None = None  # None: all 10k images
    seed: int = 0


@dataclass(frozen=True)
class Resnet18Config:
    preset: str
    batch_size: int = 256  # per run on 1 device; scaled with the device count by `for_devices`
    lr: float = 0.1  # likewise
    scale_with_devices: bool = True  # d2l 13.6: 2 devices use batch 512 and lr 0.2
    epochs: int = 10
    init_std: float = 0.01
    train_subset: int | None = None
    test_subset: int | None = None
    steps_per_epoch: int | None = None  # None: a whole epoch; else the epoch time is extrapolated
    image_size: int = 28
    seed: int = 0


@dataclass(frozen=True)
class ZeroConfig(Resnet18Config):
    """Lesson 4: lesson 2's ResNet-18, data and batches, trained with AdamW, whose two moments per
    parameter are the optimizer state that ZeRO and FSDP shard (plain SGD has none). The
    settings are torch's AdamW defaults, given to every framework (optax's own decay differs)."""

    lr: float = 1e-3
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8


@dataclass(frozen=True)
class Resnet50Config:
    preset: str
    num_batches: int = 3
    batch_size: int = 120
    image_size: int = 128
    num_classes: int = 1000
    lr: float = 0.001
    repeats: int = 10
    warmup: int = 1
    split_size: int = 20  # micro-batch size of the `pipeline` strategy
    split_sizes: tuple[int, ...] = (1, 3, 5, 8, 10, 12, 20, 40, 60)
    seed: int = 0


@dataclass(frozen=True)
class AllreduceConfig:
    """The collectives benchmark (common/collectives.py): buffers of 4 B to `max_bytes` in
    powers of 4, each timed over about `budget_s` seconds of all-reduces."""

    preset: str
    max_bytes: int = 4**13  # 64 MiB, as nccl-tests' usual -e 64M
    budget_s: float = 1.0
    seed: int = 0


_PRESETS: dict[str, dict[str, dict]] = {
    "lenet": {
        "full": {},
        # The book's protocol as it is: LeNet takes seconds per epoch on 2 CPU cores, and with
        # normal(0, 0.01) init the loss sits at ln(10) for the first epochs, so fewer would
        # report chance accuracy.
        "cpu": {},
        "smoke": {"epochs": 1, "train_subset": 1024, "test_subset": 512},
    },
    "resnet18": {
        "full": {},
        # ResNet-18 on 2 CPU cores takes far too long per epoch: a bounded number of steps per
        # epoch, the epoch time extrapolated from them, accuracy on a test subset. Three such
        # epochs, so the time is a median of three, not a single run.
        "cpu": {
            "epochs": 3,
            "batch_size": 64,
            "lr": 0.05,
            "steps_per_epoch": 10,
            "test_subset": 1000,
        },
        "smoke": {
            "epochs": 1,
            "batch_size": 16,
            "lr": 0.05,
            "train_subset": 96,  # 3 batches of 32 on 2 devices, 2 of them run: extrapolated
            "test_subset": 64,
            "steps_per_epoch": 2,
        },
    },
    "resnet50": {
        "full": {},
        "cpu": {
            "num_batches": 2,
            "batch_size": 24,
            "image_size": 64,
            "repeats": 3,
            "split_size": 6,
            "split_sizes": (1, 2, 3, 4, 6, 8, 12, 24),
        },
        "smoke": {
            "num_batches": 1,
            "batch_size": 4,
            # 64, not 32: at 32x32 layer4 is 1x1, and torch's BatchNorm refuses a micro-batch
            # of 1 in train mode (one value per channel), which the sweep's split 1 makes.
            "image_size": 64,
            "repeats": 1,
            "warmup": 1,
            "split_size": 2,
            "split_sizes": (1, 2, 4),
        },
    },
    # resnet18's presets with AdamW's learning rate: DDP and its sharded forms on the same batches.
    "zero": {
        "full": {},
        "cpu": {"epochs": 3, "batch_size": 64, "steps_per_epoch": 10, "test_subset": 1000},
        "smoke": {
            "epochs": 1,
            "batch_size": 16,
            "train_subset": 96,
            "test_subset": 64,
            "steps_per_epoch": 2,
        },
    },
    # The collectives need little compute: the same sizes on a CPU as on a GPU; smoke stops at
    # 4 KiB, for tests.
    "allreduce": {"full": {}, "cpu": {}, "smoke": {"max_bytes": 4**6, "budget_s": 0.02}},
}

_CLASSES = {
    "lenet": LenetConfig,
    "resnet18": Resnet18Config,
    "resnet50": Resnet50Config,
    "zero": ZeroConfig,
    "allreduce": AllreduceConfig,
}


def get_config(workload: str, preset: str, **overrides):
    """The config of `workload` at `preset`, with `overrides` (None values are ignored)."""
    if workload not in _CLASSES:
        raise ConfigError(f"unknown workload {workload!r}; choose one of {', '.join(WORKLOADS)}")
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    cls = _CLASSES[workload]
    values = dict(_PRESETS[workload][preset])
    names = {f.name for f in dataclasses.fields(cls)}
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in names:
            raise ConfigError(f"{workload} has no setting {key!r}")
        values[key] = value
    cfg = cls(preset=preset, **values)
    validate(cfg)
    return cfg


def validate(cfg) -> None:
    for name in ("batch_size", "epochs", "num_batches", "repeats", "image_size", "steps_per_epoch"):
        value = getattr(cfg, name, None)
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be at least 1, got {value}")
    lr = getattr(cfg, "lr", 1.0)
    if not math.isfinite(lr) or lr <= 0:  # `nan <= 0` is False: nan needs its own test
        raise ConfigError(f"lr must be a positive finite number, got {lr}")
    if isinstance(cfg, Resnet50Config):
        check_split_size(cfg.split_size, cfg.batch_size)


def check_split_size(split_size: int, batch_size: int) -> None:
    """Micro-batches of `split_size`; the last one may be smaller, so any 1..batch is valid."""
    if not 1 <= split_size <= batch_size:
        raise ConfigError(
            f"split_size must be between 1 and the batch size {batch_size}, got {split_size}"
        )


def for_devices(cfg, n_devices: int):
    """Resolve device-dependent values: resnet18 and zero scale batch and lr with the devices."""
    if isinstance(cfg, Resnet18Config) and cfg.scale_with_devices and n_devices > 1:
        return dataclasses.replace(
            cfg,
            batch_size=cfg.batch_size * n_devices,
            lr=cfg.lr * n_devices,
            scale_with_devices=False,
        )
    return cfg


def check_divisible(batch_size: int, n_devices: int) -> None:
    """Data parallel here splits every batch evenly; an uneven split is refused, never dropped."""
    if batch_size % n_devices:
        raise ConfigError(
            f"batch size {batch_size} does not divide evenly over {n_devices} devices; "
            f"choose a batch size that is a multiple of {n_devices}"
        )


def check_epoch_split(n_train: int, batch_size: int, n_devices: int) -> None:
    """Every batch of an epoch splits evenly over the devices, the last (partial) one included:
    the rule of this project, so no sample is ever dropped from the gradient."""
    if batch_size > n_train:
        raise ConfigError(
            f"batch size {batch_size} is larger than the {n_train} training images; "
            f"choose at most {n_train}"
        )
    check_divisible(batch_size, n_devices)
    last = n_train % batch_size
    if last % n_devices:
        raise ConfigError(
            f"the last batch of each epoch has {last} images ({n_train} training images, batch "
            f"size {batch_size}), which do not divide evenly over {n_devices} devices; choose a "
            f"batch size that leaves a multiple of {n_devices}"
        )


def default_preset(has_accelerators: bool) -> str:
    return "full" if has_accelerators else "cpu"
