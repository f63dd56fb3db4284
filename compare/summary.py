"""The summary (the best time of each workload, framework and strategy on each machine group,
side by side) and throughput in FLOPs against the devices' dense peak (the record's `flops`)."""

from __future__ import annotations

import pandas as pd

from compare.checks import WORKLOADS, number
from compare.records import Entry, Machine, rank
from compare.tables import DASH, STAR, Table, decimals, fmt_diverged, shared_diverged_notes

NO_PEAK = "n/a (peak unknown)"
COMPILED_NOTE = (
    "torch runs eagerly unless its strategy says `+compiled` (`--compile`: torch.compile); "
    "JAX always compiles (jit; lenet's per-device step) and MXNet's resnet18 and resnet50 are "
    "hybridized (compiled) Gluon blocks, so their rows are compiled programs; MXNet's lenet runs "
    "NDArray operations eagerly."
)
KEY = ["workload", "framework", "strategy"]


def where(e: Entry) -> str:
    text = f"{e.rec.devices} dev"
    if e.cores_per_device is not None:
        text += f", {e.cores_per_device} core(s)/dev"
    return text + (f", split {e.rec.split_size}" if e.rec.split_size is not None else "")


def cell(e: Entry) -> str:
    shared = " †" if e.shares_device else ""
    if e.diverged:
        return f"{fmt_diverged(e)} ({where(e)}){shared}"
    star = STAR if e.rec.extrapolated else ""
    return f"{e.median:.{decimals(e.median)}f} s{star} ({where(e)}){shared}"


def summary_table(machines: list[Machine]) -> Table:
    """The lowest median of each (workload, framework, strategy) on each machine; a diverged
    record only where no record of its cell has a time."""
    runs = pd.DataFrame(
        [
            (w, e.rec.framework, e.label, i, e, (WORKLOADS.index(w), *order(e)), best_first(e))
            for i, m in enumerate(machines)
            for w in WORKLOADS
            for e in m.workload(w)
        ],
        columns=[*KEY, "machine", "entry", "order", "rank"],
    )
    runs["seen"] = runs.groupby(KEY, sort=False).ngroup()  # the order the notes read them in
    best = runs.sort_values("rank").drop_duplicates([*KEY, "machine"])
    best["cell"] = best["entry"].map(cell)
    wide = best.pivot(index=KEY, columns="machine", values="cell")
    wide = wide.reindex(columns=range(len(machines)))
    rows = best.drop_duplicates(KEY).set_index(KEY)["order"].sort_values(kind="stable")
    wide = wide.loc[rows.index].where(wide.notna(), DASH).reset_index()
    wide.columns = [*KEY, *(m.title for m in machines)]
    notes = [
        "The lowest median on each machine, over device counts (resnet50: and split sizes). "
        "lenet, resnet18: seconds per epoch; resnet50: seconds per timed repeat of the preset's "
        "num_batches batches, whose batch and image sizes differ between presets: compare "
        "resnet50 across machines only at the same preset."
    ]
    if any(m.cluster for m in machines):
        notes.append("The cluster's runs are not among them: see Scaling across nodes.")
    if best["entry"].map(lambda e: e.rec.extrapolated).any():
        notes.append(f"{STAR} extrapolated from fewer steps than an epoch.")
    notes += shared_diverged_notes(list(best.sort_values(["seen", "machine"])["entry"]))
    return Table.of("best time on each machine", wide, notes)


def order(e: Entry) -> tuple:
    return rank(e.rec.workload, e.rec.framework, e.label)


def best_first(e: Entry) -> tuple:
    return (1, 0.0, e.order) if e.diverged else (0, e.median, e.order)


def flops_table(workload: str, entries: list[Entry]) -> Table | None:
    """A row per record shown (resnet50: not the sweep's points); None without records."""
    shown = sorted(
        (e for e in entries if not e.sweep), key=lambda e: (*order(e), e.rec.devices, e.order)
    )
    if not shown:
        return None
    headers = ["framework", "strategy", "devices", "GFLOP/image (train)", "TFLOP/s", "% of peak"]
    notes = [
        "GFLOP/image: the model's convolutions and dense layers at 2 FLOPs per multiply-add, "
        "training = 3 x forward (common/flops.py); TFLOP/s = that x images/s over all devices; "
        "% of peak: of the devices' summed dense peak (TF32 for float32, bf16 with --amp bf16), "
        f"{NO_PEAK} where it is not known (CPUs). A dash: the record predates these figures.",
    ]
    if any(e.rec.extrapolated for e in shown):
        notes.append(f"{STAR} from an extrapolated epoch time.")
    body = [[e.rec.framework, e.label, flops_where(e), *flops_cells(e)] for e in shown]
    return Table(f"{workload} throughput", headers, body, notes)


def flops_where(e: Entry) -> str:
    split = f", split {e.rec.split_size}" if e.rec.split_size is not None else ""
    cores = e.cores_per_device  # beside the same run on shared cores: another row
    return f"{e.rec.devices}{split}" + ("" if cores is None else f", {cores} core(s)/device")


def flops_cells(e: Entry) -> list[str]:
    f = e.rec.flops if isinstance(e.rec.flops, dict) else None
    if f is None or e.diverged:
        return ["diverged" if e.diverged else DASH] * 3
    achieved = tflops(f.get("achieved_tflops"))
    star = STAR if e.rec.extrapolated and achieved != DASH else ""
    per_image = f.get("train_per_image")
    frac, peak = f.get("fraction_of_peak"), f.get("peak_tflops")
    percent = NO_PEAK
    if number(frac) and number(peak):
        percent = (
            f"{100 * frac:.{max(1, decimals(100 * frac))}f}% of {peak:g} ({f.get('peak_kind')})"
        )
    return [tflops(per_image / 1e9) if number(per_image) else DASH, achieved + star, percent]


def tflops(x) -> str:
    return f"{x:.{decimals(x)}f}" if number(x) and x > 0 else DASH
