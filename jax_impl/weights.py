"""flax variables <-> the exchange format (common/weights.py): torch's dotted names, OIHW conv
kernels and (out, in) dense weights. flax keeps HWIO kernels and (in, out) dense weights, and
calls BatchNorm's weight `scale` and its statistics `mean` and `var`. One adapter for every
JAX model here; submodule names use `_` where torch's use `.` (`layer1_0` is `layer1.0`)."""

import jax
import jax.numpy as jnp
import numpy as np

from common import weights

_LEAF = {"kernel": "weight", "bias": "bias", "scale": "weight", "mean": "running_mean"}
_LEAF["var"] = "running_var"


def flat(variables):
    """(exchange name, flax path, array) for every parameter and BatchNorm statistic."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(dict(variables))[0]:
        keys = tuple(k.key for k in path)
        name = ".".join([k.replace("_", ".") for k in keys[1:-1]] + [_LEAF[keys[-1]]])
        yield name, keys, leaf


def to_exchange(a):
    a = np.asarray(a)
    return a.transpose(3, 2, 0, 1) if a.ndim == 4 else a.T if a.ndim == 2 else a  # HWIO->OIHW


def from_exchange(a):
    a = np.asarray(a)
    return a.transpose(2, 3, 1, 0) if a.ndim == 4 else a.T if a.ndim == 2 else a  # OIHW->HWIO


def shapes(variables) -> dict:
    return {name: to_exchange(np.zeros(np.shape(leaf))).shape for name, _, leaf in flat(variables)}


def get_weights(variables) -> dict:
    return {name: to_exchange(leaf) for name, _, leaf in flat(variables)}


def set_weights(variables, params):
    """New variables holding `params` (JAX replaces; torch and Gluon copy in place), each in its
    old leaf's dtype, and on its old leaf's devices where that was a placed array."""
    weights.check_shapes(params, shapes(variables))
    out = jax.tree_util.tree_map(lambda v: v, dict(variables))
    for name, keys, old in flat(variables):
        node = out
        for k in keys[:-1]:
            node[k] = dict(node[k])
            node = node[k]
        new = jnp.asarray(from_exchange(params[name]), dtype=old.dtype)
        if isinstance(old, jax.Array):
            new = jax.device_put(new, old.sharding)
        node[keys[-1]] = new
    return out
