"""Lesson 4: lesson 2's ResNet-18 trained with AdamW, its state sharded over the devices (ZeRO).

Strategies (`--strategy`), each one function of (net, optimizer, world) that returns (place,
shard, step, correct, total) (common/training.py, "A strategy"); every one runs a process per
device started by torchrun (torch_impl/launch.py), across machines as lesson 2's DDP does.
  ddp    DistributedDataParallel and AdamW: every rank holds the whole state (ZeRO stage 0).
  zero1  DDP and ZeroRedundancyOptimizer: each rank keeps the AdamW state of its own parameter
         tensors, steps them and broadcasts them (stage 1).
  zero2  fully_shard(reshard_after_forward=False): parameters, gradients and AdamW state as
         shards; a stage gathered in the forward stays whole through its backward (stage 2).
  zero3  fully_shard (FSDP): the same, each stage freed after its forward and gathered again
         for its backward (stage 3).
BatchNorm as in lesson 2: each rank normalises its own rows and evaluates with rank 0's running
statistics (DDP broadcasts them before each forward, the sharded strategies before evaluating).
"""

import copy
import os
from dataclasses import replace

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.profiler import ProfilerActivity, profile

from common import cli, config, data, harness, training, utilization
from torch_impl import devices as tdev
from torch_impl import launch
from torch_impl import resnet18 as r18

FRAMEWORK = "torch"
STRATEGIES = ("ddp", "zero1", "zero2", "zero3")
_STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3}
# The collectives by the record's names; the process group's operations as the profiler names
# them (gloo:all_gather, nccl:_reduce_scatter_base, ...) become these.
_OPS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast")
_ELEMENT = {"float": 4, "double": 8, "int": 4, "long int": 8, "c10::BFloat16": 2, "bool": 1}


def make_optimizer(cfg):
    """AdamW with cfg's settings (torch's decoupled weight decay), as a function of the
    parameters: a strategy binds it to what its sharding leaves on this rank."""

    def adamw(params):
        return torch.optim.AdamW(
            params, lr=cfg.lr, betas=(cfg.b1, cfg.b2), eps=cfg.eps, weight_decay=cfg.weight_decay
        )

    return adamw


def state_bytes(net, optimizers):
    """This rank's bytes of parameters, gradients (those of the last step) and AdamW state
    (its moments and step counts), each read from the local tensor: a DTensor's shard."""

    def nbytes(tensors):
        local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
        return sum(t.numel() * t.element_size() for t in local if torch.is_tensor(t))

    params = list(net.parameters())
    states = [t for opt in optimizers for s in opt.state.values() for t in s.values()]
    return {
        "params": nbytes(params),
        "grads": nbytes(p.grad for p in params),
        "opt_state": nbytes(states),
    }


def step_collectives(step, size):
    """The collectives one call of `step` makes on this rank, as the profiler records the
    process group's own operations (gloo's, NCCL's) with their tensors: per operation, how many
    and their full-size bytes (an all-gather's output: `size` times the shard it is given)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    found = {}
    for e in prof.events():
        engine, _, name = e.name.partition(":")
        op = name.strip("_").removesuffix("_base").replace("allgather", "all_gather")
        if engine not in ("gloo", "nccl") or op not in _OPS:
            continue
        shapes = zip(e.input_shapes, e.input_dtypes, strict=True)
        nbytes = sum(int(np.prod(s)) * _ELEMENT[t] for s, t in shapes)
        count, total = found.get(op, (0, 0))
        found[op] = (count + 1, total + nbytes * (size if op == "all_gather" else 1))
    return [{"op": op, "count": c, "bytes": b} for op, (c, b) in sorted(found.items())]


# --- the parallelism: one function per strategy ------------------------------------------------


def ddp(net, optimizer, world):
    """DistributedDataParallel (lesson 2) with AdamW bound to the whole model on every rank:
    each rank holds every parameter, gradient and moment; backward all-reduces the gradients,
    and every rank takes the same step. One rank trains the plain module, as in lesson 2."""
    device, rank, size = world.devices[0], world.rank, world.size
    wrapped = nn.parallel.DistributedDataParallel(net) if size > 1 else net
    optimizer = optimizer(net.parameters())

    def place(arrays):  # every rank holds the whole data set on its device
        return tdev.to_device(data.as_float(arrays, np.int64), device)

    def shard(batches):  # this rank's row of every global batch, in one copy
        return tdev.one_copy([data.shard_batch(idx, size)[rank] for idx in batches], device)

    def step(x, y, rows):
        return r18.train_step(wrapped, optimizer, x[rows], y[rows]) * len(rows)

    def correct(x, y, idx):  # this rank's share of the test batch, with rank 0's statistics
        rows = np.array_split(idx, size)[rank]
        return r18.evaluate(wrapped, x[rows], y[rows])

    def total(losses, hits):  # summed over the ranks: one all-reduce of both
        return world.sum(np.array([float(sum(losses)), float(sum(hits))])).tolist()

    return place, shard, step, correct, total


def zero1(net, optimizer, world):
    """ZeRO-1: DDP as above, but ZeroRedundancyOptimizer builds this rank's AdamW on its own
    partition of the parameter tensors (whole tensors, assigned greedily to the rank holding
    the fewest elements so far), steps it, and broadcasts each updated tensor from its rank:
    the moments are sharded, parameters and gradients are not."""
    device, rank, size = world.devices[0], world.rank, world.size
    wrapped = nn.parallel.DistributedDataParallel(net) if size > 1 else net
    optimizer = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=optimizer)

    def place(arrays):
        return tdev.to_device(data.as_float(arrays, np.int64), device)

    def shard(batches):
        return tdev.one_copy([data.shard_batch(idx, size)[rank] for idx in batches], device)

    def step(x, y, rows):
        return r18.train_step(wrapped, optimizer, x[rows], y[rows]) * len(rows)

    def correct(x, y, idx):
        rows = np.array_split(idx, size)[rank]
        return r18.evaluate(wrapped, x[rows], y[rows])

    def total(losses, hits):
        return world.sum(np.array([float(sum(losses)), float(sum(hits))])).tolist()

    return place, shard, step, correct, total


def zero2(net, optimizer, world):
    """ZeRO-2 with FSDP: each residual stage, then the rest, is a group of parameters kept as
    shards (DTensors) over the world's mesh; the forward all-gathers a group, which stays whole
    until its backward has reduce-scattered its gradients; AdamW steps this rank's shards."""
    device, rank, size = world.devices[0], world.rank, world.size
    mesh = init_device_mesh(device.type, (size,))
    for stage in (net.layer1, net.layer2, net.layer3, net.layer4):
        fully_shard(stage, mesh=mesh, reshard_after_forward=False)
    fully_shard(net, mesh=mesh, reshard_after_forward=False)
    optimizer = optimizer(net.parameters())

    def place(arrays):
        return tdev.to_device(data.as_float(arrays, np.int64), device)

    def shard(batches):
        return tdev.one_copy([data.shard_batch(idx, size)[rank] for idx in batches], device)

    def step(x, y, rows):
        return r18.train_step(net, optimizer, x[rows], y[rows]) * len(rows)

    def correct(x, y, idx):  # rank 0's running statistics, as DDP's forward would give
        for buffer in net.buffers():
            dist.broadcast(buffer, src=0)
        rows = np.array_split(idx, size)[rank]
        return r18.evaluate(net, x[rows], y[rows])

    def total(losses, hits):
        return world.sum(np.array([float(sum(losses)), float(sum(hits))])).tolist()

    return place, shard, step, correct, total


def zero3(net, optimizer, world):
    """ZeRO-3 (FSDP): zero2, but each group is freed after its forward and all-gathered again
    for its backward: only the group at work is whole on a rank."""
    device, rank, size = world.devices[0], world.rank, world.size
    mesh = init_device_mesh(device.type, (size,))
    for stage in (net.layer1, net.layer2, net.layer3, net.layer4):
        fully_shard(stage, mesh=mesh, reshard_after_forward=True)
    fully_shard(net, mesh=mesh, reshard_after_forward=True)
    optimizer = optimizer(net.parameters())

    def place(arrays):
        return tdev.to_device(data.as_float(arrays, np.int64), device)

    def shard(batches):
        return tdev.one_copy([data.shard_batch(idx, size)[rank] for idx in batches], device)

    def step(x, y, rows):
        return r18.train_step(net, optimizer, x[rows], y[rows]) * len(rows)

    def correct(x, y, idx):
        for buffer in net.buffers():
            dist.broadcast(buffer, src=0)
        rows = np.array_split(idx, size)[rank]
        return r18.evaluate(net, x[rows], y[rows])

    def total(losses, hits):
        return world.sum(np.array([float(sum(losses)), float(sum(hits))])).tolist()

    return place, shard, step, correct, total


def train(net, cfg, ds, strategy, run):
    """Lesson 2's loop with AdamW; after the warm-up one more step is profiled (what moves) and
    the state it leaves is measured (what each rank holds), then the weights and AdamW's state
    start again. Returns (state bytes, collectives) of this rank."""
    bound = []  # the AdamW the strategy binds (zero1: ZeroRedundancyOptimizer's local one)
    optimizer = _kept(make_optimizer(cfg), bound)
    place, shard, step, correct, total = strategy(net, optimizer, run.world)
    x_train, y_train, x_test, y_test = place(ds)
    initial = copy.deepcopy(net.state_dict())
    for part in run.warm_up(shard, sync=lambda: tdev.sync(run.world.devices)):
        step(x_train, y_train, part)
    step(x_train, y_train, part)  # DDP's second step rebuilds its buckets: not a usual one
    moved = step_collectives(lambda: step(x_train, y_train, part), run.world.size)
    held = state_bytes(net, bound)
    net.load_state_dict(initial)  # the epochs start from the initial weights, AdamW afresh
    for opt in bound:
        opt.state.clear()
    for parts in run.epochs(shard):  # iterating `parts` is the timed epoch
        losses = [step(x_train, y_train, part) for part in parts]
        hits = [correct(x_test, y_test, idx) for idx in run.test_batches()]
        run.log(*total(losses, hits))
    return held, moved


def main(args, plan, cfg, hooks):
    """Check; start a rank per device with torchrun, or, as a rank, join, train and record."""
    strategy = training.choose_strategy("zero", FRAMEWORK, args.strategy, STRATEGIES)
    nodes = launch.Nodes.of(args)  # several machines: `--gpus` devices on each
    _check(cfg, plan if nodes is None else replace(plan, count=plan.count * nodes.count))
    if not launch.is_worker():  # the launcher: a rank per device
        argv = cli.worker_argv(args, strategy=strategy)
        launch.torchrun(argv, plan.count, f"{strategy} training", nodes)
        return
    world = launch.join(plan, args)
    cfg = config.for_devices(cfg, world.plan.count)  # lesson 2's batch and lr scaling
    ds = data.load_subsets(cfg.train_subset, cfg.test_subset, cfg.seed)
    device = world.devices[0]
    net = r18.init_weights(r18.resnet18(), cfg.init_std, cfg.seed).to(device)
    net = tdev.gpu_layout(net, device)
    run = harness.Run(args, cfg, ds, world, hooks=hooks)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))  # ranks on this machine
    strategies = {"ddp": ddp, "zero1": zero1, "zero2": zero2, "zero3": zero3}
    with run.sampling(utilization.sampler_for(plan.platform, local if world.rank == 0 else 0)):
        held, moved = train(net, cfg, ds, strategies[strategy], run)
    names = [f"rank{r}:{device.type}" for r in range(world.size)]
    run.save(strategy, _extra(run, world, strategy, net, held, moved), names)


def _kept(adamw, bound):
    """`adamw`, keeping each optimizer it builds in `bound`."""

    def build(params, **defaults):  # ZeroRedundancyOptimizer passes its (empty) defaults
        bound.append(adamw(params, **defaults))
        return bound[-1]

    return build


def _check(cfg, plan):
    cfg = config.for_devices(cfg, plan.count)  # every batch splits evenly over the devices
    config.check_epoch_split(data.train_size(cfg.train_subset), cfg.batch_size, plan.count)


def _extra(run, world, strategy, net, held, moved):
    """The record's fields: lesson 2's (usage, world, nodes), and lesson 4's: what each rank
    holds, its peak, and what a step moves (rank 0's: every rank takes part in each)."""
    gpu = world.plan.platform == "gpu"
    usage = tdev.gather_usage(run.usage(), world.devices, gpu, world.size)
    params = sum(p.numel() for p in net.parameters())  # DTensors count their global elements
    source = usage.get("memory_source", "ru_maxrss (getrusage) of each rank's process")
    includes = "the whole process: Python, torch, gloo, the data, the state, the activations"
    if gpu:
        includes = "what torch's allocator handed out: the state, the activations, the buffers"
    return usage | {
        "world_size": world.size,
        "nnodes": int(os.environ.get("GROUP_WORLD_SIZE", 1)),  # torchrun's: the nodes
        "optimizer": "adamw",
        "zero_stage": _STAGE[strategy],
        "state_on": "devices",
        "parameters": params,
        "state_bytes": training.state_table(world, {world.rank: held}),
        "peak_bytes": {"bytes": usage["peak_memory_bytes"], "source": source, "includes": includes},
        "step_collectives": moved,
        "collectives_source": "torch.profiler's events of the process group's own operations "
        "(gloo:*, nccl:*) in one training step after the warm-up, on rank 0; gloo reduces "
        "FSDP's reduce-scatter as an all-reduce of the whole input",
    }
