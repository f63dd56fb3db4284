"""Throughput in FLOPs: what each run achieved against its devices' dense peak.

The figures come from the record's `flops` (common.flops.record_fields, written when the run
ended): the model's training FLOPs per image, the TFLOP/s achieved (that times images/s over all
devices) and the fraction of the devices' summed dense peak where it is known. Records written
before runs carried them show a dash; CPUs have no peak.
"""

from __future__ import annotations

import math

from compare.records import Entry, sort_key
from compare.tables import DASH, STAR, Table, decimals

NO_PEAK = "n/a (peak unknown)"
COMPILED_NOTE = (
    "torch runs eagerly unless its strategy says `+compiled` (`--compile`: torch.compile); "
    "JAX always compiles (jit; lenet's per-device step) and MXNet's resnet18 and resnet50 are "
    "hybridized (compiled) Gluon blocks, so their rows are compiled programs; MXNet's lenet runs "
    "NDArray operations eagerly."
)


def _number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def fmt_tflops(x) -> str:
    return f"{x:.{decimals(x)}f}" if _number(x) and x > 0 else DASH


def fmt_gflop(flops_per_image) -> str:
    return fmt_tflops(flops_per_image / 1e9) if _number(flops_per_image) else DASH


def fmt_peak(f: dict) -> str:
    """`12.3% of 494.7 (tf32)`, or n/a where the peak is unknown."""
    frac, peak = f.get("fraction_of_peak"), f.get("peak_tflops")
    if not (_number(frac) and _number(peak)):
        return NO_PEAK
    return f"{100 * frac:.{max(1, decimals(100 * frac))}f}% of {peak:g} ({f.get('peak_kind')})"


def row(e: Entry) -> list[str]:
    r = e.rec
    where = f"{r.devices}" + (f", split {r.split_size}" if r.split_size is not None else "")
    if e.cores_per_device is not None:  # beside the same run on shared cores: another row
        where += f", {e.cores_per_device} core(s)/device"
    f = r.flops if isinstance(r.flops, dict) else None
    star = STAR if r.extrapolated else ""
    if f is None or e.diverged:
        why = "diverged" if e.diverged else DASH
        return [r.framework, e.label, where, why, why, why]
    achieved = fmt_tflops(f.get("achieved_tflops"))
    return [
        r.framework,
        e.label,
        where,
        fmt_gflop(f.get("train_per_image")),
        achieved + (star if achieved != DASH else ""),
        fmt_peak(f),
    ]


def flops_table(workload: str, entries: list[Entry]) -> Table | None:
    """One row per record shown (resnet50: not the sweep's points); None without records."""
    shown = [e for e in entries if not e.sweep]
    if not shown:
        return None
    order = sort_key(workload)
    shown.sort(key=lambda e: (*order((e.rec.framework, e.label)), e.rec.devices, e.order))
    headers = ["framework", "strategy", "devices", "GFLOP/image (train)", "TFLOP/s", "% of peak"]
    notes = [
        "GFLOP/image: the model's convolutions and dense layers at 2 FLOPs per multiply-add, "
        "training = 3 x forward (common/flops.py); TFLOP/s = that x images/s over all devices; "
        "% of peak: of the devices' summed dense peak (TF32 for float32, bf16 with --amp bf16), "
        f"{NO_PEAK} where it is not known (CPUs). A dash: the record predates these figures.",
    ]
    if any(e.rec.extrapolated for e in shown):
        notes.append(f"{STAR} from an extrapolated epoch time.")
    return Table(f"{workload} throughput", headers, [row(e) for e in shown], notes)
