"""ResNet-50 split over devices: model parallel and pipelined, after the PyTorch tutorial
"Single-machine model parallel best practices", timed correctly (docs/design.md).

Read in order: the toy model (the whole idea in ten lines), the network and how it is cut into
stages, the model-parallel and pipelined models, the training loop, the split-size sweep, main.
MXNet: each stage's parameters are initialised on its context and activations move with
`as_in_context`; the engine is asynchronous, so nothing waits inside the loop and the contexts'
worker threads overlap.
"""

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn

from common import config, stages
from common.stages import DEPTHS, blocks_in, stage_blocks
from mxnet_impl import devices as mdev
from mxnet_impl import guard
from mxnet_impl import weights as mweights
from mxnet_impl.resnet import ResNet

FRAMEWORK = "mxnet"
STRATEGIES = ("single", "model_parallel", "pipeline")


class ToyModel(gluon.Block):
    """The tutorial's first example: one layer per device, the activation moved in between."""

    def __init__(self, devices):
        super().__init__()
        self.devices = [devices[0], devices[-1]]
        self.net1 = nn.Dense(10, in_units=10)
        self.relu = nn.Activation("relu")
        self.net2 = nn.Dense(5, in_units=10)
        self.net1.initialize(ctx=self.devices[0])
        self.net2.initialize(ctx=self.devices[1])

    def forward(self, x):
        x = self.relu(self.net1(x.as_in_context(self.devices[0])))
        return self.net2(x.as_in_context(self.devices[1]))


def train_toy(devices, lr=0.001, seed=0):
    """One SGD step of ToyModel; autograd follows the activation back across contexts.
    Returns the model (updated in place) and the loss before the step."""
    mx.random.seed(seed)
    model = ToyModel(devices)
    inputs, labels = nd.random.normal(shape=(20, 10)), nd.random.normal(shape=(20, 5))
    # a Trainer needs all its parameters on one set of contexts: one per layer here
    trainers = [
        gluon.Trainer(layer.collect_params(), "sgd", {"learning_rate": lr}, kvstore=None)
        for layer in (model.net1, model.net2)
    ]
    with autograd.record():
        outputs = model(inputs)
        loss = ((outputs - labels.as_in_context(outputs.context)) ** 2).mean()
    loss.backward()
    for trainer in trainers:
        trainer.step(1)
    return model, loss.asscalar()


def resnet50(num_classes=1000, depths=DEPTHS):
    """ResNet-50 (Bottleneck, [3, 4, 6, 3]) as torchvision builds it, not yet initialised.
    `depths`: bottlenecks per layer (common.stages.blocks_of)."""
    return ResNet(num_classes, depths)


INIT = mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2)  # He normal


def get_weights(model):
    """The shared weight format (common/weights.py)."""
    return mweights.get_weights(model)


def set_weights(model, params):
    """Copy shared-format arrays into `model` in place (onto every context a parameter has)."""
    mweights.set_weights(model, params)


def split_into_stages(model, devices):
    """One HybridSequential per device, made of `model`'s own blocks (shared, not copied),
    whose parameters are initialised on that device. On two devices this is the tutorial's
    split: stage 1 = stem (conv1, bn1, relu, maxpool) + layer1 + layer2, stage 2 = layer3 +
    layer4 + avgpool + fc; on more, the blocks are cut into contiguous stages of balanced FLOPs
    (common.stages.stage_blocks)."""
    parts = {
        "stem": [model.conv1, model.bn1, model.relu, model.maxpool],
        "head": [model.avgpool, model.fc],
    }
    per_device = []
    for names, device in zip(stage_blocks(len(devices), blocks_in(model)), devices, strict=True):
        stage = nn.HybridSequential()
        for b in names:
            layer, _, i = b.partition(".")
            stage.add(*(parts[b] if b in parts else [getattr(model, layer)[int(i)]]))
        stage.initialize(INIT, ctx=device)
        stage.hybridize()
        per_device.append(stage)
    return per_device


class ModelParallelResNet50(ResNet):
    """Stage i on devices[i]; the activation moves to the next context between stages."""

    def __init__(self, devices, num_classes=1000, depths=DEPTHS):
        super().__init__(num_classes, depths)
        self.devices = list(devices)
        # A plain list, not registered children: the stages share the model's blocks, and
        # registering them again would give every weight a second name (Gluon's collect_params
        # on the whole model warns about the list; the trainers take each stage's own).
        self.stages = split_into_stages(self, self.devices)

    def forward(self, x):
        for stage, device in zip(self.stages, self.devices, strict=True):
            x = stage(x.as_in_context(device))
        return x


class PipelineParallelResNet50(ModelParallelResNet50):
    """The batch cut into micro-batches of `split_size` (the last one may be smaller): while
    stage s+1 works on micro-batch i, stage s works on micro-batch i+1 (the engine queues both
    and runs each context's work on its own threads)."""

    def __init__(self, devices, split_size=20, num_classes=1000, depths=DEPTHS):
        super().__init__(devices, num_classes, depths)
        self.split_size = split_size

    def forward(self, x):
        config.check_split_size(self.split_size, x.shape[0])
        acts = [x[i : i + self.split_size] for i in range(0, x.shape[0], self.split_size)]
        n, m = len(self.stages), len(acts)
        # At tick t stage s takes micro-batch t - s; later stages are queued first, so for two
        # stages this is the tutorial's loop exactly.
        for t in range(m + n - 1):
            for s in reversed(range(n)):
                if 0 <= t - s < m:
                    acts[t - s] = self.stages[s](acts[t - s].as_in_context(self.devices[s]))
        return nd.concat(*acts, dim=0)


def make_data(cfg, devices):
    """num_batches batches of random images, made on the first device before any clock starts,
    and one-hot labels on the last device (where the output lands)."""
    mx.random.seed(cfg.seed)
    shape = (cfg.num_batches, cfg.batch_size, 3, cfg.image_size, cfg.image_size)
    inputs = nd.random.normal(shape=shape, ctx=devices[0])
    classes = np.random.default_rng(cfg.seed).integers(0, cfg.num_classes, shape[:2])
    labels = nd.one_hot(nd.array(classes, ctx=devices[-1]), cfg.num_classes)
    mdev.sync()
    return inputs, labels


def stage_layout(model):
    """The record's stages: how many, each one's blocks (`stem..layer2.3 | layer3.0..head`) and
    its trained parameters."""
    n = len(model.stages)
    params = [stage.collect_params().values() for stage in model.stages]
    return {
        "num_stages": n,
        "stage_blocks": [list(b) for b in stage_blocks(n, blocks_in(model))],
        "stage_params": [sum(p.data().size for p in ps if p.grad_req != "null") for ps in params],
    }


def use_running_stats(model, on):
    """MXNet only: BatchNorm's backward under autograd's predict mode gives NaN gradients in
    MXNet 1.9.1, so "BN on its running statistics" is use_global_stats, under train mode."""

    def switch(block):
        if isinstance(block, nn.BatchNorm):
            guard.use_global_stats(block, on)  # Gluon has no setter for the flag

    model.apply(switch)  # every block inside, the stages' shared ones included
    for stage in getattr(model, "stages", [model]):
        stage.hybridize()  # drops the cached graphs built with the old setting


def train(model, cfg, devices, repeats, train_bn=True):
    """The tutorial's loop: MSE on one-hot labels, SGD; each of `repeats` (common.harness.Repeats)
    a timed repeat of num_batches steps at its split size. train_bn=False: BatchNorm uses its
    running statistics, so micro-batches change nothing (tests). Returns `repeats`."""
    use_running_stats(model, not train_bn)
    # a Trainer needs all its parameters on one set of contexts: one per stage
    groups = [s.collect_params() for s in getattr(model, "stages", [model])]
    trainers = [gluon.Trainer(g, "sgd", {"learning_rate": cfg.lr}, kvstore=None) for g in groups]
    inputs, labels = make_data(cfg, devices)
    for split_size, batches in repeats.timed(sync=mdev.sync, read=lambda loss: loss.asscalar()):
        model.split_size = split_size  # None: the whole batch (single, model_parallel)
        for b in batches:
            with autograd.record():
                outputs = model(inputs[b])
                loss = ((outputs - labels[b]) ** 2).mean()
            loss.backward()
            for trainer in trainers:
                trainer.step(1)  # the loss is a mean already
            repeats.add(loss)  # read after the clock stops: asscalar() would wait
    return repeats


def build(strategy, devices, split_size, num_classes, depths=DEPTHS):
    if strategy == "single":
        model = resnet50(num_classes, depths)
        model.initialize(INIT, ctx=devices[0])
        model.hybridize()
        return model
    if strategy == "model_parallel":
        return ModelParallelResNet50(devices, num_classes, depths)
    return PipelineParallelResNet50(devices, split_size, num_classes, depths)


def measure(args, cfg, devices, strategy, repeats):
    """Build `strategy`'s model on its devices, train it through `repeats`, and return the
    record's extra: the stages' layout where there are stages."""
    mx.random.seed(cfg.seed)
    model = build(strategy, devices, repeats.split_sizes[0], cfg.num_classes)
    train(model, cfg, devices, repeats)
    return stage_layout(model) if strategy != "single" else {}


def main(args, plan, cfg, hooks):
    stages.main(args, plan, cfg, hooks, STRATEGIES, measure)
