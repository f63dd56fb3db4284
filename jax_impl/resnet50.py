"""ResNet-50 split over devices: model parallel and pipelined, after the PyTorch tutorial
"Single-machine model parallel best practices", timed correctly (docs/design.md).

Read in order: the toy model (the whole idea in ten lines), the network and how it is cut into
stages, the model-parallel and pipelined models, the training loop, the split-size sweep, main.
JAX: each stage's variables are device_put on its device and each stage has its own jitted
forward (keeping its VJP) and backward; nothing blocks inside the loop, so asynchronous dispatch
lets the devices overlap. Images are NHWC inside (flax's layout), NCHW in the shared weights.
"""

import dataclasses
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from common import cli, config, results, timing
from common.stages import BLOCKS, LAYERS, choose_strategies, stage_blocks
from jax_impl import devices as jdev

STRATEGIES = ("single", "model_parallel", "pipeline")


class ToyModel(nn.Module):
    """The tutorial's first example: one layer per device, the activation moved in between.
    A flax module holds no weights: the placement is the parameters' (see train_toy)."""

    def setup(self):
        self.net1 = nn.Dense(10)
        self.net2 = nn.Dense(5)

    def __call__(self, x, devices):
        x = nn.relu(self.net1(jax.device_put(x, devices[0])))
        return self.net2(jax.device_put(x, devices[-1]))


def train_toy(devices, lr=0.001, seed=0):
    """One SGD step of ToyModel, differentiated eagerly: each op runs where its inputs live and
    the gradient of device_put moves the cotangent back. Returns the new parameters (JAX
    updates nothing in place) and the loss before the step."""
    k_init, k_x, k_y = jax.random.split(jax.random.key(seed), 3)
    model = ToyModel()
    inputs, labels = jax.random.normal(k_x, (20, 10)), jax.random.normal(k_y, (20, 5))
    params = model.init(k_init, inputs, devices[:1])["params"]
    params = {"net1": jax.device_put(params["net1"], devices[0]), "net2": params["net2"]}
    params["net2"] = jax.device_put(params["net2"], devices[-1])

    def loss_fn(params):
        outputs = model.apply({"params": params}, inputs, devices)
        return jnp.mean((outputs - jax.device_put(labels, devices[-1])) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - lr * g, params, grads), float(loss)


# torchvision provides Bottleneck and ResNet to the torch version; here they are written out,
# with torchvision's layer names, padding and strides.
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


def resnet50(num_classes=1000, seed=0):
    """The module and its variables: a flax module holds no weights, so both are returned."""
    model = ResNet50(num_classes)
    # Shapes from eval_shape and values from numpy: model.init would compile (or run op by op)
    # a forward pass of the whole network, 15 s on 2 cores. Kernels ~ lecun normal as in flax.
    shapes = jax.eval_shape(
        partial(model.init, train=False), jax.random.key(0), jnp.zeros((1, 32, 32, 3))
    )
    rng = np.random.default_rng(seed)

    def init(path, leaf):
        name, shape = path[-1].key, leaf.shape
        if name == "kernel":
            return rng.normal(0, np.sqrt(1 / np.prod(shape[:-1])), shape).astype(np.float32)
        return (np.ones if name in ("scale", "var") else np.zeros)(shape, np.float32)

    return model, jax.tree.map(jnp.asarray, jax.tree_util.tree_map_with_path(init, shapes))


def get_weights(variables):
    """The shared weight format (common/weights.py): torch names, OIHW convs, (out, in) fc."""
    flat = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(variables)[0]:
        col, *keys, leaf_name = [k.key for k in path]
        a = np.asarray(leaf)
        leaf_name = {"scale": "weight", "mean": "running_mean", "var": "running_var"}.get(
            leaf_name, leaf_name
        )
        if leaf_name == "kernel":
            a, leaf_name = (a.transpose(3, 2, 0, 1) if a.ndim == 4 else a.T), "weight"
        flat[".".join([*keys, leaf_name])] = a
    return flat


def set_weights(variables, params):
    """New variables holding shared-format arrays (JAX replaces, it does not copy in place)."""
    names = {"weight": "scale", "running_mean": "mean", "running_var": "var"}

    def leaf(path, old):
        col, *keys, leaf_name = [k.key for k in path]
        if leaf_name == "kernel":
            a = params[".".join([*keys, "weight"])]
            a = a.transpose(2, 3, 1, 0) if a.ndim == 4 else a.T
        else:
            a = params[
                ".".join([*keys, {v: k for k, v in names.items()}.get(leaf_name, leaf_name)])
            ]
        if a.shape != old.shape:
            raise ValueError(f"weights do not match: {'.'.join(keys)} {a.shape} vs {old.shape}")
        return jax.device_put(jnp.asarray(a, old.dtype), old.sharding)

    return jax.tree_util.tree_map_with_path(leaf, variables)


def split_into_stages(model, variables, devices):
    """One (module, variables) per device: the stage's part of `variables`, device_put there.
    JAX: the variables come apart from the module."""
    stages = []
    for blocks, device in zip(stage_blocks(len(devices)), devices, strict=True):

        def pick(tree, blocks=blocks):
            part = {k: tree[k] for k in ("conv1", "bn1") if "stem" in blocks and k in tree}
            for name, _, n, _ in LAYERS:
                sub = {str(i): tree[name][str(i)] for i in range(n) if f"{name}.{i}" in blocks}
                if sub:
                    part[name] = sub
            if "head" in blocks and "fc" in tree:
                part["fc"] = tree["fc"]
            return part

        part = {col: pick(tree) for col, tree in variables.items()}
        # a copy (may_alias=False): sgd donates the stage's buffers, the caller keeps its own
        stages.append((model.clone(blocks=blocks), jax.device_put(part, device, may_alias=False)))
    return stages


def apply_stage(module, params, stats, x, train):
    """Stage forward: output and BatchNorm statistics (updated in train mode)."""
    if train:
        y, new = module.apply(
            {"params": params, "batch_stats": stats}, x, train=True, mutable=["batch_stats"]
        )
        return y, new["batch_stats"]
    return module.apply({"params": params, "batch_stats": stats}, x, train=False), stats


@partial(jax.jit, static_argnames=("module", "train", "input_grad"))
def stage_forward(module, params, stats, x, train, input_grad):
    """A stage that is not the last: its output, and its VJP (a pytree of residuals that stay
    on the stage's device) for the backward pass once the cotangent comes back."""
    if input_grad:
        return jax.vjp(
            lambda p, x: apply_stage(module, p, stats, x, train), params, x, has_aux=True
        )
    return jax.vjp(lambda p: apply_stage(module, p, stats, x, train), params, has_aux=True)


@jax.jit
def stage_backward(vjp, cotangent):
    return vjp(cotangent)  # (parameter gradients,) or (parameter gradients, input gradient)


@partial(jax.jit, static_argnames=("module", "train", "input_grad", "scale"))
def last_stage_step(module, params, stats, x, labels, train, input_grad, scale):
    """The last stage: forward, this micro-batch's share of the batch's MSE (sum of squares /
    `scale`, the batch's element count) and backward at once, for nothing comes after it."""

    def loss_fn(p, x):
        y, new_stats = apply_stage(module, p, stats, x, train)
        return jnp.sum((y - labels) ** 2) / scale, new_stats

    (loss, new_stats), grads = jax.value_and_grad(
        loss_fn, argnums=(0, 1) if input_grad else 0, has_aux=True
    )(params, x)
    return (loss, grads, new_stats) if input_grad else (loss, (grads, None), new_stats)


@partial(jax.jit, static_argnames=("module", "train"))
def forward(module, params, stats, x, train):
    return apply_stage(module, params, stats, x, train)[0]


@partial(jax.jit, donate_argnums=0)
def sgd(params, grads, lr):
    return jax.tree.map(lambda p, g: p - lr * g, params, grads)


@jax.jit
def add(a, b):
    return jax.tree.map(jnp.add, a, b)


class ModelParallelResNet50:
    """Stage i's variables on devices[i]; the activation is device_put to the next device. JAX
    modules hold no state: this object holds each stage's variables and replaces them after a
    step, and `grads` keeps the last step's gradients (torch's .grad)."""

    split_size = None  # the whole batch at once

    def __init__(self, devices, variables, num_classes=1000):
        self.devices = list(devices)
        stages = split_into_stages(ResNet50(num_classes), variables, self.devices)
        self.modules = [m for m, _ in stages]
        self.params = [v["params"] for _, v in stages]
        self.stats = [v["batch_stats"] for _, v in stages]
        self.train_bn = True
        self.grads = None

    @property
    def variables(self):
        """The whole network's variables, gathered from the stages (a copy on the host)."""
        merged = {"params": {}, "batch_stats": {}}
        for col, parts in (("params", self.params), ("batch_stats", self.stats)):
            for part in parts:
                for k, v in jax.device_get(part).items():
                    merged[col].setdefault(k, {}).update(v)
        return merged

    def micro_batches(self, x):
        size = len(x) if self.split_size is None else self.split_size
        config.check_split_size(size, len(x))
        return [x[i : i + size] for i in range(0, len(x), size)]

    def __call__(self, x):
        """Forward only (statistics not updated), micro-batched like train_step."""
        outs = []
        for x_i in self.micro_batches(x):
            for module, params, stats, device in zip(
                self.modules, self.params, self.stats, self.devices, strict=True
            ):
                x_i = forward(module, params, stats, jax.device_put(x_i, device), self.train_bn)
            outs.append(x_i)
        return jnp.concatenate(outs)

    def train_step(self, inputs, labels, lr):
        """One SGD step on the batch. At tick t stage s takes micro-batch t - s (later stages
        dispatched first, the tutorial's loop for two stages); the last stage runs forward and
        backward at once, and the earlier stages' backward follows, last stage first. Nothing
        here waits for a result. Returns the loss, not yet computed."""
        xs, ys = self.micro_batches(inputs), self.micro_batches(labels)
        n, m, scale = len(self.modules), len(xs), labels.size
        acts, vjps, grads, losses = list(xs), [[None] * m for _ in range(n)], [None] * n, []
        for t in range(m + n - 1):
            for s in reversed(range(n)):
                i = t - s
                if not 0 <= i < m:
                    continue
                x = jax.device_put(acts[i], self.devices[s])
                if s < n - 1:
                    acts[i], vjps[s][i], self.stats[s] = stage_forward(
                        self.modules[s], self.params[s], self.stats[s], x, self.train_bn, s > 0
                    )
                    continue
                loss, (g, acts[i]), self.stats[s] = last_stage_step(
                    self.modules[s], self.params[s], self.stats[s], x, ys[i], self.train_bn,
                    s > 0, scale,
                )  # fmt: skip
                grads[s] = g if grads[s] is None else add(grads[s], g)
                losses.append(loss)
        for s in reversed(range(n - 1)):
            for i in range(m):
                g, *gx = stage_backward(vjps[s][i], jax.device_put(acts[i], self.devices[s]))
                acts[i] = gx[0] if gx else None
                grads[s] = g if grads[s] is None else add(grads[s], g)
        self.grads = grads
        self.params = [sgd(p, g, lr) for p, g in zip(self.params, grads, strict=True)]
        return sum(jax.device_put(loss, self.devices[-1]) for loss in losses)


class PipelineParallelResNet50(ModelParallelResNet50):
    """The batch cut into micro-batches of `split_size` (the last one may be smaller): while
    stage s+1 works on micro-batch i, stage s works on micro-batch i+1 (asynchronous dispatch
    queues both; each device runs its own)."""

    def __init__(self, devices, variables, split_size=20, num_classes=1000):
        super().__init__(devices, variables, num_classes)
        self.split_size = split_size


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


def measure_stages(model, cfg, repeats=3):
    """For the compare report's pipeline model: seconds each stage takes for one whole batch,
    forward and backward, on its own device, stages run one after another (median of
    `repeats`, after a warm-up that compiles); parameters per stage; peak memory per stage
    (device.memory_stats(), where the backend has it) or else parameter + gradient bytes."""
    inputs, labels = make_data(dataclasses.replace(cfg, num_batches=1), model.devices)
    x, y, n = inputs[0], labels[0], len(model.modules)
    seconds, params, memory, box = [], [], [], []
    for s, (module, p, st, device) in enumerate(
        zip(model.modules, model.params, model.stats, model.devices, strict=True)
    ):
        x = jax.device_put(x, device)
        if s < n - 1:

            def step(module=module, p=p, st=st, x=x, s=s):
                out, vjp, _ = stage_forward(module, p, st, x, model.train_bn, s > 0)
                box[:] = [stage_backward(vjp, jnp.ones_like(out))]

        else:

            def step(module=module, p=p, st=st, x=x, s=s):
                box[:] = [last_stage_step(module, p, st, x, y, model.train_bn, s > 0, y.size)]

        seconds.append(timing.benchmark(step, lambda: jdev.sync(box), repeats).stats().median)
        params.append(sum(leaf.size for leaf in jax.tree.leaves(p)))
        stats = device.memory_stats()
        if stats and "peak_bytes_in_use" in stats:
            memory.append(stats["peak_bytes_in_use"])
        else:
            memory.append(sum(2 * leaf.nbytes for leaf in jax.tree.leaves(p)))
        x = forward(module, p, st, x, model.train_bn)
    source = "memory_stats.peak_bytes_in_use" if stats else "param_grad_bytes"
    return {
        "num_stages": n,
        "stage_blocks": [list(b) for b in stage_blocks(n)],
        "stage_seconds": seconds,
        "stage_params": params,
        "stage_peak_memory_bytes": memory,
        "memory_source": source,
    }


def train(model, cfg, devices, train_bn=True):
    """The tutorial's loop: MSE on one-hot labels, SGD, `num_batches` steps per timed repeat,
    `warmup` repeats apart (they compile). train_bn=False: BatchNorm uses its running
    statistics, so cutting the batch into micro-batches changes nothing (tests). Returns the
    Timer and every loss."""
    model.train_bn = train_bn
    inputs, labels = make_data(cfg, devices)
    losses = []
    timer = timing.Timer(lambda: jdev.sync((model.params, model.stats, losses)), cfg.warmup)
    for _ in range(cfg.warmup + cfg.repeats):
        with timer.region():
            for b in range(cfg.num_batches):
                losses.append(model.train_step(inputs[b], labels[b], cfg.lr))
    return timer, [float(loss) for loss in losses]


def build(strategy, devices, split_size, num_classes, seed=0):
    _, variables = resnet50(num_classes, seed)
    if strategy == "pipeline":
        return PipelineParallelResNet50(devices, variables, split_size, num_classes)
    # single: one stage on one device, the plain single-device program
    return ModelParallelResNet50(devices, variables, num_classes)


def run_strategy(args, plan, cfg, devs, strategy, split_size=None, sweep=False):
    """Build, train, time and record one strategy; returns the record."""
    used = devs[:1] if strategy == "single" else devs
    model = build(strategy, used, split_size, cfg.num_classes, cfg.seed)
    timer, losses = train(model, cfg, used)
    extra = measure_stages(model, cfg) if strategy != "single" else {}
    stats = timer.stats()
    rec = cli.make_record(
        "jax",
        args,
        dataclasses.replace(plan, count=len(used)),
        cfg,
        jdev.device_names(used),
        jdev.versions(),
        strategy=strategy,
        seconds=stats.to_dict(),
        warmup_seconds=timer.warmup_seconds,
        images_per_sec=cfg.num_batches * cfg.batch_size / stats.median,
        train_loss=losses,
        split_size=split_size,
        extra={**extra, "num_batches": cfg.num_batches, "image_size": cfg.image_size}
        | ({"sweep": True} if sweep else {}),
    )
    results.append(rec, args.results)
    split = f" (split {split_size})" if split_size else ""
    print(
        f"resnet50 {strategy}{split}: {stats} per {cfg.num_batches} batch(es) of "
        f"{cfg.batch_size}, {rec.images_per_sec:.1f} images/s, loss {losses[-1]:.4f} "
        f"on [{plan.describe() if len(used) > 1 else f'1 x {plan.platform}'}]",
        flush=True,
    )
    return rec


def sweep_split_sizes(args, plan, cfg, devs):
    """The tutorial's last experiment: the pipelined model at every split size of the preset."""
    for split_size in cfg.split_sizes:
        config.check_split_size(split_size, cfg.batch_size)  # all checked before any result
    return [
        run_strategy(args, plan, cfg, devs, "pipeline", split_size, sweep=True)
        for split_size in cfg.split_sizes
    ]


def plan_strategies(args, plan, cfg):
    """The strategies to run (common.stages); gpipe and 1f1b are torch's engine only."""
    return choose_strategies(args, plan.count, STRATEGIES, "jax")


def main(args, plan):
    cfg = config.for_devices(
        config.get_config(args.workload, args.preset, **cli.overrides(args)), plan.count
    )
    strategies = plan_strategies(args, plan, cfg)
    devs = jdev.get_devices(plan)
    if args.sweep:
        sweep_split_sizes(args, plan, cfg, devs)
        return
    for strategy in strategies:
        run_strategy(
            args, plan, cfg, devs, strategy, cfg.split_size if strategy == "pipeline" else None
        )
