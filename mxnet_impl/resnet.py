"""torchvision's ResNet-50 written out in Gluon (torch takes Bottleneck and ResNet from
torchvision): the same layer names, padding and strides (attribute names are Gluon's structural
parameter names), so the weights line up by name."""

from mxnet.gluon import nn

from common.stages import DEPTHS, LAYERS


def batch_norm(channels):
    return nn.BatchNorm(momentum=0.9, epsilon=1e-5, in_channels=channels)


class Bottleneck(nn.HybridBlock):
    def __init__(self, inplanes, planes, stride=1, downsample=False):
        super().__init__()
        self.conv1 = nn.Conv2D(planes, 1, use_bias=False, in_channels=inplanes)
        self.bn1 = batch_norm(planes)
        self.conv2 = nn.Conv2D(planes, 3, stride, 1, use_bias=False, in_channels=planes)
        self.bn2 = batch_norm(planes)
        self.conv3 = nn.Conv2D(4 * planes, 1, use_bias=False, in_channels=planes)
        self.bn3 = batch_norm(4 * planes)
        self.relu = nn.Activation("relu")
        self.downsample = nn.HybridSequential() if downsample else None
        if downsample:
            self.downsample.add(
                nn.Conv2D(4 * planes, 1, stride, use_bias=False, in_channels=inplanes),
                batch_norm(4 * planes),
            )

    def hybrid_forward(self, F, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.HybridBlock):
    """`depths`: bottlenecks per layer (common.stages.blocks_of)."""

    def __init__(self, num_classes=1000, depths=DEPTHS):
        super().__init__()
        self.conv1 = nn.Conv2D(64, 7, 2, 3, use_bias=False, in_channels=3)
        self.bn1 = batch_norm(64)
        self.relu = nn.Activation("relu")
        self.maxpool = nn.MaxPool2D(3, 2, 1)
        inplanes = 64
        for (name, planes, _, stride), n in zip(LAYERS, depths, strict=True):
            layer = nn.HybridSequential()
            for i in range(n):
                layer.add(Bottleneck(inplanes, planes, stride if i == 0 else 1, i == 0))
                inplanes = 4 * planes
            setattr(self, name, layer)
        self.avgpool = nn.GlobalAvgPool2D()
        self.fc = nn.Dense(num_classes, in_units=4 * 512)  # flattens its input

    def hybrid_forward(self, F, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x))
