"""The cross-machine summary: per workload, framework and strategy, the best time on each machine
group, side by side, so what other hardware buys is one glance."""

from __future__ import annotations

from compare.records import WORKLOADS, Entry, Machine, sort_key
from compare.tables import (
    DASH,
    DIVERGED_NOTE,
    SHARED,
    STAR,
    Table,
    decimals,
    fmt_diverged,
    shared_note,
)


def best_entries(machines: list[Machine]) -> dict[tuple, dict[int, Entry]]:
    """(workload, framework, strategy) -> machine index -> the fastest record (lowest median;
    over device counts, and for resnet50 over the split sizes of the sweep too). A diverged
    record never wins: it is shown only where no record of its cell has a time."""
    best: dict[tuple, dict[int, Entry]] = {}
    for i, machine in enumerate(machines):
        for e in (e for w in WORKLOADS for e in machine.workload(w)):  # the cluster apart
            cells = best.setdefault((e.rec.workload, e.rec.framework, e.label), {})
            if i not in cells or rank(e) < rank(cells[i]):
                cells[i] = e
    return best


def rank(e: Entry) -> tuple:
    """Timed records before diverged ones, then the lowest median."""
    return (1, 0.0, e.order) if e.diverged else (0, e.median, e.order)


def cell(e: Entry | None) -> str:
    if e is None:
        return DASH
    star = STAR if e.rec.extrapolated else ""
    where = f"{e.rec.devices} dev"
    if e.cores_per_device is not None:
        where += f", {e.cores_per_device} core(s)/dev"
    if e.rec.split_size is not None:
        where += f", split {e.rec.split_size}"
    shared = f" {SHARED}" if e.shares_device else ""
    if e.diverged:
        return f"{fmt_diverged(e)} ({where}){shared}"
    return f"{e.median:.{decimals(e.median)}f} s{star} ({where}){shared}"


def summary_table(machines: list[Machine]) -> Table:
    best = best_entries(machines)

    def order(key):
        workload, framework, label = key
        return (WORKLOADS.index(workload), sort_key(workload)((framework, label)))

    body = [
        [*key, *[cell(best[key].get(i)) for i in range(len(machines))]]
        for key in sorted(best, key=order)
    ]
    headers = ["workload", "framework", "strategy", *[m.title for m in machines]]
    notes = [
        "The lowest median on each machine, over device counts (resnet50: and split sizes). "
        "lenet, resnet18: seconds per epoch; resnet50: seconds per timed repeat of the preset's "
        "num_batches batches, whose batch and image sizes differ between presets: compare "
        "resnet50 across machines only at the same preset."
    ]
    if any(m.cluster for m in machines):
        notes.append("The cluster's runs are not among them: see Scaling across nodes.")
    cells = [e for row in best.values() for e in row.values()]
    if any(e.rec.extrapolated for e in cells):
        notes.append(f"{STAR} extrapolated from fewer steps than an epoch.")
    shared = [e for e in cells if e.shares_device]
    if shared:
        notes.append(f"{SHARED} {shared_note(shared[0].rec.platform)}.")
    if any(e.diverged for e in cells):
        notes.append(DIVERGED_NOTE)
    return Table("best time on each machine", headers, body, notes)
