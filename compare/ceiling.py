"""Training loops against their framework's ceiling (common/ceiling.py): for lenet and resnet18,
each 1-device training record next to its ceiling, and the ratio of their seconds per epoch.
Its ceiling is the one measured in its own run (--ceiling) where it has one, else the ceiling
record of the same framework, precision and compiled tier in its machine group."""

from __future__ import annotations

import dataclasses

from compare.records import CEILING, Entry, sort_key
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


def tier(e: Entry) -> str:
    """What a ceiling must share with a training record besides the framework: the label past
    the strategy (`+bf16`, `+compiled`)."""
    return e.label[len(e.rec.strategy) :]


def _unpaired(c: Entry) -> str:
    """The strategy cell of a ceiling with no training row: a dash, naming its tier if any."""
    label = tier(c)
    return f"{DASH} ({label})" if label else DASH


def in_run(e: Entry | None) -> Entry | None:
    """The ceiling a 1-device training record measured in its own run (--ceiling, the record's
    extra.ceiling), as a ceiling Entry of the same framework and tier; None without one."""
    extra = e.rec.extra if e is not None and isinstance(e.rec.extra, dict) else {}
    c = extra.get("ceiling")
    if e is None or e.rec.devices != 1 or not isinstance(c, dict):
        return None
    if not isinstance(c.get("sec_per_epoch"), dict) or "median" not in c["sec_per_epoch"]:
        return None
    rec = dataclasses.replace(
        e.rec,
        strategy=CEILING,
        sec_per_epoch=c["sec_per_epoch"],
        extrapolated=True,  # always: its steps of one batch, projected to an epoch
        steps_timed=c.get("steps_timed"),
        diverged_at_epoch=None,
        extra={**extra, **c, SAME_RUN: True},  # amp and compiled kept: the training's tier
    )
    return Entry(rec, e.source, e.order)


def of(training: Entry | None, ceilings: list[Entry]) -> Entry | None:
    """A 1-device training record's ceiling: its own (same run), else a ceiling record of its
    framework and tier, else None."""
    if training is None or training.rec.devices != 1:
        return None
    own = in_run(training)
    if own is not None:
        return own
    same = [c for c in ceilings if c.rec.framework == training.rec.framework]
    return next((c for c in same if tier(c) == tier(training)), None)


def ratio(training: Entry | None, ceiling: Entry) -> float | None:
    """x ceiling: measured in the run (the median of its epochs' ratios to the repeats beside
    them), else training sec/epoch over the ceiling record's (medians); None without a time."""
    if training is None or training.diverged:
        return None
    if ceiling.rec.extra.get(SAME_RUN):
        x = ceiling.rec.extra.get("x_ceiling")
        ok = isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0
        return float(x) if ok else None
    return training.median / ceiling.median


def rows(entries: list[Entry], ceilings: list[Entry]) -> list[tuple[Entry | None, Entry]]:
    """(1-device training record or None, its ceiling), in the tables' order: a record with a
    ceiling of its own run is paired with that one; a ceiling record with no other record of its
    framework and tier gets a row of its own."""
    ones = [e for e in entries if e.rec.devices == 1]
    pairs = [(e, c) for e in ones if (c := in_run(e)) is not None]
    paired = {id(e) for e, _ in pairs}
    for c in ceilings:
        same = [e for e in ones if e.rec.framework == c.rec.framework and tier(e) == tier(c)]
        rest = [e for e in same if id(e) not in paired]
        pairs += [(e, c) for e in rest] or ([] if same else [(None, c)])
    if not pairs:
        return []
    order = sort_key(pairs[0][1].rec.workload)
    return sorted(pairs, key=lambda p: order((p[1].rec.framework, (p[0] or p[1]).label)))


def sec_per_epoch(entries: list[Entry], ceilings: list[Entry], workload: str) -> dict:
    """(framework, label) of each 1-device training row -> its ceiling's sec/epoch (median),
    for the plots; empty without ceilings."""
    mine = [c for c in ceilings if c.rec.workload == workload]
    ones = [e for e in entries if e.rec.workload == workload]
    return {(t.rec.framework, t.label): c.median for t, c in rows(ones, mine) if t is not None}


def ceiling_table(workload: str, entries: list[Entry], ceilings: list[Entry], envs) -> Table | None:
    """The table for one workload of one machine group, or None without a ceiling."""
    mine = [c for c in ceilings if c.rec.workload == workload]
    pairs = rows([e for e in entries if e.rec.workload == workload], mine)
    if not pairs:
        return None
    headers = ["framework", "strategy", "sec/epoch (1 dev)", "ceiling sec/epoch"]
    headers += ["ceiling s/step", "x ceiling", "measured", "env"]
    body = []
    for training, c in pairs:
        x = ratio(training, c)
        steps = f"{c.rec.extra.get('repeats', '?')} x {c.rec.steps_timed} steps"
        body.append(
            [
                c.rec.framework,
                strategy_cell(training) if training else _unpaired(c),
                time_cell(training),
                time_cell(c),
                fmt_step(c.rec.extra.get("s_per_step"), steps),
                DASH if x is None else f"{x:.2f}x",
                "in the run" if c.rec.extra.get(SAME_RUN) else "apart",
                env_cell([e for e in (training, c) if e is not None], envs),
            ]
        )
    notes = [
        f"ceiling sec/epoch: {STAR} always, projected from its timed steps of one batch; n "
        "counts its timed repeats. x ceiling: in the run, the median of the per-epoch ratios; "
        "apart (a ceiling record of its own), the ratio of the two medians."
    ]
    return Table(f"{workload}: training loop vs ceiling", headers, body, notes)


def strategy_cell(e: Entry) -> str:
    """The training row's label, with its cores per device where it had its own: the same
    framework and label on shared cores is another row."""
    cores = e.cores_per_device
    return e.label if cores is None else f"{e.label} ({cores} core(s)/device)"


def fmt_step(per_step, steps: str) -> str:
    if not isinstance(per_step, (int, float)) or isinstance(per_step, bool) or per_step <= 0:
        return DASH
    return f"{per_step:.{decimals(per_step)}f} s ({steps})"
