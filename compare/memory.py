"""Lesson 4 (`zero`): what each device holds and what a step moves, measured against ZeRO's
closed forms (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models").

Ψ is the model's parameter count. Per device, with p, g and K the bytes per parameter of the
parameters, the gradients and the optimizer state:

    stage 0 (DDP)   pΨ + gΨ + KΨ         every device holds everything
    stage 1         pΨ + gΨ + KΨ/N       the optimizer state sharded
    stage 2         pΨ + (g + K)Ψ/N      and the gradients
    stage 3         (p + g + K)Ψ/N       and the parameters (FSDP)

The runs train in float32 with AdamW: p = g = 4, K = 8 (two float32 moments). The paper writes
mixed precision: p = g = 2, K = 12 (a float32 master copy and two moments). MXNet's update on
the servers (ps-lite) keeps the state off the workers' devices: pΨ + gΨ there, KΨ on the servers.

Per step a device's collectives cover 2Ψ elements under stages 0 to 2 (the gradients reduced,
the parameters or their update gathered) and 3Ψ under stage 3 (the parameters gathered for the
forward and again for the backward); an all-reduce counts twice its buffer, a reduce-scatter and
an all-gather.
"""

from __future__ import annotations

from dataclasses import dataclass

from compare import comm_model as cm
from compare.records import Entry, rank
from compare.scaling_report import fmt_bytes
from compare.tables import DASH, Table

KINDS = ("params", "grads", "opt_state")
# What each stage shards over the N devices.
SHARDED = {0: (), 1: ("opt_state",), 2: ("grads", "opt_state"), 3: KINDS}
STAGE_NAMES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3 / FSDP"}
HOLDS = {
    0: "everything, whole",
    1: "its shard of the optimizer state",
    2: "its shard of the gradients and optimizer state",
    3: "its shard of everything",
}
SERVERS = "servers"  # extra.state_on of MXNet's update on the kvstore's servers
# The ops a record's step_collectives names, in the tables' order; how many times its bytes a
# device's share of the step moves (an all-reduce is a reduce-scatter and an all-gather).
OPS = (
    "all_gather",
    "reduce_scatter",
    "all_reduce",
    "broadcast",
    "collective_permute",
    "push",
    "pull",
)
# Each framework's plain data parallel: the 1-device run the others' time is set against.
BASELINE = {"torch": "ddp", "jax": "sharding", "mxnet": "dist"}


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of the parameters, the gradients and the optimizer state."""

    name: str
    p: int
    g: int
    k: int

    def per_parameter(self) -> dict[str, int]:
        return dict(zip(KINDS, (self.p, self.g, self.k), strict=True))


FLOAT32 = Precision("float32, AdamW", 4, 4, 8)  # the runs: 4-byte weights, two 4-byte moments
MIXED = Precision("mixed precision, as the paper", 2, 2, 12)  # fp16 weights, fp32 master + moments


def closed_form(stage: int, psi: int, n: int, prec: Precision = FLOAT32, state_on: str = "devices"):
    """Each kind's bytes on one of `n` devices at ZeRO `stage`, for `psi` parameters."""
    out = {k: b * psi / (n if k in SHARDED[stage] else 1) for k, b in prec.per_parameter().items()}
    if state_on == SERVERS:
        out["opt_state"] = 0
    return out


def formula(stage: int, prec: Precision = FLOAT32, state_on: str = "devices") -> str:
    """The closed form as text: `4Ψ + (4 + 8)Ψ/N`, from `prec`'s bytes."""
    sizes = prec.per_parameter()
    if state_on == SERVERS:
        return f"{sizes['params']}Ψ + {sizes['grads']}Ψ (the {sizes['opt_state']}Ψ on servers)"
    whole = [f"{sizes[k]}Ψ" for k in KINDS if k not in SHARDED[stage]]
    split = [str(sizes[k]) for k in KINDS if k in SHARDED[stage]]
    if split:
        whole.append(f"({' + '.join(split)})Ψ/N" if len(split) > 1 else f"{split[0]}Ψ/N")
    return " + ".join(whole)


def textbook_moved(stage: int) -> int:
    """Elements a device's collectives cover per step, in units of Ψ."""
    return 3 if stage == 3 else 2


def moved(collectives: list[dict]) -> int:
    """Bytes a device's collectives cover per step, each all-reduce twice."""
    return cm.covered(collectives)


@dataclass
class Run:
    """One zero record, what the tables read of it."""

    e: Entry
    stage: int
    psi: int
    state_on: str
    devices: list[dict]  # extra.state_bytes: a dict of KINDS per device

    @property
    def name(self) -> str:
        return f"{self.e.rec.framework} {self.e.label}"

    def total(self, i: int) -> int:
        return sum(self.devices[i][k] for k in KINDS)

    def closed(self) -> dict[str, float]:
        return closed_form(self.stage, self.psi, self.e.rec.devices, FLOAT32, self.state_on)


def runs(entries: list[Entry]) -> list[Run]:
    """The zero records with their state bytes, the newest of each framework, strategy and
    device count (their cores do not change the bytes), in the report's row order."""
    newest: dict[tuple, Entry] = {}
    for e in entries:
        if e.rec.workload != "zero" or not e.extra.get("state_bytes") or e.nodes is not None:
            continue
        key = (e.rec.framework, e.label, e.rec.devices)
        if key not in newest or e.time > newest[key].time:
            newest[key] = e
    out = [
        Run(
            e,
            e.extra["zero_stage"],
            e.extra["parameters"],
            e.extra.get("state_on", "devices"),
            e.extra["state_bytes"],
        )
        for e in newest.values()
    ]
    return sorted(out, key=lambda r: (*rank("zero", r.e.rec.framework, r.e.label), r.e.rec.devices))


def stage_text(run: Run) -> str:
    text = f"{run.stage} ({STAGE_NAMES[run.stage]})"
    return text + (", state on the servers" if run.state_on == SERVERS else "")


def psi_note(rows: list[Run]) -> str:
    counts = sorted({r.psi for r in rows})
    return (
        f"Ψ = {' / '.join(f'{c:,}' for c in counts)} parameters, counted by the runs from the "
        "model "
        "(BatchNorm's running statistics are not parameters); float32 throughout, AdamW's state "
        "two moments per parameter."
    )


def memory_table(entries: list[Entry], title: str = "zero: state bytes per device") -> Table | None:
    """Device 0's bytes of each kind, the most any device holds, ZeRO's closed form and the
    ratio of the two, and the measured peak: a row per run."""
    rows = runs(entries)
    if not rows:
        return None
    head = ["run", "ZeRO stage", "N", "params", "grads", "optimizer state", "device 0"]
    head += ["most on a device", "closed form", "= bytes", "most / closed form", "peak"]
    body, sources = [], {}
    for r in rows:
        closed = sum(r.closed().values())
        most = max(r.total(i) for i in range(len(r.devices)))
        cells = [r.name, stage_text(r), r.e.rec.devices]
        cells += [fmt_bytes(r.devices[0][k]) for k in KINDS] + [fmt_bytes(r.total(0))]
        cells += [fmt_bytes(most), formula(r.stage, FLOAT32, r.state_on), fmt_bytes(closed)]
        cells += [f"{most / closed:.3f}" if closed else DASH, peak_cell(r.e, sources)]
        body.append([str(c) for c in cells])
    notes = [psi_note(rows), f"The paper's mixed-precision forms: {paper_forms()}."]
    notes += [f"peak {mark}: {text}" for text, mark in sources.items()]
    return Table(title, head, body, notes)


BELOW = (
    "below the closed form: the bytes are read between steps, and the parameters this stage "
    "keeps whole during a step were sharded again by then (torch's fully_shard with "
    "reshard_after_forward=False reshards after the backward)"
)


def memory_grid(entries: list[Entry]) -> Table | None:
    """The memory table folded for a page: a row per run, a column per device count, each cell
    the most any device holds, its ratio to the closed form and the peak."""
    rows = runs(entries)
    if not rows:
        return None
    counts = sorted({r.e.rec.devices for r in rows})
    cells: dict[str, dict[int, str]] = {}
    forms, sources, below = {}, {}, set()
    for r in rows:
        closed = sum(r.closed().values())
        most = max(r.total(i) for i in range(len(r.devices)))
        ratio = f" ({most / closed:.3f})" if closed else ""
        if closed and most < closed:
            below.add(r.name)
        peak = peak_cell(r.e, sources)
        cell = fmt_bytes(most) + ratio + (f"; peak {peak}" if peak != DASH else "")
        cells.setdefault(r.name, {})[r.e.rec.devices] = cell
        forms[r.name] = formula(r.stage, FLOAT32, r.state_on)
    head = ["run", "closed form", *(f"N = {n}" for n in counts)]
    body = [
        [name, forms[name], *(mine.get(n, DASH) for n in counts)] for name, mine in cells.items()
    ]
    notes = [
        psi_note(rows),
        "Each cell: the most any device holds of parameters, gradients and optimizer state, its "
        "ratio to the closed form in brackets, and the largest peak of the run's devices.",
    ]
    notes += [f"peak {mark}: {text}" for text, mark in sources.items()]
    if below:  # what the shards held between steps, below what the stage holds during one
        notes.append(f"{', '.join(sorted(below))}: {BELOW}")
    return Table("zero: state bytes per device", head, body, notes)


def paper_forms() -> str:
    return "; ".join(f"{STAGE_NAMES[s]} {formula(s, MIXED)}" for s in SHARDED)


def peak_cell(e: Entry, sources: dict[str, str]) -> str:
    """The largest of the run's per-device peaks, marked with its source and what it includes
    (a note per distinct pair)."""
    peak = e.extra.get("peak_bytes")
    if not isinstance(peak, dict) or not peak.get("bytes"):
        return DASH
    text = f"{peak['source']}: {peak.get('includes', '')}".rstrip(": ")
    mark = sources.setdefault(text, f"({len(sources) + 1})")
    return f"{fmt_bytes(max(peak['bytes']))} {mark}"


def bytes_table(entries: list[Entry], n: int | None = None) -> Table | None:
    """Each run on several devices (on `n`, where given): its step's collectives per kind
    (count, the bytes they cover), their sum in units of Ψ float32 elements beside the
    textbook's."""
    rows = [r for r in runs(entries) if r.e.rec.devices > 1 and "step_collectives" in r.e.extra]
    rows = [r for r in rows if n is None or r.e.rec.devices == n]
    if not rows:
        return None
    ops = [
        op for op in OPS if any(c["op"] == op for r in rows for c in r.e.extra["step_collectives"])
    ]
    head = ["run", "ZeRO stage", "N", *(op.replace("_", "-") for op in ops)]
    head += ["moved, Ψ", "textbook, Ψ"]
    body = []
    for r in rows:
        found = r.e.extra["step_collectives"]
        cells = [r.name, stage_text(r), str(r.e.rec.devices)]
        for op in ops:
            mine = [c for c in found if c["op"] == op]
            count, size = sum(c["count"] for c in mine), sum(c["bytes"] for c in mine)
            cells.append(f"{count} × {fmt_bytes(size)}" if mine else DASH)
        units = moved(found) / (FLOAT32.p * r.psi)
        cells += [f"{units:.2f}", str(textbook_moved(r.stage))]
        body.append(cells)
    notes = [
        psi_note(rows),
        "Each op: how many a device makes per step × the bytes they cover (an all-gather its "
        "output, a reduce-scatter its input, an all-reduce or a broadcast its buffer); moved: "
        "their sum, an all-reduce counted twice (a reduce-scatter and an all-gather), in float32 "
        "elements per parameter; textbook: ZeRO's 2Ψ, and 3Ψ for stage 3.",
    ]
    sources = dict.fromkeys(
        f"{r.e.rec.framework}: {r.e.extra['collectives_source']}"
        for r in rows
        if r.e.extra.get("collectives_source")
    )
    return Table("zero: collectives per step", head, body, notes + list(sources))


def holds_table(entries: list[Entry], n: int = 2) -> Table | None:
    """The idea: what one of `n` devices holds at each stage, the closed form in bytes for the
    records' Ψ beside what each framework's run of that stage on `n` devices held."""
    rows = [r for r in runs(entries) if r.e.rec.devices == n]
    if not rows:
        return None
    psi = rows[0].psi
    frameworks = list(dict.fromkeys(r.e.rec.framework for r in rows))
    head = ["", "each device holds", "closed form", f"N = {n}", *frameworks]
    body = []
    for stage in SHARDED:
        closed = sum(closed_form(stage, psi, n).values())
        cells = [STAGE_NAMES[stage], HOLDS[stage], formula(stage), fmt_bytes(closed)]
        for fw in frameworks:
            mine = [r for r in rows if r.e.rec.framework == fw and r.stage == stage]
            cells.append(", ".join(f"{r.e.label}: {fmt_bytes(r.total(0))}" for r in mine) or DASH)
        body.append(cells)
    notes = [psi_note(rows), "Each framework's cell: device 0's bytes, read from its shards."]
    servers = [r for r in rows if r.state_on == SERVERS]
    if servers:
        r = servers[0]
        notes.append(
            f"{r.name} (ZeRO-1's parameter-server ancestor) holds {fmt_bytes(r.total(0))} on a "
            f"worker's device: {formula(1, FLOAT32, SERVERS)}."
        )
    return Table(f"zero: what each of {n} devices holds", head, body, notes)


def time_table(entries: list[Entry]) -> Table | None:
    """Seconds per epoch of each run at each device count and cores per device (a core each, or
    the devices sharing the machine's), a column each, and its speedups over its framework's
    plain data parallel (BASELINE) on 1 device with as many cores per device, as the report's
    speedups are only of like runs."""
    mine = [e for e in entries if e.rec.workload == "zero" and e.nodes is None and not e.ceiling]
    if not mine:
        return None
    columns = sorted(
        {(e.rec.devices, e.cores_per_device) for e in mine},
        key=lambda c: (c[0], c[1] is None, c[1] or 0),
    )
    cells: dict[tuple, dict[tuple, Entry]] = {}
    for e in mine:
        cells.setdefault((e.rec.framework, e.label), {})[(e.rec.devices, e.cores_per_device)] = e
    head = ["run", *(f"N = {n}, {cores_text(c)}" for n, c in columns), "speedup"]
    body = []
    for fw, label in sorted(cells, key=lambda key: rank("zero", *key)):
        runs_of, base_of = cells[fw, label], cells.get((fw, BASELINE.get(fw)), {})
        row = [f"{fw} {label}", *(seconds(runs_of[c]) if c in runs_of else DASH for c in columns)]
        speedups = [
            f"{base_of[1, cores].median / e.median:.2f}x at N = {n}"
            for (n, cores), e in sorted(runs_of.items(), key=lambda item: item[0][0])
            if n > 1 and (1, cores) in base_of and not (e.diverged or base_of[1, cores].diverged)
        ]
        body.append(row + ["; ".join(speedups) or DASH])
    notes = [
        "s/epoch at each device count N and cores per device: a core each, or the devices "
        "sharing the machine's cores. speedup: the 1-device run of each framework's plain data "
        f"parallel ({', '.join(BASELINE.values())}) on as many cores per device over the run on N."
    ]
    if any(e.rec.extrapolated for e in mine):
        notes.append("* projected from the timed steps of each epoch.")
    return Table("zero: seconds per epoch", head, body, notes)


def cores_text(cores: int | None) -> str:
    if cores is None:
        return "shared cores"
    return "a core each" if cores == 1 else f"{cores} cores each"


def seconds(e: Entry) -> str:
    if e.diverged:
        return f"diverged at epoch {e.diverged}"
    t = e.median
    return (f"{t:.0f}" if t >= 100 else f"{t:.3g}") + ("*" if e.rec.extrapolated else "")
