"""Synthetic records (test data, not measurements) of the new kinds: runs whose devices had CPU
cores of their own (extra.cores_per_device, execution), and runs of the cluster in one box
(extra.nodes, link, link_bytes, gradient_bytes, engine), built through common.results.Record so
the schema is checked. Written into a test's own folder by `write`; nothing is committed.

Numbers are chosen so the expected cells can be worked out by hand (test_scaling.py): G is
ResNet-18's gradient (44.7 MB), so the step model knows each engine's collectives
(common.collectives.step_collectives). torch ddp steps 0.5 s on one node, 0.9 s on 2 nodes over
1gbit and 0.55 s over the unlimited link; mxnet (its 1-node run is gluon) 0.4 s on one node and
0.42 s on 2 nodes over 1gbit. `allreduce` gives the all-reduce runs over 1gbit on the same box:
1 ms and 100 MB/s per link for each engine; the unlimited link has none, so no model.
"""

from __future__ import annotations

import json
from pathlib import Path

from common import collectives, flops
from common.results import Record
from tests.compare import fixture_records
from tests.compare.fixture_records import stats
from tests.compare.test_collectives import record, rows_of

GRADIENT_BYTES = flops.gradient_bytes("resnet18")
ALPHA, BUSBW = 1e-3, 1e8  # the all-reduce runs' fit over 1gbit: 1 ms, 100 MB/s per link
STEPS_PER_EPOCH = 1000  # the pretend full epoch of the 1-node runs (halved on 2 nodes)
TIMED_STEPS = 30  # 3 epochs of 10 timed steps
BOX = {
    "cpu": "Fixture Box",
    "cpu_count": 8,
    "gpus": [],
    "host_platform": "linux-x86_64",
    "accelerators_visible": 0,
}
ONE_GBIT = {"name": "1gbit", "rate_bps": 1e9, "measured_bps": 8e8, "latency_s": 1e-4}
UNLIMITED = {"name": "unlimited", "rate_bps": None, "measured_bps": 8e9, "latency_s": 5e-5}
NO_LINK = {"name": "none", "rate_bps": None, "measured_bps": None, "latency_s": None}
ENGINE_TEXT = {
    "ddp": "ring all-reduce (gloo, torch DDP)",
    "dist": "parameter server (ps-lite, kvstore dist_sync)",
}


def pinned(framework, workload, strategy, devices, median, execution, cores=1, **kw) -> Record:
    """A run whose devices had `cores` CPU cores each (None: shared), on the Fixture Box."""
    # as common/cores.py says it: one device is "single", whatever the strategy
    extra = {"execution": "single" if devices == 1 else execution, **kw.pop("extra", {})}
    if cores is not None:
        extra |= {"cores_per_device": cores, "cores_used": list(range(devices * cores))}
    return fixture_records.record(
        framework,
        workload,
        strategy,
        devices,
        f"2026-11-22T10:{devices:02d}:{len(strategy):02d}+00:00",
        epochs=3,
        hardware=BOX,
        sec_per_epoch=stats(median, median / 20, 3),
        test_acc=0.8,
        test_acc_per_epoch=[0.7, 0.75, 0.8],
        images_per_sec=60000 / median,
        extra=extra,
        **kw,
    )


def dedicated() -> list[Record]:
    """lenet: torch scratch sequential on 1 core per device (10 -> 9 s), jax scratch concurrent
    (4 -> 2.5 s: 1.60x); resnet18 torch ddp on 1 core per device (300 -> 160 s: 1.88x) and the
    same on shared cores (300 -> 280 s: overheads only)."""
    return [
        pinned("torch", "lenet", "scratch", 1, 10.0, "sequential"),
        pinned("torch", "lenet", "scratch", 2, 9.0, "sequential"),
        pinned("jax", "lenet", "scratch", 1, 4.0, "concurrent"),
        pinned("jax", "lenet", "scratch", 2, 2.5, "concurrent"),
        pinned("torch", "resnet18", "ddp", 1, 300.0, "processes"),
        pinned("torch", "resnet18", "ddp", 2, 160.0, "processes"),
        pinned("torch", "resnet18", "ddp", 1, 300.0, "processes", cores=None),
        pinned("torch", "resnet18", "ddp", 2, 280.0, "processes", cores=None),
    ]


def node_run(framework, strategy, nodes, step, link, minute, tx=None, rx=None) -> Record:
    """A resnet18 cluster run of 64 images per device and one device per node, stepping in
    `step` seconds; the epoch has STEPS_PER_EPOCH / nodes steps."""
    batch = 64 * nodes
    extra = {
        "cores_per_device": 1,
        "cores_used": list(range(nodes)),
        "execution": "single" if nodes == 1 else "processes",
        "nodes": nodes,
        "engine": ENGINE_TEXT[strategy] if nodes > 1 else "one device",
        "gradient_bytes": GRADIENT_BYTES,
        "link": link,
    }
    if tx is not None:
        extra["link_bytes"] = {"iface": "veth0", "tx": tx, "rx": rx, "steps": TIMED_STEPS}
    return fixture_records.record(
        framework,
        "resnet18",
        strategy,
        nodes,
        f"2026-11-22T11:{minute:02d}:00+00:00",
        epochs=3,
        batch_size=batch,
        hardware=BOX,
        sec_per_epoch=stats(step * STEPS_PER_EPOCH / nodes, 0.0, 3),
        test_acc=0.2,
        test_acc_per_epoch=[0.1, 0.15, 0.2],
        images_per_sec=batch / step,
        extrapolated=True,
        steps_timed=10,
        extra=extra,
    )


def cluster() -> list[Record]:
    per_step = 41_500_000 * TIMED_STEPS  # node 0 carried 41.5 MB per step each way, on average
    return [
        node_run("torch", "ddp", 1, 0.5, NO_LINK, 0, tx=3000, rx=3000),
        node_run(
            "torch", "ddp", 2, 0.9, ONE_GBIT, 1, tx=per_step + 30_000_000, rx=per_step - 30_000_000
        ),
        node_run("torch", "ddp", 2, 0.55, UNLIMITED, 2),
        node_run("mxnet", "gluon", 1, 0.4, NO_LINK, 3),
        node_run("mxnet", "dist", 2, 0.42, ONE_GBIT, 4),
    ]


GPU_STEP = 0.1  # the 1-GPU resnet18 record's seconds per step: batch 256 at 2,560 images/s


def gpu_record() -> Record:
    return fixture_records.record(
        "torch",
        "resnet18",
        "ddp",
        1,
        "2026-11-22T12:00:00+00:00",
        epochs=3,
        batch_size=256,
        sec_per_epoch=stats(GPU_STEP * 235, 0.0, 3),
        test_acc=0.9,
        test_acc_per_epoch=[0.8, 0.85, 0.9],
        images_per_sec=256 / GPU_STEP,
        **fixture_records.GPU,
    )


def allreduce(framework: str) -> dict:
    """An all-reduce run of 2 nodes over 1gbit on the box, exactly ALPHA + bytes / BUSBW."""
    rec = record(fw=framework, link="1gbit", rate=1e9)
    rec["rows"] = rows_of(collectives.sizes(4**13), 2, ALPHA, BUSBW)
    return rec | {"hardware": BOX}


def write(path: Path, recs: list) -> Path:
    dicts = [r if isinstance(r, dict) else r.to_dict() for r in recs]
    path.write_text("".join(json.dumps(d, sort_keys=True) + "\n" for d in dicts))
    return path
