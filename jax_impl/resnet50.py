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

from common import cli, config, profiling, stages, timing
from common.stages import LAYERS, stage_blocks
from jax_impl import devices as jdev
from jax_impl import weights as jweights
from jax_impl.resnet import ResNet50

FRAMEWORK = "jax"
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


def resnet50(num_classes=1000, seed=0):
    """The module and its variables: a flax module holds no weights, so both are returned."""
    model = ResNet50(num_classes)
    # eval_shape + numpy (lecun-normal kernels): model.init compiles a whole forward (15 s, 2 cores)
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
    return jweights.get_weights(variables)


def set_weights(variables, params):
    """New variables holding shared-format arrays (JAX replaces, it does not copy in place)."""
    return jweights.set_weights(variables, params)


def split_into_stages(model, variables, devices):
    """One (module, variables) per device: the stage's part of `variables`, device_put there
    (JAX: the variables come apart from the module). On two devices this is the tutorial's
    split: stage 1 = stem (conv1, bn1, relu, maxpool) + layer1 + layer2, stage 2 = layer3 +
    layer4 + avgpool + fc; on more, the blocks are cut into contiguous stages of balanced FLOPs
    (common.stages.stage_blocks)."""
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


def _apply_stage(module, params, stats, x, train):
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
            lambda p, x: _apply_stage(module, p, stats, x, train), params, x, has_aux=True
        )
    return jax.vjp(lambda p: _apply_stage(module, p, stats, x, train), params, has_aux=True)


@jax.jit
def stage_backward(vjp, cotangent):
    return vjp(cotangent)  # (parameter gradients,) or (parameter gradients, input gradient)


@partial(jax.jit, static_argnames=("module", "train", "input_grad", "scale"))
def last_stage_step(module, params, stats, x, labels, train, input_grad, scale):
    """The last stage: forward, this micro-batch's share of the batch's MSE (sum of squares /
    `scale`, the batch's element count) and backward at once, for nothing comes after it."""

    def loss_fn(p, x):
        y, new_stats = _apply_stage(module, p, stats, x, train)
        return jnp.sum((y - labels) ** 2) / scale, new_stats

    (loss, new_stats), grads = jax.value_and_grad(
        loss_fn, argnums=(0, 1) if input_grad else 0, has_aux=True
    )(params, x)
    return (loss, grads, new_stats) if input_grad else (loss, (grads, None), new_stats)


@partial(jax.jit, static_argnames=("module", "train"))
def forward(module, params, stats, x, train):
    return _apply_stage(module, params, stats, x, train)[0]


@partial(jax.jit, donate_argnums=0)
def sgd(params, grads, lr):
    return jax.tree.map(lambda p, g: p - lr * g, params, grads)


@jax.jit
def _add(a, b):
    return jax.tree.map(jnp.add, a, b)


def _accumulate(total, grads):
    return grads if total is None else _add(total, grads)


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
        """One SGD step on the whole batch: forward stage after stage (each keeps its VJP on its
        device), the last stage's forward and backward at once, then the earlier stages'
        backward, last first. Nothing here waits for a result. Returns the loss, not yet
        computed."""
        n, x, vjps = len(self.modules), inputs, []
        for s in range(n - 1):
            x, vjp = self._forward(s, x)
            vjps.append(vjp)
        loss, last, cotangent = self._last(x, labels, labels.size)
        grads = [None] * (n - 1) + [last]
        for s in reversed(range(n - 1)):
            grads[s], cotangent = self._backward(s, vjps[s], cotangent)
        self._update(grads, lr)
        return loss

    def _forward(self, s, x):
        """Stage s (not the last) on `x`: its output and VJP; BatchNorm statistics updated."""
        x = jax.device_put(x, self.devices[s])
        out, vjp, self.stats[s] = stage_forward(
            self.modules[s], self.params[s], self.stats[s], x, self.train_bn, s > 0
        )
        return out, vjp

    def _last(self, x, labels, scale):
        """The last stage on `x`: loss, parameter gradients and the input's cotangent."""
        s = len(self.modules) - 1
        x = jax.device_put(x, self.devices[s])
        loss, (grads, cotangent), self.stats[s] = last_stage_step(
            self.modules[s], self.params[s], self.stats[s], x, labels, self.train_bn, s > 0, scale
        )
        return loss, grads, cotangent

    def _backward(self, s, vjp, cotangent):
        """Stage s's backward: its parameter gradients and its input's cotangent (stage 0: None)."""
        grads, *gx = stage_backward(vjp, jax.device_put(cotangent, self.devices[s]))
        return grads, (gx[0] if gx else None)

    def _update(self, grads, lr):
        self.grads = grads
        self.params = [sgd(p, g, lr) for p, g in zip(self.params, grads, strict=True)]


class PipelineParallelResNet50(ModelParallelResNet50):
    """The batch cut into micro-batches of `split_size` (the last one may be smaller): while
    stage s+1 works on micro-batch i, stage s works on micro-batch i+1 (asynchronous dispatch
    queues both; each device runs its own)."""

    def __init__(self, devices, variables, split_size=20, num_classes=1000):
        super().__init__(devices, variables, num_classes)
        self.split_size = split_size

    def train_step(self, inputs, labels, lr):
        """The schedule: at tick t stage s takes micro-batch t - s (later stages dispatched
        first, the tutorial's loop for two stages); the last stage runs each micro-batch's
        forward and backward at once; then the earlier stages' backward, last stage first.
        Gradients add up over the micro-batches (each loss is its share of the batch's)."""
        xs, ys = self.micro_batches(inputs), self.micro_batches(labels)
        n, m = len(self.modules), len(xs)
        acts, vjps, grads, losses = list(xs), [[None] * m for _ in range(n)], [None] * n, []
        for t in range(m + n - 1):
            for s in reversed(range(n)):
                i = t - s
                if not 0 <= i < m:
                    continue
                if s < n - 1:
                    acts[i], vjps[s][i] = self._forward(s, acts[i])
                    continue
                loss, g, acts[i] = self._last(acts[i], ys[i], labels.size)
                grads[s] = _accumulate(grads[s], g)
                losses.append(loss)
        for s in reversed(range(n - 1)):
            for i in range(m):
                g, acts[i] = self._backward(s, vjps[s][i], acts[i])
                grads[s] = _accumulate(grads[s], g)
        self._update(grads, lr)
        return sum(jax.device_put(loss, self.devices[-1]) for loss in losses)


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
        stats = device.memory_stats() or {}  # a peak is never 0 bytes: 0 is "not known"
        peak = stats.get("peak_bytes_in_use", 0)
        memory.append(peak or sum(2 * leaf.nbytes for leaf in jax.tree.leaves(p)))
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


def train(model, cfg, devices, train_bn=True, split_sizes=(None,), traces=None):
    """The tutorial's loop: MSE on one-hot labels, SGD, `num_batches` steps per timed repeat,
    `warmup` repeats apart (they compile); several `split_sizes` (the sweep) taken round-robin
    (stages.round_robin). train_bn=False: BatchNorm uses its running statistics, so
    micro-batches change nothing (tests). `traces`: --profile's, per split size. Returns a
    Timer and every loss per split size."""
    model.train_bn = train_bn
    inputs, labels = make_data(cfg, devices)
    losses = {s: [] for s in split_sizes}
    sync = lambda: jdev.sync((model.params, model.stats, losses))  # noqa: E731
    timers = {s: timing.Timer(sync, cfg.warmup, trace=traces and traces[s]) for s in split_sizes}
    for split_size in stages.round_robin(split_sizes, cfg.warmup, cfg.repeats):
        model.split_size = split_size  # None: the whole batch (single, model_parallel)
        with timers[split_size].region():
            for b in range(cfg.num_batches):
                losses[split_size].append(model.train_step(inputs[b], labels[b], cfg.lr))
    return {s: (timers[s], [float(loss) for loss in losses[s]]) for s in split_sizes}


def build(strategy, devices, split_size, num_classes, seed=0):
    _, variables = resnet50(num_classes, seed)
    if strategy == "pipeline":
        return PipelineParallelResNet50(devices, variables, split_size, num_classes)
    # single: one stage on one device, the plain single-device program
    return ModelParallelResNet50(devices, variables, num_classes)


def run_strategy(args, plan, cfg, devs, strategy, split_sizes=(None,), sweep=False):
    """Build, train, time and record one strategy, a record per split size; returns them."""
    used = stages.stage_devices(devs, strategy)
    shared = len(used) > plan.count  # one GPU: both stages on it
    model = build(strategy, used, split_sizes[0], cfg.num_classes, cfg.seed)
    traces = profiling.resnet50_traces(FRAMEWORK, args, strategy, split_sizes, sweep)
    runs = train(model, cfg, used, split_sizes=split_sizes, traces=traces)
    extra = measure_stages(model, cfg) if strategy != "single" else {}
    recs = []
    for split_size, (timer, losses) in runs.items():
        recs.append(cli.make_record(
            FRAMEWORK, args, dataclasses.replace(plan, count=min(len(used), plan.count)), cfg,
            jdev.device_names(used), jdev.versions(), strategy=strategy,
            **stages.record_fields(cfg, timer, losses, split_size, extra, sweep, shared),
        ))  # fmt: skip
        stages.save(recs[-1], args.results, cfg, plan)
    return recs


def main(args, plan, cfg):
    one_gpu = plan.count == 1 and plan.platform == "gpu"
    strategies = stages.choose_strategies(args, plan.count, STRATEGIES, FRAMEWORK, one_gpu)
    devs = jdev.get_devices(plan)
    for strategy, split_sizes, sweep in stages.runs(args, cfg, strategies):
        run_strategy(args, plan, cfg, devs, strategy, split_sizes, sweep)
