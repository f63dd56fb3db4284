"""The ceiling benchmark in PyTorch (common/ceiling.py): the workload's model, built by its own
module, stepped in a tight loop on one device. `python -m torch_impl.ceiling --workload lenet`.
Side by side with jax_impl/ceiling.py and mxnet_impl/ceiling.py; the training step each
`<workload>_step` returns is the one its training loop runs, without the loop around it.
"""

import sys

import torch

from common import ceiling, harness, profiling
from torch_impl import devices as tdev
from torch_impl import lenet, resnet18

FRAMEWORK = "torch"


def lenet_step(cfg, x, y, compiled):
    """LeNet from scratch (its parameters, its summed loss) and a fused SGD step: lr / batch,
    since the loss is summed over the batch as in lenet.train_batch. `compiled`: its forward
    torch.compiled as lenet.train compiles it (in the warm-up steps, CUDA graphs included)."""
    params = lenet.get_params(lenet.init_params(cfg.init_std, cfg.seed), x.device)
    optimizer = torch.optim.SGD(params.values(), lr=cfg.lr / len(y))
    model = tdev.compile_function(lenet.lenet, x.device)[0] if compiled else lenet.lenet

    def step(_):
        tdev.new_step()  # as lenet.train_batch
        optimizer.zero_grad(set_to_none=True)
        loss = lenet.loss_fn(model(x, params), y)
        loss.backward()
        optimizer.step()
        return loss

    return step, None


def resnet18_step(cfg, x, y, amp, compiled):
    """ResNet-18 as its training builds it (no DDP wrapper: one device, nothing to reduce), and
    resnet18.train_step itself."""
    net = resnet18.resnet18(amp=amp)  # torch's bf16: autocast around the model's forward
    net = resnet18.init_weights(net, cfg.init_std, cfg.seed).to(x.device)
    net = tdev.gpu_layout(net, x.device)  # as resnet18._run
    if compiled:  # compiled in the warm-up steps; the full preset's 5 also capture CUDA graphs
        tdev.compile_model(net, x.device)
    optimizer = resnet18.make_optimizer(net, cfg.lr)
    return (lambda _: resnet18.train_step(net, optimizer, x, y)), None


def build(args, cfg, device):
    """(step, state, sync) of the workload's ceiling on `device`, on the first training batch;
    also what a training run's --ceiling times beside its epochs (common.ceiling.paired)."""
    images, labels = ceiling.first_batch(cfg)
    x, y = torch.from_numpy(images).to(device), torch.from_numpy(labels).to(device)
    if args.workload == "lenet":
        step, state = lenet_step(cfg, x, y, args.compile)
    else:
        step, state = resnet18_step(cfg, x, y, args.amp == "bf16", args.compile)
    return step, state, lambda _: tdev.sync([device])


def main(args, plan, cfg):
    device = tdev.get_devices(plan)[0]
    step, state, sync = build(args, cfg, device)
    warmup, steps, repeats = ceiling.counts(args, cfg)
    hooks = harness.Hooks(FRAMEWORK, tdev)
    trace = profiling.tracer(hooks, args, "ceiling")  # --profile: the first timed repeat
    timer = ceiling.measure(step, state, sync, warmup, steps, repeats, trace)
    fields = ceiling.record_fields(timer, cfg, args.amp, warmup, steps)
    fields["extra"] |= tdev.compile_fields(args.compile, device)
    rec = harness.make_record(hooks, args, plan, cfg, tdev.device_names([device]), **fields)
    ceiling.save(rec, args.results, plan)


if __name__ == "__main__":
    sys.exit(ceiling.run(FRAMEWORK, main))
