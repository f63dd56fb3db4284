"""The records behind tests/fixtures/compare_results.jsonl, built through common.results.Record so
the schema is checked. Regenerate the fixture with (in .venv/base):

    .venv/base/bin/python -m tests.compare.fixture_records

test_report.py checks the committed file still equals what this module produces.

Numbers are chosen so the expected table cells can be worked out by hand (see test_report.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from common import flops
from common.results import Record

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "compare_results.jsonl"
MALFORMED = '{"framework": "torch", "workload": "lenet", "strat\n'  # a half-written line

HARDWARE = {
    "cpu": "Fixture CPU",
    "cpu_count": 2,
    "gpus": [],
    "host_platform": "linux-x86_64",
    "accelerators_visible": 0,
}
VERSIONS = {
    "torch": {"python": "3.11.2", "numpy": "2.4.6", "torch": "2.15.0"},
    "jax": {"python": "3.11.2", "numpy": "2.4.6", "jax": "0.10.2", "flax": "0.12.8"},
    "mxnet": {"python": "3.11.2", "numpy": "1.23.5", "mxnet": "1.9.1"},
}

# resnet50 sweep on the CPU machine: made by the pipelined model with these values, then one
# point disturbed
R50_BATCH = 24
R50_SPLITS = (1, 2, 3, 4, 6, 8, 12, 24)
R50_STAGES = {"torch": [0.5, 0.7], "jax": [0.4, 0.6]}
R50_SCALE = 2.0  # num_batches of the cpu preset
R50_OVERHEAD = {"torch": 0.01, "jax": 0.02}
R50_NOISE = {3: 1.02}  # a point off the model by +2%

# The second machine: one GPU, preset full. Its resnet50 stages share the GPU, and its sweep is
# made by the serial model (nothing overlaps) with these values.
GPU_HARDWARE = {
    "cpu": "Fixture Xeon",
    "cpu_count": 16,
    "gpus": [{"name": "Fixture GPU 80GB", "memory": "81920 MiB", "driver": "1.0"}],
    "host_platform": "linux-x86_64",
    "accelerators_visible": 1,
}
GPU = dict(
    platform="gpu", virtual=False, preset="full", hardware=GPU_HARDWARE, device_names=["cuda:0"]
)
GPU_BATCH = 120
GPU_SPLITS = (1, 3, 5, 8, 10, 12, 20, 40, 60)
GPU_STAGES = [0.03, 0.033]
GPU_SCALE = 3.0
GPU_OVERHEAD = 0.045


def stats(median: float, std: float, n: int) -> dict:
    return {
        "median": median,
        "mean": median,
        "std": std,
        "min": median - std,
        "max": median + std,
        "n": n,
    }


def record(framework, workload, strategy, devices, timestamp, **kw) -> Record:
    base = dict(
        framework=framework,
        workload=workload,
        strategy=strategy,
        devices=devices,
        platform="cpu",
        virtual=True,
        device_names=["cpu"] * devices,
        preset="cpu",
        batch_size=256,
        lr=0.2,
        versions=VERSIONS[framework],
        hardware=HARDWARE,
        git_commit="abc123def456",
        timestamp=timestamp,
    )
    base.update(kw)
    return Record(**base)


def lenet(framework, devices, median, std, acc, images, day=20, **kw) -> Record:
    return record(
        framework,
        "lenet",
        "scratch",
        devices,
        f"2026-11-{day}T10:0{devices}:00+00:00",
        epochs=3,
        sec_per_epoch=stats(median, std, 3),
        test_acc=acc,
        test_acc_per_epoch=[round(acc - 0.1, 3), round(acc - 0.03, 3), acc],
        train_loss=[1.2, 0.6, 0.5],
        images_per_sec=images,
        **kw,
    )


def resnet18(framework, strategy, devices, median, acc, extrapolated, **kw) -> Record:
    kw["extra"] = {"batch_norm": "per-device", **kw.get("extra", {})}  # as a run records it
    if framework == "jax" and strategy in ("shard_map", "pmap"):
        kw["extra"] = {"bucketed": True, **kw["extra"]}  # its gradients in one buffer
    return record(
        framework,
        "resnet18",
        strategy,
        devices,
        f"2026-11-20T11:0{devices}:00+00:00",
        epochs=1,
        batch_size=64 * devices,
        lr=0.05 * devices,
        sec_per_epoch=stats(median, 0.0, 1),
        test_acc=acc,
        test_acc_per_epoch=[acc],
        train_loss=[1.5],
        images_per_sec=60000 / median,
        extrapolated=extrapolated,
        steps_timed=20 if extrapolated else None,
        **kw,
    )


def compiled_resnet18(median, device_name, **kw) -> Record:
    """A torch resnet18 ddp run with --compile on one device, with the `flops` its run records
    (common.flops.record_fields; the peak is looked up by `device_name`)."""
    f = flops.record_fields(
        "resnet18", {"image_size": 28}, 60000 / median, [device_name], "float32"
    )
    extra = {"amp": "off", "compiled": True}
    return resnet18("torch", "ddp", 1, median, 0.6, False, extra=extra, flops=f, **kw)


UTILIZATION = {
    "utilization": [95.4, 93.6],
    "peak_memory_bytes": [700 * 2**20, 710 * 2**20],
    "utilization_source": "cpu_time",
    "amp": "off",
}


def sweep_seconds(framework: str, split: int) -> float:
    """GPipe's time of 2 stages: (m + 1) / m x the slower stage, and an overhead per micro-batch."""
    m = math.ceil(R50_BATCH / split)
    stages, overhead = R50_STAGES[framework], R50_OVERHEAD[framework]
    exact = R50_SCALE * (m + 1) / m * max(stages) + m * overhead
    return round(exact * R50_NOISE.get(split, 1.0), 6)


def gpu_sweep_seconds(split: int) -> float:
    """Both stages on one GPU: their times add, and an overhead per micro-batch."""
    m = math.ceil(GPU_BATCH / split)
    return round(GPU_SCALE * sum(GPU_STAGES) + m * GPU_OVERHEAD, 6)


def resnet50(
    framework,
    strategy,
    seconds,
    minute,
    split=None,
    sweep=False,
    stages=None,
    devices=2,
    day=20,
    batch_size=R50_BATCH,
    extra=None,
    **kw,
) -> Record:
    more = {"num_stages": 2} if strategy != "single" else {}
    if stages:
        more["stage_seconds"] = stages
    if sweep:
        more["sweep"] = True
    more.update(extra or {})
    return record(
        framework,
        "resnet50",
        strategy,
        devices,
        f"2026-11-{day}T12:{minute:02d}:00+00:00",
        batch_size=batch_size,
        lr=0.001,
        seconds=stats(seconds, round(seconds / 50, 6), 3),
        images_per_sec=batch_size * 2 / seconds,
        split_size=split,
        extra=more,
        **kw,
    )


def gpu_records() -> list[Record]:
    """One GPU, preset full: lenet torch 0.5 s and jax 1.2 s; resnet18 torch 3.2 s (GPU 65%
    busy); resnet50 torch with both stages on the one GPU, its sweep made by the serial model."""
    shared = dict(GPU, devices=1, day=21, batch_size=GPU_BATCH, extra={"stages_share_device": True})
    one = dict(GPU, devices=1, day=21, batch_size=GPU_BATCH)
    busy = {"utilization": [65.0], "utilization_source": "nvml", "amp": "off"}
    out = [
        lenet("torch", 1, 0.5, 0.02, 0.835, 120000.0, day=21, **GPU),
        lenet("jax", 1, 1.2, 0.1, 0.833, 50000.0, day=21, **GPU),
        resnet18("torch", "ddp", 1, 3.2, 0.91, False, extra=busy, **GPU),
        # torch compiled: 1.6 s/epoch, 37,500 images/s, at an H100 SXM's peak (TF32 494.7)
        compiled_resnet18(1.6, "NVIDIA H100 80GB HBM3", **GPU),
        resnet50("torch", "single", 0.25, 40, **one),
        resnet50("torch", "model_parallel", 0.19, 41, stages=GPU_STAGES, **shared),
    ]
    out += [
        resnet50(
            "torch",
            "pipeline",
            gpu_sweep_seconds(s),
            42 + i,
            split=s,
            sweep=True,
            stages=GPU_STAGES,
            **shared,
        )
        for i, s in enumerate(GPU_SPLITS)
    ]
    return out


def records() -> list[Record]:
    out = [
        # lenet, preset cpu: torch 10 -> 5 s (2.00x), jax 4 -> 2.5 s (1.60x), mxnet 1 device only
        lenet("torch", 1, 10.0, 0.5, 0.812, 6000.0),
        lenet("torch", 2, 5.0, 0.25, 0.805, 12000.0),
        lenet("jax", 1, 4.0, 0.2, 0.821, 15000.0),
        lenet("jax", 2, 2.5, 0.1, 0.818, 24000.0),
        lenet("mxnet", 1, 12.0, 0.6, 0.79, 5000.0),
        # an older record of the torch 1-device cell: superseded by the one above
        lenet("torch", 1, 99.0, 1.0, 0.5, 600.0, day=19),
        # another preset: not comparable with the cpu-preset table
        lenet("jax", 1, 0.5, 0.01, 0.3, 2000.0, preset="smoke"),
        # resnet18, preset cpu: torch and mxnet extrapolated, jax whole epochs
        resnet18("torch", "ddp", 1, 300.0, 0.61, True, extra={"peak_memory_bytes": 512 * 2**20}),
        resnet18("torch", "ddp", 2, 200.0, 0.62, True, extra=UTILIZATION),
        # torch compiled, 1 device: a row of its own beside the eager ddp row; no peak on a CPU
        compiled_resnet18(250.0, "cpu"),
        resnet18("jax", "sharding", 1, 150.0, 0.64, False),
        resnet18("jax", "sharding", 2, 100.0, 0.65, False),
        # --sync-bn: a row of its own, its speedup over the same 1-device run
        resnet18("jax", "sharding", 2, 120.0, 0.66, False, extra={"batch_norm": "sync"}),
        resnet18("jax", "pmap", 1, 160.0, 0.63, False),
        resnet18("jax", "pmap", 2, 80.0, 0.63, False),
        resnet18("mxnet", "gluon", 1, 400.0, 0.60, True),
        resnet18("mxnet", "gluon", 2, 250.0, 0.60, True),
    ]
    # resnet50, preset cpu, --gpus 2
    t = R50_STAGES["torch"]
    out += [
        resnet50("torch", "single", 3.75, 0),
        resnet50("torch", "model_parallel", 4.02, 1, stages=t),
        resnet50("torch", "pipeline", 2.51, 2, split=6, stages=t),
        resnet50("torch", "gpipe", 2.6, 3, split=6),
        resnet50("torch", "1f1b", 2.5, 4, split=6),
    ]
    out += [
        resnet50("torch", "pipeline", sweep_seconds("torch", s), 10 + i, split=s, sweep=True)
        for i, s in enumerate(R50_SPLITS)
    ]
    j = R50_STAGES["jax"]
    out += [
        resnet50("jax", "single", 3.0, 20),
        resnet50("jax", "model_parallel", 3.3, 21, stages=j),
    ]
    out += [
        resnet50("jax", "pipeline", sweep_seconds("jax", s), 22 + i, split=s, sweep=True)
        for i, s in enumerate((1, 4, 24))
    ]
    out += [resnet50("mxnet", "single", 5.0, 30), resnet50("mxnet", "model_parallel", 5.5, 31)]
    # a resnet50 record timed per epoch instead of per repeat: unusable for the resnet50 table
    bad = resnet50("mxnet", "pipeline", 1.0, 32, split=6)
    bad.sec_per_epoch, bad.seconds = bad.seconds, None
    out.append(bad)
    return out + gpu_records()


def lines() -> str:
    text = [json.dumps(r.to_dict(), sort_keys=True, allow_nan=False) + "\n" for r in records()]
    text.insert(3, MALFORMED)  # line 4 of the file
    return "".join(text)


if __name__ == "__main__":
    FIXTURE.write_text(lines())
    print(f"wrote {FIXTURE}")
