"""ResNet-50 as a sequence of blocks, how to cut it into pipeline stages, which resnet50
strategies a command asks for and on which devices their stages go, and resnet50's `main`,
which runs them: framework-free, shared by torch_impl, jax_impl and mxnet_impl. Their
measuring and records are common.harness's (Repeats).
"""

from common import config, flops, harness, profiling

LAYERS = flops.RESNET50_LAYERS
DEPTHS = tuple(n for _, _, n, _ in LAYERS)  # bottlenecks per layer: torchvision's [3, 4, 6, 3]


def blocks_of(depths=DEPTHS):
    """A ResNet-50 cut into a sequence of blocks: the stem, the bottlenecks, the head. `depths`
    keeps the first few bottlenecks of each layer (at least one: it changes the shape): a
    shallower network with every kind of block and the same stages, for tests of what happens
    between the stages, where the depth only costs time."""
    if len(depths) != len(LAYERS) or not all(
        1 <= d <= n for d, n in zip(depths, DEPTHS, strict=True)
    ):
        raise ValueError(f"depths must be {len(LAYERS)} numbers from 1 to {DEPTHS}, got {depths}")
    names = [name for name, *_ in LAYERS]
    return (
        "stem",
        *(f"{name}.{i}" for name, d in zip(names, depths, strict=True) for i in range(d)),
        "head",
    )


BLOCKS = blocks_of()  # the stem, the 16 bottlenecks, the head


def blocks_in(model):
    """The blocks of a torch or Gluon ResNet-50 (`model.layer1`..`layer4` are sequences)."""
    return blocks_of(tuple(len(getattr(model, name)) for name, *_ in LAYERS))


DEFAULT = ("single", "model_parallel", "pipeline")
PIPELINED = ("pipeline", "gpipe", "1f1b")  # the strategies that cut the batch into micro-batches


def block_flops(image_size=224, num_classes=1000):
    """Forward FLOPs of each block of BLOCKS for one image (common.flops' layers, by block)."""
    per_block = dict.fromkeys(BLOCKS, 0)
    for layer in flops.resnet50_layers(image_size, num_classes):
        name = layer.name.rsplit(".", 1)[0]  # `layer1.0.conv1`: block `layer1.0`
        per_block[{"conv1": "stem", "fc": "head"}.get(layer.name, name)] += layer.flops
    return list(per_block.values())


def stage_blocks(n_stages, blocks=BLOCKS):
    """The names of the blocks (of `blocks`, in order) of each stage. Two stages: the tutorial's
    split exactly (stem + layer1 + layer2 | layer3 + layer4 + avgpool + fc). Otherwise
    contiguous stages balanced by FLOPs (at 224x224): the slowest stage sets a pipeline's pace,
    and FLOPs track time where parameter counts do not (layer4 holds 58% of the parameters but
    20% of the FLOPs)."""
    if not 1 <= n_stages <= len(blocks):
        raise config.ConfigError(
            f"ResNet-50 has {len(blocks)} blocks to place; use 1 to {len(blocks)} devices, "
            f"got {n_stages}"
        )
    if n_stages == 2:
        cut = blocks.index("layer3.0")
        return [blocks[:cut], blocks[cut:]]
    per_block = dict(zip(BLOCKS, block_flops(), strict=True))
    prefix = [0]
    for b in blocks:
        prefix.append(prefix[-1] + per_block[b])
    n = len(blocks)
    # best[k, j]: (largest stage FLOPs, cut points) for the first j blocks in k stages
    best = {(0, 0): (0, ())}
    for k in range(1, n_stages + 1):
        for j in range(k, n - (n_stages - k) + 1):
            best[k, j] = min(
                (max(best[k - 1, i][0], prefix[j] - prefix[i]), (*best[k - 1, i][1], j))
                for i in range(k - 1, j)
                if (k - 1, i) in best
            )
    cuts = (0, *best[n_stages, n][1])
    return [blocks[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]


def choose_strategies(args, n_devices, available, framework, one_gpu=False):
    """Which strategies to run, every check made before anything runs or is written. On one
    GPU (`one_gpu`) the split strategies run with both stages on it (see `stage_devices`)."""
    if args.amp != "off":
        raise config.ConfigError("resnet50 runs in float32 only (--amp off)")
    stage_blocks(n_devices)
    if args.sweep:
        if args.strategy not in (None, "pipeline"):
            raise config.ConfigError("--sweep runs the pipeline strategy; drop --strategy")
        strategies = ["pipeline"]
    elif args.strategy is None:
        strategies = ["single"] if n_devices == 1 else list(DEFAULT)
    elif args.strategy not in available:
        torch_only = "" if framework == "torch" else " (gpipe and 1f1b are torch only)"
        raise config.ConfigError(
            f"unknown strategy {args.strategy!r} for {framework} resnet50; choose one of "
            f"{', '.join(available)}{torch_only}"
        )
    else:
        strategies = [args.strategy]
    for s in strategies:
        if s != "single" and n_devices < 2 and not (one_gpu and s in DEFAULT):
            raise config.ConfigError(f"strategy {s!r} needs at least 2 devices (GPUS>=2)")
    return strategies


def stage_devices(devs: list, strategy: str) -> list:
    """The device of each stage: one for `single`; else one per device, or, with a single
    device, two stages sharing it (one GPU: what such a run measures is the per-micro-batch
    overhead, not overlap, and its record says so)."""
    if strategy == "single":
        return devs[:1]
    return devs if len(devs) > 1 else devs * 2


def runs(args, cfg, strategies) -> list[tuple[str, tuple, bool]]:
    """(strategy, split sizes, sweep) of each run the command asks for: with --sweep one run of
    the pipeline at every split size of the preset (the tutorial's last experiment), else each
    strategy once, the pipelined ones at cfg.split_size, the others at None (the whole batch).
    All are checked before anything runs."""
    if not args.sweep:
        return [(s, (cfg.split_size if s in PIPELINED else None,), False) for s in strategies]
    for split_size in cfg.split_sizes:
        config.check_split_size(split_size, cfg.batch_size)
    return [("pipeline", tuple(cfg.split_sizes), True)]


def main(args, plan, cfg, hooks, strategies, measure) -> None:
    """resnet50's `main` in every framework: the runs the command asks for (choose_strategies,
    `runs`), all checked first, then each measured by the framework's `measure(args, cfg,
    devices, strategy, repeats)`, which builds the strategy's model on its devices and trains it
    through `repeats` (common.harness.Repeats), returning the record's extra; a record per split
    size."""
    one_gpu = plan.count == 1 and plan.platform == "gpu"
    chosen = choose_strategies(args, plan.count, strategies, hooks.framework, one_gpu)
    devs = hooks.devices.get_devices(plan)
    for strategy, split_sizes, sweep in runs(args, cfg, chosen):
        used = stage_devices(devs, strategy)
        traces = profiling.resnet50_traces(hooks, args, strategy, split_sizes, sweep)
        repeats = harness.Repeats(cfg, split_sizes, traces=traces, sweep=sweep)
        extra = measure(args, cfg, used, strategy, repeats)
        repeats.save(args, plan, hooks, strategy, extra, used)
