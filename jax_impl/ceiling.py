"""The ceiling benchmark in JAX (common/ceiling.py): the workload's model, built by its own
module, stepped in a tight loop on one device. `python -m jax_impl.ceiling --workload lenet`.
Side by side with torch_impl/ceiling.py and mxnet_impl/ceiling.py; the training step each
`<workload>_step` returns is the one its training loop runs, without the loop around it.
"""

import sys

import jax
import jax.numpy as jnp

from common import ceiling, harness, profiling
from jax_impl import devices as jdev
from jax_impl import lenet, resnet18

FRAMEWORK = "jax"


def lenet_step(cfg, x, y, compiled):
    """LeNet from scratch (its parameters, its summed loss) and the SGD step, lr / batch as in
    lenet.train_batch, in one jitted program; JAX passes the parameters in and out (donated).
    `compiled`: JAX always compiles (refused before: common.checks.check_compile)."""
    params = lenet.get_params(lenet.init_params(cfg.init_std, cfg.seed), x.device)

    def sgd_step(params, x, y):
        grads = jax.grad(lambda p: lenet.loss_fn(lenet.lenet(x, p), y))(params)
        return jax.tree.map(lambda p, g: p - cfg.lr / len(y) * g, params, grads)

    step = jax.jit(sgd_step, donate_argnums=0)
    return (lambda state: step(state, x, y)), params


def resnet18_step(cfg, x, y, amp, compiled):
    """ResNet-18 as its training builds it (no sharding: one device), and resnet18.train_step
    itself, jitted with the state (params, batch_stats, opt_state) donated. `compiled`: JAX
    always compiles (refused before: common.checks.check_compile)."""
    net = resnet18.resnet18(dtype=jnp.bfloat16 if amp else jnp.float32)  # JAX's bf16: a dtype
    optimizer = resnet18.make_optimizer(cfg.lr)
    variables = resnet18.init_weights(net, cfg.init_std, cfg.seed)
    state = jax.device_put(dict(variables, opt_state=optimizer.init(variables["params"])), x.device)

    def train_step(state, x, y):
        return resnet18.train_step(net, optimizer, state, x, y)[0]

    step = jax.jit(train_step, donate_argnums=0)
    return (lambda state: step(state, x, y)), state


def build(args, cfg, device):
    """(step, state, sync) of the workload's ceiling on `device`, on the first training batch;
    also what a training run's --ceiling times beside its epochs (common.ceiling.paired)."""
    images, labels = ceiling.first_batch(cfg)
    if args.workload == "lenet":
        x, y = jax.device_put((images, labels.astype("int32")), device)
        step, state = lenet_step(cfg, x, y, args.compile)
    else:  # flax is NHWC: the images are transposed once, as resnet18.train places them
        x, y = jax.device_put((images.transpose(0, 2, 3, 1), labels.astype("int32")), device)
        step, state = resnet18_step(cfg, x, y, args.amp == "bf16", args.compile)
    return step, state, jdev.sync


def main(args, plan, cfg):
    # One device: no host device count to set before jax's import (jax_impl/__main__.py);
    # PLATFORM=cpu on a GPU machine takes the CPU device (the GPU backend starts, unused).
    device = jdev.get_devices(plan)[0]
    step, state, sync = build(args, cfg, device)
    warmup, steps, repeats = ceiling.counts(args, cfg)
    hooks = harness.Hooks(FRAMEWORK, jdev)
    trace = profiling.tracer(hooks, args, "ceiling")  # --profile: the first timed repeat
    timer = ceiling.measure(step, state, sync, warmup, steps, repeats, trace)
    fields = ceiling.record_fields(timer, cfg, args.amp, warmup, steps)
    rec = harness.make_record(hooks, args, plan, cfg, jdev.device_names([device]), **fields)
    ceiling.save(rec, args.results, plan)


if __name__ == "__main__":
    sys.exit(ceiling.run(FRAMEWORK, main))
