"""Training loops against their framework's ceiling (common/ceiling.py): for lenet and resnet18,
each 1-device training record next to its ceiling, and the ratio of their seconds per epoch.
Its ceiling is the one measured in its own run (--ceiling) where it has one, else the ceiling
record of the same framework, precision and compiled tier in its machine group."""

from __future__ import annotations

import dataclasses

from compare.checks import CEILING, positive
from compare.records import Entry, rank
from compare.tables import DASH, STAR, Table, decimals, env_cell, time_cell

EXPLANATION = (
    "The ceiling (`python -m <framework>_impl.ceiling`, `make ceiling`) is how fast the framework "
    "itself steps the same model on this machine: the workload module's own model and training "
    "step in a tight loop on one device, one fixed batch already on the device, the framework's "
    "barrier only at the end of each timed repeat; no batch indexing, loss bookkeeping, "
    "evaluation or data-parallel wrapper. Its seconds per step times an epoch's steps is its "
    "sec/epoch (extrapolated). x ceiling = training sec/epoch (1 device) / ceiling sec/epoch: "
    "1.00x is a loop as fast as its framework can step; the target on GPUs is at most 1.10x. "
    "A run with `--ceiling` (as `make compare` runs every 1-device lenet and resnet18 run) times "
    "one repeat of the ceiling after each of its epochs, in the same process: its x ceiling is "
    "the median of the epochs' ratios to the repeats beside them, so the drift of a shared "
    "machine moves both sides of each ratio alike."
)
SAME_RUN = "same_run"  # in a ceiling Entry made from a training record's extra.ceiling


def in_run(e: Entry | None) -> Entry | None:
    """The ceiling a 1-device training record measured in its own run (extra.ceiling), as a
    ceiling Entry of the same framework and tier; None without one."""
    c = e.extra.get("ceiling") if e is not None and e.rec.devices == 1 else None
    stats = c.get("sec_per_epoch") if isinstance(c, dict) else None
    if not isinstance(stats, dict) or "median" not in stats:
        return None
    rec = dataclasses.replace(
        e.rec,
        strategy=CEILING,
        sec_per_epoch=c["sec_per_epoch"],
        extrapolated=True,  # always: its steps of one batch, projected to an epoch
        steps_timed=c.get("steps_timed"),
        diverged_at_epoch=None,
        extra={**e.extra, **c, SAME_RUN: True},  # amp and compiled kept: the training's tier
    )
    return Entry(rec, e.source, e.order)


def of(training: Entry | None, ceilings: list[Entry]) -> Entry | None:
    """A 1-device training record's ceiling: its own, else a ceiling record of its framework
    and tier, else None."""
    if training is None or training.rec.devices != 1:
        return None
    same = (c for c in ceilings if (c.rec.framework, c.tier) == key(training))
    return in_run(training) or next(same, None)


def key(e: Entry) -> tuple[str, str]:
    """What a ceiling shares with its training records: the framework, and the tier."""
    return e.rec.framework, e.tier


def ratio(training: Entry | None, ceiling: Entry) -> float | None:
    """x ceiling: measured in the run (the median of its epochs' ratios to the repeats beside
    them), else training sec/epoch over the ceiling record's; None without a time."""
    if training is None or training.diverged:
        return None
    if ceiling.extra.get(SAME_RUN):
        x = ceiling.extra.get("x_ceiling")
        return float(x) if positive(x) else None
    return training.median / ceiling.median


def pairs(entries: list[Entry], ceilings: list[Entry]) -> list[tuple[Entry | None, Entry]]:
    """(1-device training record or None, its ceiling), in the tables' order: a record with a
    ceiling of its own run is paired with that one; a ceiling record with no other record of its
    framework and tier gets a row of its own."""
    ones = [e for e in entries if e.rec.devices == 1]
    found = [(e, c) for e in ones if (c := in_run(e)) is not None]
    paired = {e.order for e, _ in found}
    for c in ceilings:
        same = [e for e in ones if key(e) == key(c)]
        found += [(e, c) for e in same if e.order not in paired] or ([] if same else [(None, c)])
    return sorted(
        found, key=lambda p: rank(p[1].rec.workload, p[1].rec.framework, (p[0] or p[1]).label)
    )


def of_workload(workload: str, entries: list[Entry], ceilings: list[Entry]) -> list[tuple]:
    mine = [c for c in ceilings if c.rec.workload == workload]
    return pairs([e for e in entries if e.rec.workload == workload], mine)


def sec_per_epoch(entries: list[Entry], ceilings: list[Entry], workload: str) -> dict:
    """(framework, label) of each 1-device training row -> its ceiling's sec/epoch, for the
    plots; empty without ceilings."""
    found = of_workload(workload, entries, ceilings)
    return {(t.rec.framework, t.label): c.median for t, c in found if t is not None}


def ceiling_table(workload: str, entries: list[Entry], ceilings: list[Entry], envs) -> Table | None:
    """The table for one workload of one machine group, or None without a ceiling."""
    found = of_workload(workload, entries, ceilings)
    if not found:
        return None
    headers = ["framework", "strategy", "sec/epoch (1 dev)", "ceiling sec/epoch"]
    headers += ["ceiling s/step", "x ceiling", "measured", "env"]
    body = []
    for training, c in found:
        x, per_step = ratio(training, c), c.extra.get("s_per_step")
        steps = f"{c.extra.get('repeats', '?')} x {c.rec.steps_timed} steps"
        strategy = f"{DASH} ({c.tier})" if c.tier else DASH  # a ceiling with no training row
        if training is not None:
            cores = training.cores_per_device  # the same label on shared cores: another row
            strategy = training.label + ("" if cores is None else f" ({cores} core(s)/device)")
        body.append(
            [
                c.rec.framework,
                strategy,
                time_cell(training),
                time_cell(c),
                f"{per_step:.{decimals(per_step)}f} s ({steps})" if positive(per_step) else DASH,
                DASH if x is None else f"{x:.2f}x",
                "in the run" if c.extra.get(SAME_RUN) else "apart",
                env_cell([e for e in (training, c) if e is not None], envs),
            ]
        )
    notes = [
        f"ceiling sec/epoch: {STAR} always, projected from its timed steps of one batch; n "
        "counts its timed repeats. x ceiling: in the run, the median of the per-epoch ratios; "
        "apart (a ceiling record of its own), the ratio of the two medians."
    ]
    return Table(f"{workload}: training loop vs ceiling", headers, body, notes)
