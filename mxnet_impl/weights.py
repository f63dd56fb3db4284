"""Gluon parameters <-> the exchange format (common/weights.py). Gluon's structural names
(`layer1.0.bn1.gamma`, from the attribute names) are torch's but for BatchNorm's `gamma` and
`beta` (torch's weight and bias); the layouts are the same (OIHW, (out, in)). One adapter for
every MXNet model here."""

from mxnet import nd

from common import weights
from mxnet_impl import guard

_LEAF = {"gamma": "weight", "beta": "bias"}


def named_params(net) -> dict:
    """Exchange name -> Parameter, from the structural names Gluon's save_parameters writes."""
    out = {}
    for name, p in guard.structural_params(net).items():
        head, leaf = name.rsplit(".", 1)
        out[f"{head}.{_LEAF.get(leaf, leaf)}"] = p
    return out


def shapes(net) -> dict:
    return {k: tuple(p.shape) for k, p in named_params(net).items()}


def get_weights(net) -> dict:
    return {k: p.data(p.list_ctx()[0]).asnumpy() for k, p in named_params(net).items()}


def set_weights(net, params) -> None:
    """Copy `params` in place, onto every context a parameter has, in the parameter's dtype."""
    weights.check_shapes(params, shapes(net))
    for k, p in named_params(net).items():
        p.set_data(nd.array(params[k], dtype=p.dtype))
