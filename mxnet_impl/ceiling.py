"""The ceiling benchmark in MXNet (common/ceiling.py): the workload's model, built by its own
module, stepped in a tight loop on one device. `python -m mxnet_impl.ceiling --workload lenet`.
Side by side with torch_impl/ceiling.py and jax_impl/ceiling.py; the training step each
`<workload>_step` returns is the one its training loop runs, without the loop around it.
"""

import os
import sys

from mxnet import autograd, gluon, nd

from common import ceiling, devices, harness, profiling
from mxnet_impl import devices as mdev
from mxnet_impl import lenet, resnet18

FRAMEWORK = "mxnet"


def lenet_step(cfg, x, y, compiled):
    """LeNet from scratch (its parameters, its summed loss) and MXNet's fused SGD update,
    lr / batch as in lenet.train_batch (written there as `p -= lr / batch * grad`).
    `compiled`: for torch only (refused before: common.checks.check_compile)."""
    params = lenet.get_params(lenet.init_params(cfg.init_std, cfg.seed), x.context)

    def step(_):
        with autograd.record():
            loss = lenet.loss_fn(lenet.lenet(x, params), y)
        loss.backward()
        for p in params.values():
            nd.sgd_update(p, p.grad, lr=cfg.lr, rescale_grad=1 / len(y), out=p)
        return loss

    return step, None


def resnet18_step(cfg, x, y, amp, compiled):
    """ResNet-18 as its training builds it, hybridized, with its optimizer in a Trainer (one
    context: no kvstore, as in resnet18.context_list) and resnet18.train_step itself; `amp`:
    bf16 as in training (resnet18.use_bf16). `compiled`: refused before (Gluon compiles by
    hybridize)."""
    if amp:
        resnet18.use_bf16()
    net = resnet18.resnet18()
    resnet18.init_weights(net, cfg.init_std, cfg.seed, [x.context])
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), resnet18.make_optimizer(cfg.lr), kvstore=None)
    return (lambda _: resnet18.train_step(net, trainer, [x], [y], len(y))), None


def build(args, cfg, device):
    """(step, state, sync) of the workload's ceiling on `device`, on the first training batch;
    also what a training run's --ceiling times beside its epochs (common.ceiling.paired)."""
    images, labels = ceiling.first_batch(cfg)
    if args.workload == "lenet":  # MXNet's lenet takes float labels (nd.pick)
        x, y = nd.array(images, ctx=device), nd.array(labels.astype("float32"), ctx=device)
        step, state = lenet_step(cfg, x, y, args.compile)
    else:
        x, y = nd.array(images, ctx=device), nd.array(labels, ctx=device, dtype="int32")
        step, state = resnet18_step(cfg, x, y, args.amp == "bf16", args.compile)
    return step, state, mdev.sync


def main(args, plan, cfg):
    device = mdev.get_devices(plan)[0]
    step, state, sync = build(args, cfg, device)
    warmup, steps, repeats = ceiling.counts(args, cfg)
    hooks = harness.Hooks(FRAMEWORK, mdev)
    trace = profiling.tracer(hooks, args, "ceiling")  # --profile: the first timed repeat
    timer = ceiling.measure(step, state, sync, warmup, steps, repeats, trace)
    fields = ceiling.record_fields(timer, cfg, args.amp, warmup, steps)
    rec = harness.make_record(hooks, args, plan, cfg, mdev.device_names([device]), **fields)
    ceiling.save(rec, args.results, plan)


if __name__ == "__main__":
    # This module's imports loaded MXNet, which fixed its OpenMP threads then: when they were
    # its default half of the CPUs, start again with every CPU allowed (mxnet_impl/__main__.py
    # sets them before MXNet loads instead).
    if devices.set_mxnet_threads():
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    sys.exit(ceiling.run(FRAMEWORK, main))
