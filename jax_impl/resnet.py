"""torchvision's ResNet-50 written out in flax (torch takes Bottleneck and ResNet from
torchvision): the same layer names, padding and strides, so the weights line up by name.
`ResNet50(blocks=...)` runs a subset of common.stages.BLOCKS: one pipeline stage."""

import flax.linen as nn
import jax.numpy as jnp

from common.stages import BLOCKS, LAYERS


def batch_norm(train, name):
    return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, name=name)


class Downsample(nn.Module):
    features: int
    stride: int

    @nn.compact
    def __call__(self, x, train):
        x = nn.Conv(self.features, (1, 1), self.stride, use_bias=False, name="0")(x)
        return batch_norm(train, "1")(x)


class Bottleneck(nn.Module):
    planes: int
    stride: int = 1
    downsample: bool = False

    @nn.compact
    def __call__(self, x, train):
        out = nn.Conv(self.planes, (1, 1), use_bias=False, name="conv1")(x)
        out = nn.relu(batch_norm(train, "bn1")(out))
        out = nn.Conv(
            self.planes, (3, 3), self.stride, ((1, 1), (1, 1)), use_bias=False, name="conv2"
        )(out)
        out = nn.relu(batch_norm(train, "bn2")(out))
        out = nn.Conv(4 * self.planes, (1, 1), use_bias=False, name="conv3")(out)
        out = batch_norm(train, "bn3")(out)
        if self.downsample:
            x = Downsample(4 * self.planes, self.stride, name="downsample")(x, train)
        return nn.relu(out + x)


class Layer(nn.Module):
    """Some (or all) of one layer's bottlenecks, named by index as torchvision does."""

    planes: int
    stride: int
    indices: tuple

    @nn.compact
    def __call__(self, x, train):
        for i in self.indices:
            stride = self.stride if i == 0 else 1
            x = Bottleneck(self.planes, stride, downsample=i == 0, name=str(i))(x, train)
        return x


class ResNet50(nn.Module):
    """ResNet-50 (Bottleneck, [3, 4, 6, 3]); runs the `blocks` of BLOCKS it is given: all of
    them, or one stage's, whose variables are then a subtree of the whole network's."""

    num_classes: int = 1000
    blocks: tuple = BLOCKS

    @nn.compact
    def __call__(self, x, train=True):
        if "stem" in self.blocks:
            x = nn.Conv(64, (7, 7), 2, ((3, 3), (3, 3)), use_bias=False, name="conv1")(x)
            x = nn.relu(batch_norm(train, "bn1")(x))
            x = nn.max_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1)))
        for name, planes, n, stride in LAYERS:
            indices = tuple(i for i in range(n) if f"{name}.{i}" in self.blocks)
            if indices:
                x = Layer(planes, stride, indices, name=name)(x, train)
        if "head" in self.blocks:
            x = nn.Dense(self.num_classes, name="fc")(jnp.mean(x, axis=(1, 2)))
        return x
