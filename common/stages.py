"""ResNet-50 as a sequence of blocks, how to cut it into pipeline stages, and which resnet50
strategies a command asks for: framework-free, shared by torch_impl, jax_impl and mxnet_impl.
"""

import dataclasses
import math
from collections.abc import Iterator

from common import cli, config, flops, profiling, results, timing, training

# ResNet-50 cut into a sequence of blocks: the stem, the 16 bottlenecks, the head.
LAYERS = flops.RESNET50_LAYERS
BLOCKS = ("stem", *(f"{name}.{i}" for name, _, n, _ in LAYERS for i in range(n)), "head")
DEFAULT = ("single", "model_parallel", "pipeline")
PIPELINED = ("pipeline", "gpipe", "1f1b")  # the strategies that cut the batch into micro-batches


def block_flops(image_size=224, num_classes=1000):
    """Forward FLOPs of each block of BLOCKS for one image (common.flops' layers, by block)."""
    per_block = dict.fromkeys(BLOCKS, 0)
    for layer in flops.resnet50_layers(image_size, num_classes):
        name = layer.name.rsplit(".", 1)[0]  # `layer1.0.conv1`: block `layer1.0`
        per_block[{"conv1": "stem", "fc": "head"}.get(layer.name, name)] += layer.flops
    return list(per_block.values())


def stage_blocks(n_stages):
    """The names of the blocks of each stage. Two stages: the tutorial's split exactly (stem +
    layer1 + layer2 | layer3 + layer4 + avgpool + fc). Otherwise contiguous stages balanced by
    FLOPs (at 224x224): the slowest stage sets a pipeline's pace, and FLOPs track time where
    parameter counts do not (layer4 holds 58% of the parameters but 20% of the FLOPs)."""
    if not 1 <= n_stages <= len(BLOCKS):
        raise config.ConfigError(
            f"ResNet-50 has {len(BLOCKS)} blocks to place; use 1 to {len(BLOCKS)} devices, "
            f"got {n_stages}"
        )
    if n_stages == 2:
        cut = BLOCKS.index("layer3.0")
        return [BLOCKS[:cut], BLOCKS[cut:]]
    prefix = [0]
    for f in block_flops():
        prefix.append(prefix[-1] + f)
    n = len(BLOCKS)
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
    return [BLOCKS[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]


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
    through `repeats` (Repeats), returning the record's extra; a record per split size."""
    one_gpu = plan.count == 1 and plan.platform == "gpu"
    chosen = choose_strategies(args, plan.count, strategies, hooks.framework, one_gpu)
    devs = hooks.devices.get_devices(plan)
    for strategy, split_sizes, sweep in runs(args, cfg, chosen):
        used = stage_devices(devs, strategy)
        traces = profiling.resnet50_traces(hooks, args, strategy, split_sizes, sweep)
        repeats = Repeats(cfg, split_sizes, traces)
        extra = measure(args, cfg, used, strategy, repeats)
        shared = len(used) > plan.count  # one GPU: both stages on it
        recorded = dataclasses.replace(plan, count=min(len(used), plan.count))
        names, versions = hooks.devices.device_names(used), hooks.devices.versions()
        for split_size, (timer, losses) in repeats.results().items():
            fields = record_fields(cfg, timer, losses, split_size, extra, sweep, shared)
            rec = cli.make_record(
                hooks.framework,
                args,
                recorded,
                cfg,
                names,
                versions,
                hooks.threads(),
                strategy=strategy,
                **fields,
            )
            save(rec, args.results, cfg, plan)


def round_robin(split_sizes, warmup: int, repeats: int) -> list:
    """The split size of each repeat of a run: every split size's `warmup` repeats first,
    then `repeats` rounds that take each split size once. The speed of a shared machine drifts
    by tens of percent over minutes; taken round-robin, a drift slows every split size alike
    instead of bending the curve."""
    return [s for s in split_sizes for _ in range(warmup)] + list(split_sizes) * repeats


def describe(blocks_per_stage) -> str:
    """`stem..layer2.3 | layer3.0..head`: which blocks each stage holds, in order."""
    return " | ".join(f"{b[0]}..{b[-1]}" if len(b) > 1 else b[0] for b in blocks_per_stage)


def record_fields(cfg, timer: timing.Timer, losses, split_size, extra: dict, sweep: bool, shared):
    """The results.Record fields of one resnet50 run: seconds per repeat of num_batches steps.
    `shared`: the stages shared one device (`stage_devices`)."""
    stats = timer.stats()
    extra = {**extra, "num_batches": cfg.num_batches, "image_size": cfg.image_size}
    if shared:
        extra["stages_share_device"] = True
    return {
        "seconds": stats.to_dict(),
        "warmup_seconds": timer.warmup_seconds,
        "images_per_sec": cfg.num_batches * cfg.batch_size / stats.median,
        "train_loss": list(losses),
        "split_size": split_size,
        "extra": extra | ({"sweep": True, "round_robin": True} if sweep else {}),
        "diverged_at_epoch": diverged_repeat(losses, cfg.num_batches),
    }


def diverged_repeat(losses, num_batches: int) -> int | None:
    """The repeat (of num_batches steps, warm-up included, from 1) whose loss first went
    non-finite, or None. resnet50 has no epochs: its repeats stand in for them in the record."""
    bad = [i for i, loss in enumerate(losses) if not math.isfinite(loss)]
    return bad[0] // num_batches + 1 if bad else None


def save(rec: results.Record, path, cfg, plan) -> None:
    """Append the record and print one line: the time, throughput, loss, stages and devices; a
    run that diverged is recorded as such, then ends with one line (common.cli.save). A profiled
    run (--profile) appends nothing: the profiler slowed its first timed repeat."""
    profiling.append(rec, path, "repeat")
    if rec.diverged_at_epoch is not None:
        raise training.Diverged(rec.diverged_at_epoch, rec.train_loss[-1], "repeat")
    split = f" (split {rec.split_size})" if rec.split_size else ""
    where = plan.describe() if rec.devices > 1 else f"1 x {plan.platform}"
    if rec.extra.get("stages_share_device"):
        where += ", both stages on it"
    blocks = rec.extra.get("stage_blocks")
    stage_text = f", stages {describe(blocks)}" if blocks else ""
    print(
        f"resnet50 {rec.strategy}{split}: {_stats(rec)} per "
        f"{cfg.num_batches} batch(es) of {cfg.batch_size}, {rec.images_per_sec:.1f} images/s, "
        f"loss {rec.train_loss[-1]:.4f}{stage_text} on [{where}]",
        flush=True,
    )


def _stats(rec) -> timing.Stats:
    return timing.Stats(**rec.seconds)


class Repeats:
    """resnet50's measuring, which its `train` iterates: `(split size, batches)` for every split
    size's `cfg.warmup` untimed repeats, then `cfg.repeats` rounds that take the split sizes in
    turn (round_robin); iterating `batches` (num_batches steps) is the repeat,
    timed whole with `sync` (the framework's barrier) at its end. --profile: `traces`, one per
    split size, around its first timed repeat. `add` keeps a step's loss (read afterwards)."""

    def __init__(self, cfg, split_sizes=(None,), traces=None, sync=None):
        self.cfg, self.split_sizes = cfg, tuple(split_sizes)
        self.sync = sync or (lambda: None)
        self.read = float  # a kept loss as a float (MXNet: NDArray.asscalar)
        self.timers = {
            s: timing.Timer(lambda: self.sync(), cfg.warmup, trace=(traces or {}).get(s))
            for s in self.split_sizes
        }
        self.losses = {s: [] for s in self.split_sizes}
        self._current = self.split_sizes[0]

    def __iter__(self) -> Iterator[tuple[int | None, Iterator[int]]]:
        for split_size in round_robin(self.split_sizes, self.cfg.warmup, self.cfg.repeats):
            self._current = split_size
            yield split_size, self._timed(split_size)

    def _timed(self, split_size) -> Iterator[int]:
        with self.timers[split_size].region():
            yield from range(self.cfg.num_batches)

    def add(self, loss) -> None:
        self.losses[self._current].append(loss)

    def results(self) -> dict:
        """{split size: (its Timer, its losses as floats)}, read after every clock stopped."""
        return {
            s: (self.timers[s], [float(self.read(x)) for x in self.losses[s]])
            for s in self.split_sizes
        }
