"""torch modules <-> the exchange format (common/weights.py). The format is torch's own: dotted
names, OIHW conv kernels, (out, in) dense weights, BatchNorm's running statistics by name. So
the adapter only leaves out torch's bookkeeping (`num_batches_tracked`) and copies in place,
each tensor keeping its device. One adapter for every torch model here, as in JAX and MXNet."""

import numpy as np
import torch

from common import weights


def shapes(net) -> dict:
    """Names and shapes in the exchange format (parameters and BN running statistics)."""
    return {k: tuple(v.shape) for k, v in _state(net).items()}


def get_weights(net) -> dict:
    # float64 (tests) stays float64; a copy, since on the CPU .numpy() shares memory.
    return {
        k: v.detach().to(torch.promote_types(v.dtype, torch.float32)).cpu().numpy().copy()
        for k, v in _state(net).items()
    }


def set_weights(net, params) -> None:
    """Copy `params` into `net` in place, each tensor on its device in its dtype."""
    weights.check_shapes(params, shapes(net))
    state = {k: torch.from_numpy(np.asarray(v)) for k, v in params.items()}
    net.load_state_dict(state, strict=False)  # strict=False: num_batches_tracked is kept


def _state(net) -> dict:
    # num_batches_tracked is torch-only bookkeeping, not a weight.
    return {k: v for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
