"""Training loops against their framework's ceiling (common/ceiling.py): for lenet and resnet18,
each 1-device training record next to the ceiling record of the same framework, precision and
compiled tier in its machine group, and the ratio of their seconds per epoch."""

from __future__ import annotations

from compare.records import Entry, sort_key
from compare.tables import DASH, STAR, Table, decimals, env_cell, time_cell

EXPLANATION = (
    "The ceiling (`python -m <framework>_impl.ceiling`, `make ceiling`) is how fast the framework "
    "itself steps the same model on this machine: the workload module's own model and training "
    "step in a tight loop on one device, one fixed batch already on the device, the framework's "
    "barrier only at the end of each timed repeat; no batch indexing, loss bookkeeping, "
    "evaluation or data-parallel wrapper. Its seconds per step times an epoch's steps is its "
    "sec/epoch (extrapolated). x ceiling = training sec/epoch (1 device) / ceiling sec/epoch: "
    "1.00x is a loop as fast as its framework can step; the target on GPUs is at most 1.10x."
)


def tier(e: Entry) -> str:
    """What a ceiling must share with a training record besides the framework: the label past
    the strategy (`+bf16`, `+compiled`)."""
    return e.label[len(e.rec.strategy) :]


def ratio(training: Entry | None, ceiling: Entry) -> float | None:
    """Training sec/epoch over the ceiling's (medians), or None without a training time."""
    if training is None or training.diverged:
        return None
    return training.median / ceiling.median


def rows(entries: list[Entry], ceilings: list[Entry]) -> list[tuple[Entry | None, Entry]]:
    """(1-device training record or None, its ceiling), in the tables' order."""
    pairs = []
    for c in ceilings:
        same = [
            e
            for e in entries
            if e.rec.devices == 1 and e.rec.framework == c.rec.framework and tier(e) == tier(c)
        ]
        pairs += [(e, c) for e in same] or [(None, c)]
    order = sort_key(ceilings[0].rec.workload) if ceilings else None
    return sorted(pairs, key=lambda p: order((p[1].rec.framework, (p[0] or p[1]).label)))


def sec_per_epoch(entries: list[Entry], ceilings: list[Entry], workload: str) -> dict:
    """(framework, label) of each 1-device training row -> its ceiling's sec/epoch (median),
    for the plots; empty without ceiling records."""
    mine = [c for c in ceilings if c.rec.workload == workload]
    return {(t.rec.framework, t.label): c.median for t, c in rows(entries, mine) if t is not None}


def ceiling_table(workload: str, entries: list[Entry], ceilings: list[Entry], envs) -> Table | None:
    """The table for one workload of one machine group, or None without a ceiling record."""
    mine = [c for c in ceilings if c.rec.workload == workload]
    if not mine:
        return None
    headers = ["framework", "strategy", "sec/epoch (1 dev)", "ceiling sec/epoch"]
    headers += ["ceiling s/step", "x ceiling", "env"]
    body = []
    for training, c in rows(entries, mine):
        x = ratio(training, c)
        per_step = c.rec.extra.get("s_per_step")
        steps = f"{c.rec.extra.get('repeats', '?')} x {c.rec.steps_timed} steps"
        body.append(
            [
                c.rec.framework,
                training.label if training else DASH,
                time_cell(training),
                time_cell(c),
                fmt_step(per_step, steps),
                DASH if x is None else f"{x:.2f}x",
                env_cell([e for e in (training, c) if e is not None], envs),
            ]
        )
    notes = [
        f"ceiling sec/epoch: {STAR} always, projected from its timed steps of one batch; n "
        "counts its timed repeats. x ceiling: the ratio of the two medians."
    ]
    return Table(f"{workload}: training loop vs ceiling", headers, body, notes)


def fmt_step(per_step, steps: str) -> str:
    if not isinstance(per_step, (int, float)) or isinstance(per_step, bool) or per_step <= 0:
        return DASH
    return f"{per_step:.{decimals(per_step)}f} s ({steps})"
