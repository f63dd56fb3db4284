"""FIXTURE records of lesson 4 (`zero`), not measurements: tests/compare/zero_records.jsonl, built
through common.results.Record so the schema is checked. Regenerate it with (in .venv/base):

    .venv/base/bin/python -m tests.compare.fixture_zero

test_memory.py checks the committed file still equals what this module produces. The bytes are
worked out here by hand from the records' contract (docs: issue of lesson 4), not with
compare/memory.py, so a wrong closed form there cannot agree with them by construction. A few
runs hold what an engine really holds beside the textbook: torch's ZeroRedundancyOptimizer
splits the state by whole parameters (device 0 a larger share), fully_shard pads each parameter
to a multiple of N.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.compare.fixture_records import record, stats

FIXTURE = Path(__file__).resolve().parent / "zero_records.jsonl"
PSI = 1000  # parameters: round, so that the tests' expected cells are worked out by hand
PAD = 8  # bytes fully_shard adds on a device at N > 1 (each parameter padded to N rows)
UNEVEN = 0.6  # device 0's share of ZeRO-1's state in torch at N = 2 (whole parameters)
SOURCES = {
    "torch": "the profiler's gloo events during one step",
    "jax": "the compiled step's optimized HLO",
    "mxnet": "the kvstore's pushes and pulls during one step",
}
PEAK = {
    "torch": ("peak resident set", "the whole process: data, the runtime, activations"),
    "jax": ("memory_analysis()", "the step's arguments, outputs and temporaries, per device"),
    "mxnet": ("peak resident set", "the whole process: data, the runtime, activations"),
}
# (framework, strategy, ZeRO stage, state on): the runs of the fixture
RUNS = (
    ("torch", "ddp", 0, "devices"),
    ("torch", "zero1", 1, "devices"),
    ("torch", "zero2", 2, "devices"),
    ("torch", "zero3", 3, "devices"),
    ("jax", "sharding", 0, "devices"),
    ("jax", "fsdp", 3, "devices"),
    ("jax", "fsdp_explicit", 3, "devices"),
    ("mxnet", "dist", 0, "devices"),
    ("mxnet", "server", 1, "servers"),
)
# Per step, a device's collectives at N = 2, by hand (bytes: full-size, per the contract)
COLLECTIVES = {
    "ddp": [
        {"op": "all_reduce", "count": 4, "bytes": 4 * PSI},
        {"op": "broadcast", "count": 1, "bytes": 40},
    ],
    "zero1": [
        {"op": "all_reduce", "count": 4, "bytes": 4 * PSI},
        {"op": "broadcast", "count": 2, "bytes": 4 * PSI},
    ],
    "zero2": [
        {"op": "all_gather", "count": 3, "bytes": 4 * PSI},
        {"op": "reduce_scatter", "count": 3, "bytes": 4 * PSI},
    ],
    "zero3": [
        {"op": "all_gather", "count": 6, "bytes": 8 * PSI},
        {"op": "reduce_scatter", "count": 3, "bytes": 4 * PSI},
    ],
    "sharding": [{"op": "all_reduce", "count": 62, "bytes": 4 * PSI}],
    "fsdp": [
        {"op": "all_gather", "count": 62, "bytes": 4 * PSI},
        {"op": "all_reduce", "count": 62, "bytes": 4 * PSI},
    ],
    "fsdp_explicit": [
        {"op": "all_gather", "count": 2, "bytes": 8 * PSI},
        {"op": "reduce_scatter", "count": 1, "bytes": 4 * PSI},
    ],
    "dist": [
        {"op": "push", "count": 62, "bytes": 4 * PSI},
        {"op": "pull", "count": 62, "bytes": 4 * PSI},
    ],
    "server": [
        {"op": "push", "count": 62, "bytes": 4 * PSI},
        {"op": "pull", "count": 62, "bytes": 4 * PSI},
    ],
}


def held(framework: str, strategy: str, stage: int, state_on: str, n: int) -> list[dict]:
    """Each device's bytes: 4 per parameter and per gradient, 8 of AdamW's state, each kind
    split over n where the stage shards it."""
    rows = []
    for i in range(n):
        params = 4 * PSI // n if stage == 3 else 4 * PSI
        grads = 4 * PSI // n if stage >= 2 else 4 * PSI
        state = 8 * PSI // n if stage >= 1 else 8 * PSI
        if strategy == "zero1" and n == 2:
            state = round(8 * PSI * (UNEVEN if i == 0 else 1 - UNEVEN))
        if framework == "torch" and stage >= 2 and n > 1:
            grads += PAD
            params += PAD if stage == 3 else 0
            state += 2 * PAD
        if state_on == "servers":
            state = 0
        rows.append({"params": params, "grads": grads, "opt_state": state})
    return rows


def zero(framework, strategy, stage, state_on, n, median, cores=1, minute=0) -> dict:
    peak_source, includes = PEAK[framework]
    extra = {
        "batch_norm": "per-device",
        "optimizer": "adamw",
        "zero_stage": stage,
        "state_on": state_on,
        "parameters": PSI,
        "state_bytes": held(framework, strategy, stage, state_on, n),
        "peak_bytes": {"bytes": [300_000_000] * n, "source": peak_source, "includes": includes},
        "step_collectives": COLLECTIVES[strategy] if n > 1 else [],
        "collectives_source": SOURCES[framework],
        **({"cores_per_device": cores} if cores else {}),
        **({"bucketed": True} if strategy == "fsdp_explicit" else {}),
        "execution": "concurrent" if framework == "jax" else "processes",
    }
    rec = record(
        framework,
        "zero",
        strategy,
        n,
        f"2026-12-01T10:{minute:02d}:00+00:00",
        epochs=3,
        batch_size=64 * n,
        lr=0.001 * n,
        sec_per_epoch=stats(median, 0.0, 3),
        test_acc=0.5,
        test_acc_per_epoch=[0.3, 0.4, 0.5],
        train_loss=[1.5, 1.0, 0.8],
        images_per_sec=60000 / median,
        extrapolated=True,
        steps_timed=10,
        extra=extra,
    )
    return rec.to_dict()


def records() -> list[dict]:
    out, minute = [], 0
    for framework, strategy, stage, state_on in RUNS:
        for n in (1, 2) if stage == 0 else (2,):
            minute += 1
            out.append(
                zero(framework, strategy, stage, state_on, n, 200.0 / n + stage, minute=minute)
            )
    # On the devices sharing the machine's cores: ZeRO-3 on 4 devices, DDP on 1.
    out.append(zero("torch", "zero3", 3, "devices", 4, 60.0, cores=None, minute=minute + 1))
    out.append(zero("torch", "ddp", 0, "devices", 1, 150.0, cores=None, minute=minute + 2))
    return out


def text() -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records())


if __name__ == "__main__":
    FIXTURE.write_text(text())
    print(f"wrote {FIXTURE}")
