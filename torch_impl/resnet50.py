"""ResNet-50 split over devices: model parallel and pipelined, after the PyTorch tutorial
"Single-machine model parallel best practices", timed correctly (docs/design.md).

Read in order: the toy model (the whole idea in ten lines), the network and how it is cut into
stages, the model-parallel and pipelined models, the training loop, the split-size sweep, main.
torch only: `gpipe` and `1f1b` run the same stages on torch.distributed.pipelining, one process
per stage started through torchrun (torch_impl/pipelining.py).
"""

import torch
from torch import nn, optim
from torchvision.models.resnet import Bottleneck, ResNet

from common import config, stages
from common.stages import DEPTHS, blocks_in, stage_blocks
from torch_impl import devices as tdev
from torch_impl import launch, pipelining
from torch_impl import weights as tweights

FRAMEWORK = "torch"
STRATEGIES = ("single", "model_parallel", "pipeline", "gpipe", "1f1b")


class ToyModel(nn.Module):
    """The tutorial's first example: one layer per device, the activation moved in between."""

    def __init__(self, devices):
        super().__init__()
        self.devices = [devices[0], devices[-1]]
        self.net1 = nn.Linear(10, 10).to(self.devices[0])
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5).to(self.devices[1])

    def forward(self, x):
        x = self.relu(self.net1(x.to(self.devices[0])))
        return self.net2(x.to(self.devices[1]))


def train_toy(devices, lr=0.001, seed=0):
    """One SGD step of ToyModel; autograd follows the activation back across devices.
    Returns the model (updated in place) and the loss before the step."""
    torch.manual_seed(seed)
    model = ToyModel(devices)
    inputs, labels = torch.randn(20, 10), torch.randn(20, 5)
    optimizer = optim.SGD(model.parameters(), lr=lr)
    optimizer.zero_grad()
    outputs = model(inputs)
    loss = nn.functional.mse_loss(outputs, labels.to(outputs.device))  # labels go to the output
    loss.backward()
    optimizer.step()
    return model, loss.item()


def resnet50(num_classes=1000, depths=DEPTHS):
    """torchvision's ResNet-50 (Bottleneck, [3, 4, 6, 3]), as the tutorial builds it.
    `depths`: bottlenecks per layer (common.stages.blocks_of)."""
    return ResNet(Bottleneck, list(depths), num_classes=num_classes)


def get_weights(model):
    """The shared weight format (common/weights.py): torch's state_dict is already its layout."""
    return tweights.get_weights(model)


def set_weights(model, params):
    """Copy shared-format arrays into `model` in place (each tensor stays on its device)."""
    tweights.set_weights(model, params)


def split_into_stages(model, devices):
    """One nn.Sequential per device, made of `model`'s own layers (shared, not copied), moved
    to its device. On two devices this is the tutorial's split: stage 1 = stem (conv1, bn1,
    relu, maxpool) + layer1 + layer2, stage 2 = layer3 + layer4 + avgpool + fc; on more, the
    blocks are cut into contiguous stages of balanced FLOPs (common.stages.stage_blocks)."""
    parts = {
        "stem": [model.conv1, model.bn1, model.relu, model.maxpool],
        "head": [model.avgpool, nn.Flatten(1), model.fc],
    }
    stages = []
    for names, device in zip(stage_blocks(len(devices), blocks_in(model)), devices, strict=True):
        layers = [m for b in names for m in (parts[b] if b in parts else [model.get_submodule(b)])]
        stages.append(nn.Sequential(*layers).to(device))
    return stages


class ModelParallelResNet50(ResNet):
    """Stage i on devices[i]; the activation moves to the next device between stages."""

    def __init__(self, devices, num_classes=1000, depths=DEPTHS):
        super().__init__(Bottleneck, list(depths), num_classes=num_classes)
        self.devices = list(devices)
        # A plain list, not a ModuleList: the stages share the model's layers, and registering
        # them again would give every weight a second name in state_dict().
        self.stages = split_into_stages(self, self.devices)

    def forward(self, x):
        for stage, device in zip(self.stages, self.devices, strict=True):
            x = stage(x.to(device))
        return x


class PipelineParallelResNet50(ModelParallelResNet50):
    """The batch cut into micro-batches of `split_size` (the last one may be smaller): while
    stage s+1 works on micro-batch i, stage s works on micro-batch i+1 (CUDA launches are
    asynchronous, so both devices run at once; on CPU the ops run one after another)."""

    def __init__(self, devices, split_size=20, num_classes=1000, depths=DEPTHS):
        super().__init__(devices, num_classes, depths)
        self.split_size = split_size

    def forward(self, x):
        config.check_split_size(self.split_size, len(x))
        acts = list(x.split(self.split_size, dim=0))
        n, m = len(self.stages), len(acts)
        # At tick t stage s takes micro-batch t - s; later stages are launched first, so for two
        # stages this is the tutorial's loop exactly.
        for t in range(m + n - 1):
            for s in reversed(range(n)):
                if 0 <= t - s < m:
                    acts[t - s] = self.stages[s](acts[t - s].to(self.devices[s]))
        return torch.cat(acts)


def make_data(cfg, devices, dtype=torch.float32):
    """num_batches batches of random images, made on the first device before any clock starts,
    and one-hot labels on the last device (where the output lands); `dtype`: float64 in tests."""
    gen = torch.Generator(device=devices[0]).manual_seed(cfg.seed)
    shape = (cfg.num_batches, cfg.batch_size, 3, cfg.image_size, cfg.image_size)
    inputs = torch.randn(shape, generator=gen, device=devices[0]).to(dtype)
    classes = torch.randint(
        0, cfg.num_classes, (cfg.num_batches, cfg.batch_size), generator=torch.Generator()
    )
    labels = nn.functional.one_hot(classes, cfg.num_classes).to(dtype).to(devices[-1])
    return inputs, labels


def stage_layout(model):
    """The record's stages: how many, each one's blocks (`stem..layer2.3 | layer3.0..head`) and
    its parameters."""
    n = len(model.stages)
    return {
        "num_stages": n,
        "stage_blocks": [list(b) for b in stage_blocks(n, blocks_in(model))],
        "stage_params": [sum(p.numel() for p in stage.parameters()) for stage in model.stages],
    }


def train(model, cfg, devices, repeats, train_bn=True):
    """The tutorial's loop: MSE on one-hot labels, SGD; each of `repeats` (common.harness.Repeats)
    a timed repeat of num_batches steps at its split size. train_bn=False: BatchNorm uses its
    running statistics, so micro-batches change nothing (tests). Returns `repeats`."""
    model.train(train_bn)
    loss_fn, optimizer = nn.MSELoss(), optim.SGD(model.parameters(), lr=cfg.lr)
    inputs, labels = make_data(cfg, devices, next(model.parameters()).dtype)
    for split_size, batches in repeats.timed(sync=lambda: tdev.sync(devices)):
        model.split_size = split_size  # None: the whole batch (single, model_parallel)
        for b in batches:
            tdev.new_step()
            optimizer.zero_grad()
            loss = loss_fn(model(inputs[b]), labels[b])
            loss.backward()
            optimizer.step()
            repeats.add(loss.detach())  # read after the clock stops: .item() would sync
    return repeats


def build(strategy, devices, split_size, num_classes, depths=DEPTHS):
    if strategy == "single":
        return resnet50(num_classes, depths).to(devices[0])
    if strategy == "model_parallel":
        return ModelParallelResNet50(devices, num_classes, depths)
    return PipelineParallelResNet50(devices, split_size, num_classes, depths)


def measure(args, cfg, devices, strategy, repeats):
    """Build `strategy`'s model on its devices, train it through `repeats`, and return the
    record's extra: stage times, or (one GPU) the peak memory; gpipe and 1f1b on torch's engine."""
    torch.manual_seed(cfg.seed)
    if strategy in pipelining.STRATEGIES:  # torch's own engine, a process per stage
        return pipelining.launch_stages(cfg, devices, strategy, repeats, profile=args.profile)
    model = build(strategy, devices, repeats.split_sizes[0], cfg.num_classes)
    if args.compile:  # torch.compile (--compile, `single` only): compiled in train's warm-up
        tdev.compile_model(model, devices[0])
    cuda = list(dict.fromkeys(d for d in devices if d.type == "cuda"))
    for d in cuda:  # after the build: CUDA refuses this on a device it has not touched yet
        torch.cuda.reset_peak_memory_stats(d)
    train(model, cfg, devices, repeats)
    extra = stage_layout(model) if strategy != "single" else {}
    if strategy == "single" and cuda:
        extra = {"peak_memory_bytes": [torch.cuda.max_memory_allocated(cuda[0])]}
    return extra | (tdev.compile_fields(True, devices[0]) if args.compile else {})


def main(args, plan, cfg, hooks):
    if launch.is_worker():  # one stage's process of gpipe or 1f1b (torch_impl/pipelining.py)
        pipelining.worker(hooks, stage_of, make_data)
        return
    if args.strategy in pipelining.STRATEGIES:  # the engine's own limits, before anything runs
        pipelining.check(args.strategy, plan.count, cfg.split_size, cfg.batch_size)
    stages.main(args, plan, cfg, hooks, STRATEGIES, measure)


def stage_of(cfg, rank, world, device):
    """torch's pipelining engine (gpipe, 1f1b): this rank's stage of the seeded model, on its
    device; every rank builds the same model and keeps its own part."""
    torch.manual_seed(cfg.seed)
    placement = [device if r == rank else torch.device("cpu") for r in range(world)]
    return split_into_stages(resnet50(cfg.num_classes), placement)[rank]
