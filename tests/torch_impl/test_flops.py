"""common.flops against torch's own counter, torch.utils.flop_counter.FlopCounterMode, on the
project's torch models.

FlopCounterMode counts the convolution and matmul ops only, at 2 FLOPs per multiply-add and
every kernel tap (zero padding included): the line common.flops draws, so the counts must agree
exactly. The models are built on the meta device (shapes, no arithmetic): full-size ResNets
count in a fraction of a second.
"""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from common import flops
from torch_impl import lenet
from torch_impl import resnet18 as r18
from torch_impl import resnet50 as r50

BATCH = 2  # counts are divided by it: per image, and batch-linear

CASES = [
    ("lenet", {}),
    ("resnet18", {"width": 8}),
    ("resnet18", {"width": 64}),  # full width, 28x28: the 0.912 GFLOP
    ("resnet50", {"image_size": 64}),
    ("resnet50", {"image_size": 128}),  # the full preset's size: the 2.67 GFLOP
]


def forward_fn(workload, shape):
    """A closure running the project's model forward on a meta batch of BATCH images."""
    with torch.device("meta"):
        if workload == "lenet":
            params = {k: torch.empty(s, requires_grad=True) for k, s in lenet.SHAPES.items()}
            x = torch.empty(BATCH, 1, 28, 28)
            return lambda: lenet.lenet(x, params)
        if workload == "resnet18":
            net, x = r18.resnet18(width=shape["width"]), torch.empty(BATCH, 1, 28, 28)
        else:
            size = shape["image_size"]
            net, x = r50.resnet50(), torch.empty(BATCH, 3, size, size)
    return lambda: net(x)


def counted(fn):
    with FlopCounterMode(display=False) as counter:
        out = fn()
    return counter.get_total_flops(), out


@pytest.mark.parametrize("workload, shape", CASES)
def test_forward_matches_flop_counter_mode(workload, shape):
    total, _ = counted(forward_fn(workload, shape))
    assert total == BATCH * flops.forward_flops(workload, **shape)


@pytest.mark.parametrize("workload, shape", CASES)
def test_backward_is_twice_forward_less_the_images_gradient(workload, shape):
    # Backward: the input and the weight gradient of every conv and dense layer, each the
    # forward's size, except the first layer's input gradient (the images need none), which
    # torch does not compute. So train = 3 x forward - first layer, as common.flops says.
    _, out = counted(forward_fn(workload, shape))
    backward, _ = counted(lambda: out.float().sum().backward())
    layers = flops.layers(workload, **shape)
    per_image = 2 * flops.forward_flops(workload, **shape) - layers[0].flops
    assert backward == BATCH * per_image
