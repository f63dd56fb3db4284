"""ResNet-50 split over devices: model parallel and pipelined, after the PyTorch tutorial
"Single-machine model parallel best practices", timed correctly (docs/design.md).

Read in order: the toy model (the whole idea in ten lines), the network and how it is cut into
stages, the model-parallel and pipelined models, the training loop, main. JAX: each stage's
variables live on its device, and its forward (keeping its VJP) and backward are jitted; nothing
blocks inside the loop, so asynchronous dispatch lets the devices overlap. Images are NHWC
inside (flax's layout), NCHW in the shared weights.
"""

from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from common import config, stages
from common.stages import DEPTHS, blocks_of, stage_blocks
from jax_impl import devices as jdev
from jax_impl import weights as jweights
from jax_impl.resnet import ResNet50

FRAMEWORK = "jax"
STRATEGIES = ("single", "model_parallel", "pipeline")


class ToyModel(nn.Module):
    """The tutorial's first example: one layer per device, the activation moved in between.
    A flax module holds no weights: the placement is the parameters' (see train_toy)."""

    @nn.compact
    def __call__(self, x, devices):
        x = nn.relu(nn.Dense(10, name="net1")(jax.device_put(x, devices[0])))
        return nn.Dense(5, name="net2")(jax.device_put(x, devices[-1]))


def train_toy(devices, lr=0.001, seed=0):
    """One SGD step of ToyModel, differentiated eagerly: each op runs where its inputs live and
    the gradient of device_put moves the cotangent back. Returns the new parameters (JAX
    updates nothing in place) and the loss before the step."""
    k_init, k_x, k_y = jax.random.split(jax.random.key(seed), 3)
    model = ToyModel()
    inputs, labels = jax.random.normal(k_x, (20, 10)), jax.random.normal(k_y, (20, 5))
    params = model.init(k_init, inputs, devices[:1])["params"]
    params = jax.device_put(params, {"net1": devices[0], "net2": devices[-1]})

    def loss_fn(params):
        outputs = model.apply({"params": params}, inputs, devices)
        return jnp.mean((outputs - jax.device_put(labels, devices[-1])) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - lr * g, params, grads), float(loss)


def resnet50(num_classes=1000, seed=0, depths=DEPTHS):
    """The module and its variables (a flax module holds none); `depths`: stages.blocks_of."""
    model = ResNet50(num_classes, blocks_of(depths))
    # eval_shape + numpy (lecun-normal kernels): model.init would compile a whole forward
    x = jax.ShapeDtypeStruct((1, 32, 32, 3), jnp.float32)
    shapes = jax.eval_shape(partial(model.init, train=False), jax.random.key(0), x)
    rng = np.random.default_rng(seed)

    def init(path, leaf):
        name, shape = path[-1].key, leaf.shape
        if name == "kernel":
            return rng.normal(0, np.sqrt(1 / np.prod(shape[:-1])), shape).astype(np.float32)
        return (np.ones if name in ("scale", "var") else np.zeros)(shape, np.float32)

    return model, jax.tree.map(jnp.asarray, jax.tree_util.tree_map_with_path(init, shapes))


def get_weights(variables):
    """The shared weight format (common/weights.py): torch names, OIHW convs, (out, in) fc."""
    return jweights.get_weights(variables)


def set_weights(variables, params):
    """New variables holding shared-format arrays (JAX replaces, it does not copy in place)."""
    return jweights.set_weights(variables, params)


def split_into_stages(model, variables, devices):
    """One (module, variables) per device, the stage's part of `variables` device_put there (JAX:
    the variables come apart from the module). Two devices: the tutorial's split, stem (conv1,
    bn1, relu, maxpool) + layer1 + layer2 | layer3 + layer4 + avgpool + fc; more: contiguous
    stages of balanced FLOPs (common.stages.stage_blocks)."""

    def block(path):  # the block of BLOCKS that holds a variable: `layer1.0`, the stem, the head
        top = path[0]
        return f"{top}.{path[1]}" if top.startswith("layer") else "head" if top == "fc" else "stem"

    flat = {col: traverse_util.flatten_dict(tree) for col, tree in variables.items()}
    placed = []
    for blocks, device in zip(stage_blocks(len(devices), model.blocks), devices, strict=True):
        part = {col: {k: v for k, v in f.items() if block(k) in blocks} for col, f in flat.items()}
        part = {col: traverse_util.unflatten_dict(f) for col, f in part.items()}
        # a copy (may_alias=False): sgd donates the stage's buffers, the caller keeps its own
        placed.append((model.clone(blocks=blocks), jax.device_put(part, device, may_alias=False)))
    return placed


@partial(jax.jit, static_argnames=("module", "train"))
def forward(module, params, stats, x, train):
    """A stage's forward: its output and BatchNorm statistics (updated in train mode)."""
    variables = {"params": params, "batch_stats": stats}
    y, new = module.apply(variables, x, train=train, mutable=["batch_stats"])
    return y, new["batch_stats"]


@partial(jax.jit, static_argnames=("module", "train", "input_grad"))
def stage_forward(module, params, stats, x, train, input_grad):
    """A stage's output, its VJP (residuals kept on its device until the cotangent comes back)
    and its statistics. Stage 0 needs no input gradient (`input_grad`): the images take none."""
    if input_grad:
        return jax.vjp(lambda p, x: forward(module, p, stats, x, train), params, x, has_aux=True)
    return jax.vjp(lambda p: forward(module, p, stats, x, train), params, has_aux=True)


@jax.jit
def stage_backward(vjp, cotangent):
    """A stage's backward: its gradients and its input's cotangent (stage 0: None)."""
    grads, *gx = vjp(cotangent)
    return grads, (gx[0] if gx else None)


@partial(jax.jit, static_argnames=("module", "train", "input_grad", "scale"))
def last_stage_step(module, params, stats, x, labels, train, input_grad, scale):
    """The last stage's forward, its share of the batch's MSE (sum of squares / `scale`, the
    batch's element count) and its backward at once: (loss, gradients), the input's cotangent."""
    y, vjp, stats = stage_forward(module, params, stats, x, train, input_grad)
    loss, cotangent = jax.value_and_grad(lambda y: jnp.sum((y - labels) ** 2) / scale)(y)
    grads, gx = stage_backward(vjp, cotangent)
    return (loss, grads), gx, stats


@partial(jax.jit, donate_argnums=0)
def sgd(params, grads, lr):
    return jax.tree.map(lambda p, g: p - lr * g, params, grads)


@jax.jit
def _add(total, new):  # its own program: fused into the backward's, the sums round otherwise
    return jax.tree.map(jnp.add, total, new)


class ModelParallelResNet50:
    """Stage i's variables on devices[i]; the activation is device_put to the next device. JAX
    modules hold no state: this object holds each stage's variables and replaces them after a
    step, and `grads` keeps the last step's gradients (torch's .grad)."""

    split_size = None  # the whole batch at once

    def __init__(self, devices, variables, num_classes=1000, depths=DEPTHS):
        self.devices = list(devices)
        parts = split_into_stages(ResNet50(num_classes, blocks_of(depths)), variables, devices)
        self.modules = [m for m, _ in parts]
        self.params = [v["params"] for _, v in parts]
        self.stats = [v["batch_stats"] for _, v in parts]
        self.train_bn, self.grads = True, None

    def micro_batches(self, x):
        size = len(x) if self.split_size is None else self.split_size
        config.check_split_size(size, len(x))
        return [x[i : i + size] for i in range(0, len(x), size)]

    def __call__(self, x):
        """Forward only (statistics not updated), micro-batched like train_step."""
        acts = self.micro_batches(x)
        for s, i in self.schedule(len(self.modules), len(acts)):
            x = jax.device_put(acts[i], self.devices[s])
            acts[i], _ = forward(self.modules[s], self.params[s], self.stats[s], x, self.train_bn)
        return jnp.concatenate(acts)

    def schedule(self, n, m):
        """(stage, micro-batch) in the order they are dispatched: stage after stage."""
        return [(s, i) for i in range(m) for s in range(n)]

    def train_step(self, inputs, labels, lr):
        """One SGD step: the forward in `schedule`'s order (each stage but the last keeps its VJP;
        the last runs its backward at once), then the earlier stages' backward, last first,
        summed over the micro-batches. Nothing waits for a result: returns the loss, not synced."""
        acts, ys = self.micro_batches(inputs), self.micro_batches(labels)
        n, m, total, vjps = len(self.modules), len(acts), None, {}
        for s, i in self.schedule(n, m):
            x = jax.device_put(acts[i], self.devices[s])
            stage = (self.modules[s], self.params[s], self.stats[s], x)
            if s < n - 1:
                acts[i], vjps[s, i], self.stats[s] = stage_forward(*stage, self.train_bn, s > 0)
            else:
                new, acts[i], self.stats[s] = last_stage_step(
                    *stage, ys[i], self.train_bn, s > 0, labels.size
                )
                total = new if total is None else _add(total, new)  # over the micro-batches
        loss, self.grads = total[0], [None] * (n - 1) + [total[1]]
        for s in reversed(range(n - 1)):
            for i in range(m):
                cotangent = jax.device_put(acts[i], self.devices[s])
                grads, acts[i] = stage_backward(vjps[s, i], cotangent)
                self.grads[s] = grads if i == 0 else _add(self.grads[s], grads)
        self.params = [sgd(p, g, lr) for p, g in zip(self.params, self.grads, strict=True)]
        return loss


class PipelineParallelResNet50(ModelParallelResNet50):
    """The batch cut into micro-batches of `split_size` (the last may be smaller): while stage
    s+1 works on micro-batch i, stage s works on i+1 (dispatch is asynchronous: both queued)."""

    def __init__(self, devices, variables, split_size=20, num_classes=1000, depths=DEPTHS):
        super().__init__(devices, variables, num_classes, depths)
        self.split_size = split_size

    def schedule(self, n, m):
        """At tick t stage s takes micro-batch t - s, later stages dispatched first: for two
        stages, the tutorial's loop."""
        return [(s, t - s) for t in range(m + n - 1) for s in reversed(range(n)) if 0 <= t - s < m]


def make_data(cfg, devices):
    """num_batches batches of random images (NHWC), made on the first device before any clock
    starts, and one-hot labels on the last device (where the output lands)."""
    k_x, k_y = jax.random.split(jax.random.key(cfg.seed))
    shape = (cfg.num_batches, cfg.batch_size, cfg.image_size, cfg.image_size, 3)
    with jax.default_device(devices[0]):
        inputs = jax.random.normal(k_x, shape)
    with jax.default_device(devices[-1]):
        classes = jax.random.randint(k_y, (cfg.num_batches, cfg.batch_size), 0, cfg.num_classes)
        labels = jax.nn.one_hot(classes, cfg.num_classes)
    jdev.sync((inputs, labels))
    return inputs, labels


def stage_layout(model):
    """The record's stages: how many, each one's blocks (`stem..layer2.3 | layer3.0..head`) and
    its parameters."""
    return {
        "num_stages": len(model.modules),
        "stage_blocks": [list(m.blocks) for m in model.modules],
        "stage_params": [sum(leaf.size for leaf in jax.tree.leaves(p)) for p in model.params],
    }


def train(model, cfg, devices, repeats, train_bn=True):
    """The tutorial's loop: MSE on one-hot labels, SGD; each of `repeats` (common.harness.Repeats)
    a timed repeat of num_batches steps at its split size. train_bn=False: BatchNorm uses its
    running statistics, so micro-batches change nothing (tests). Returns `repeats`."""
    model.train_bn = train_bn
    inputs, labels = make_data(cfg, devices)
    # JAX has no device-wide barrier: the clock waits for the newest variables and losses.
    rounds = repeats.timed(sync=lambda: jdev.sync((model.params, model.stats, repeats.losses)))
    for split_size, batches in rounds:
        model.split_size = split_size  # None: the whole batch (single, model_parallel)
        for b in batches:
            repeats.add(model.train_step(inputs[b], labels[b], cfg.lr))  # not synced
    return repeats


def build(strategy, devices, split_size, num_classes, seed=0, depths=DEPTHS):
    _, variables = resnet50(num_classes, seed, depths)
    if strategy == "pipeline":
        return PipelineParallelResNet50(devices, variables, split_size, num_classes, depths)
    # single: one stage on one device, the plain single-device program
    return ModelParallelResNet50(devices, variables, num_classes, depths)


def measure(args, cfg, devices, strategy, repeats):
    """Build `strategy`'s model on its devices, train it through `repeats`, and return the
    record's extra: the stages' layout where there are stages."""
    model = build(strategy, devices, repeats.split_sizes[0], cfg.num_classes, cfg.seed)
    train(model, cfg, devices, repeats)
    return stage_layout(model) if strategy != "single" else {}


def main(args, plan, cfg, hooks):
    stages.main(args, plan, cfg, hooks, STRATEGIES, measure)
