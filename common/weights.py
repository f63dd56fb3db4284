"""A framework-neutral weight exchange format, so all three frameworks can start from one set of
numbers and their outputs can be compared (docs/design.md).

A `.npz` of float32 arrays named with the shared layer names, dotted like torch's state_dict
(`conv1.weight`, `layer1.0.bn1.running_mean`, `fc.bias`), in one layout:
  conv kernels  OIHW  (out channels, in channels, kernel height, kernel width)
  dense weights (out features, in features)
  biases, BatchNorm weight/bias/running_mean/running_var: 1-D
torch and MXNet use this layout natively; JAX/flax converts (conv HWIO, dense (in, out)).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

FORMAT_VERSION = 1
_VERSION_KEY = "__format_version__"


class WeightsError(ValueError):
    """An unreadable or mismatched weights file: the message is one line."""


def init_normal(shapes: dict[str, tuple[int, ...]], std: float, seed: int) -> dict[str, np.ndarray]:
    """d2l's init: `*.weight` of rank >= 2 ~ normal(0, std); everything else zero, except
    BatchNorm scales (`bn*.weight`, rank 1) and running variances, which start at one."""
    rng = np.random.default_rng(seed)
    params = {}
    for name in sorted(shapes):  # sorted: the same draws whatever order a framework lists them
        shape = tuple(shapes[name])
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "weight" and len(shape) >= 2:
            params[name] = rng.normal(0.0, std, size=shape).astype(np.float32)
        elif leaf in ("running_var",) or (leaf == "weight" and len(shape) == 1):
            params[name] = np.ones(shape, np.float32)
        else:
            params[name] = np.zeros(shape, np.float32)
    return params


def save(path: str | os.PathLike, params: dict[str, np.ndarray]) -> Path:
    """Write `params` atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    arrays = {k: np.asarray(v, dtype=np.float32) for k, v in params.items()}
    with open(tmp, "wb") as f:
        np.savez(f, **arrays, **{_VERSION_KEY: np.array(FORMAT_VERSION)})
    os.replace(tmp, path)
    return path


def load(path: str | os.PathLike) -> dict[str, np.ndarray]:
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise WeightsError(f"{path}: not a readable weights file ({e})") from None
    version = data.pop(_VERSION_KEY, None)
    if version is None or int(version) != FORMAT_VERSION:
        raise WeightsError(f"{path}: weights format version {version}, expected {FORMAT_VERSION}")
    return data


def check_shapes(params: dict[str, np.ndarray], expected: dict[str, tuple[int, ...]]) -> None:
    """Same names and shapes, or one line saying the first difference."""
    missing = sorted(set(expected) - set(params))
    extra = sorted(set(params) - set(expected))
    if missing or extra:
        raise WeightsError(
            f"weights do not match the model: missing {missing[:3]}, extra {extra[:3]}"
        )
    for name, shape in expected.items():
        if tuple(params[name].shape) != tuple(shape):
            raise WeightsError(
                f"weights do not match the model: {name} has shape {params[name].shape}, "
                f"expected {tuple(shape)}"
            )
