"""The report's section "Scaling across nodes" (compare/scaling.py): per workload, a table of the
cluster's runs and a plot of the step against the link's rate; then the model's predictions for
interconnects the project has not been lent, labelled as such."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from compare import comm_model as cm
from compare import records
from compare.checks import WORKLOADS
from compare.records import Entry
from compare.render import Doc
from compare.scaling import Cell, cells_of, engine_of, link, nccl_exchange, step_seconds
from compare.tables import DASH, STAR, Table, decimals, fmt_efficiency, fmt_speedup, time_cell

HEADING = "Scaling across nodes"
EXPLANATION = (
    "The cluster in one box (`make cluster`): each node a network namespace on cores of its "
    "own, the nodes joined by a link that only they use, at the rate `tc` gives it; each "
    "framework's own multi-node engine runs across them. Every run is set against its engine's "
    "1-node run (the same framework, cores per device, preset and batch per device) and against "
    "a model of its step (compare/scaling.py): the 1-node step's compute and the collectives the "
    "engine makes per step (common/collectives.py: DDP's buckets, the all-reduces of XLA's "
    "optimized program, Gluon's kvstore key per parameter), each timed at the latency (alpha) "
    "and bus bandwidth fitted to the same engine's all-reduce measured alone over the same link "
    "(the all-reduce section), and each starting once the backward has readied its gradients "
    "and the link is free."
)
NOTES = [
    "sec/epoch: median ± std over the timed epochs; speedup = the 1-node run's sec/epoch / this "
    "run's (the batch grows with the nodes, so this is the ratio of throughputs); efficiency = "
    "speedup / nodes.",
    "s/step = batch_size / images_per_sec over the timed epochs; bytes/step measured: what node "
    "0's interface carried in those epochs, (sent + received) / 2 / steps, headers included; "
    "bytes/step model: 2 (n - 1) / n x G each way; a zero run whose step all-gathers, "
    "reduces or broadcasts: (n - 1) / n of what its step's collectives cover (the record's "
    "step_collectives, an all-reduce twice).",
    "comm (model): the sum over the step's collectives of alpha + 2 (n - 1) / n x bytes / busbw; "
    "exposed comm: this run's s/step - the 1-node run's; overlap: comm (model) - exposed comm, "
    "at least 0: the exchange the compute hid, as far as the model is right; model: its s/step "
    "(its error against the measured one); –: a figure the records cannot give (no 1-node run "
    "of the engine, or no all-reduce run of it over this link).",
]
# Where a node has one core, the exchange's CPU work cannot run beside the compute.
ONE_CORE_NOTE = (
    "On nodes of one core (cores/device 1, one device per node), the kernel's TCP work and the "
    "engine's reduction (gloo's, or ps-lite's servers') run on the node's only core, so "
    "communication costs compute time there: exposed comm counts that time as well as the wait "
    "on the link. The all-reduce measured alone on such nodes counts it too, but not what the "
    "compute beside it loses, so overlap is a lower bound on what the compute hid."
)


def nodes_table(workload: str, cells: list[Cell]) -> Table:
    headers = ["engine", "exchange", "cores/device", "link", "nodes", "sec/epoch"]
    headers += ["speedup", "efficiency", "s/step", "bytes/step measured", "bytes/step model"]
    headers += ["comm (model)", "exposed comm", "overlap", "model"]
    body = [row(c) for c in cells]
    notes = list(NOTES)
    if any(one_core_nodes(c) for c in cells):
        notes.append(ONE_CORE_NOTE)
    runs = [e for c in cells for e in (c.entry, c.base) if e is not None]
    steps = sorted({e.rec.steps_timed for e in runs if e.rec.extrapolated and e.rec.steps_timed})
    if steps:
        notes.append(
            f"{STAR} extrapolated: the epoch time is projected from "
            f"{'/'.join(map(str, steps))} timed steps per epoch, and so is every figure derived "
            "from it."
        )
    return Table(f"{workload} across nodes", headers, body, notes)


def one_core_nodes(c: Cell) -> bool:
    engine = engine_of(c.entry)
    return c.nodes > 1 and engine.cores == 1 and engine.devices_per_node == 1


def row(c: Cell) -> list[str]:
    e, s = c.entry, c.speedup()
    star = e.rec.extrapolated or (c.base is not None and c.base.rec.extrapolated)
    cells = [f"{e.rec.framework} {e.label}", str(e.rec.extra.get("engine") or DASH)]
    cells += [DASH if e.cores_per_device is None else str(e.cores_per_device), link_text(e)]
    cells += [str(c.nodes), time_cell(e)]
    several = c.nodes > 1
    cells += [fmt_speedup(s and s[0], star) if several else DASH]
    cells += [fmt_efficiency(s and s[1], star) if several else DASH, fmt_seconds(c.step)]
    cells += [fmt_bytes(c.bytes_measured), fmt_bytes(c.bytes_model)]
    return cells + [fmt_seconds(x) for x in (c.comm, c.exposed, c.overlap)] + [fmt_model(c)]


@dataclass(frozen=True)
class Line:
    """One engine on one node count in the plot (plots.nodes): its steps by the link's rate."""

    label: str
    framework: str
    measured: list[tuple[float, float]]  # (link rate in bit/s, seconds per step)
    model: list[tuple[float, float]]  # the model at the same links; empty: none
    compute: float | None  # the engine's 1-node step


def lines(cells: list[Cell]) -> list[Line]:
    """The plot's lines: x is the link's rate, or for one with no rate set (unlimited) the
    throughput measured over it."""
    groups: dict[tuple, list[Cell]] = {}
    for c in cells:
        if c.nodes > 1 and c.step is not None and x_of(c) is not None:
            groups.setdefault((engine_of(c.entry), c.nodes), []).append(c)
    out = []
    for (_, nodes), mine in groups.items():
        mine.sort(key=x_of)
        e = mine[0].entry
        measured = [(x_of(c), c.step) for c in mine]
        modelled = [(x_of(c), c.predicted) for c in mine if c.predicted is not None]
        label = f"{e.rec.framework} {e.label}, {nodes} nodes"
        out.append(Line(label, e.rec.framework, measured, modelled, mine[0].compute))
    return out


def x_of(c: Cell) -> float | None:
    info = link(c.entry)
    return info.get("rate_bps") or info.get("measured_bps")


PREDICTIONS_NOTE = (
    "Predictions, not measurements: the step's collectives of this section's model, each at "
    "the interconnect's bus bandwidth and NCCL's own latency for a ring all-reduce "
    "(comm_model.PREDICTED and nccl_latency, their sources there), each GPU keeping the batch "
    "of its 1-GPU record, whose s/step is the compute, on the timeline of the measured model. "
    "JAX's are XLA's CPU program's, its operands at the backward's end one all-reduce as "
    "XLA:GPU hands them to NCCL; XLA:GPU may split or schedule them otherwise."
)


def predictions(kept: list[Entry], cluster: list[Entry], workload: str = "resnet18"):
    """The predictions table of `workload` from the 1-GPU records in `kept`, or why none."""
    grads = [e.rec.extra.get("gradient_bytes") for e in cluster if e.rec.workload == workload]
    grad = next((g for g in grads if g), None)
    gpus = [e for e in kept if e.rec.platform == "gpu" and not e.rec.virtual and e.rec.devices == 1]
    gpus = [e for e in gpus if e.rec.workload == workload and e.nodes is None and step_seconds(e)]
    rows = [
        predicted_row(e, grad, name, bandwidth, step_latency, n)
        for e in gpus
        for name, bandwidth, step_latency, counts in cm.PREDICTED
        for n in counts
    ]
    if not any(rows):
        why = "no 1-GPU record of an engine whose collectives per step are known"
        return f"No predictions for {workload}: {why}."
    headers = ["GPU (1-device record)", "engine", "s/step, 1 GPU", "interconnect", "devices"]
    headers += ["bytes/step per link", "comm", "s/step", "efficiency"]
    title = f"{workload}: predictions, not measurements"
    return Table(title, headers, [r for r in rows if r], [PREDICTIONS_NOTE])


def predicted_row(e: Entry, grad, name: str, bandwidth: float, hop: float, n: int) -> list | None:
    """A prediction of `e`'s engine on n GPUs over an interconnect; None where the step's
    collectives are not known (compare.scaling.made)."""
    t1 = step_seconds(e)
    if not (pieces := nccl_exchange(e, n, grad, bandwidth, hop)):
        return None
    comm, step = sum(t for t, _ in pieces), cm.timeline(t1, pieces)
    gpu = records.hardware_text(records.hardware_key(e.rec), 1, False)
    cells = [gpu, f"{e.rec.framework} {e.label}", fmt_seconds(t1), name, str(n)]
    cells += [fmt_bytes(cm.link_bytes(n, grad))]
    return [*cells, *(fmt_seconds(x) for x in (comm, step)), f"{t1 / step:.0%}"]


def by_workload(cluster: list[Entry], fits: dict):
    """(workload, its runs, their cells) of each workload with
    cluster runs: what the report and docs/results.md both show. `fits`: the all-reduce runs'
    (compare.collectives.fits)."""
    for workload in WORKLOADS:
        mine = [e for e in cluster if e.rec.workload == workload]
        if mine:
            yield workload, mine, cells_of(mine, fits)


def predicted(kept: list[Entry], cluster: list[Entry]) -> list[Table | str]:
    workloads = sorted({e.rec.workload for e in cluster}, key=WORKLOADS.index)
    return [predictions(kept, cluster, workload) for workload in workloads]


def docs_items(cluster: list[Entry], gpus: list[Entry], fits: dict) -> tuple[list, list]:
    """What docs/results.md shows of one group's cluster runs (compare/readme.py): each
    workload's title and table, then the predictions from the 1-GPU records of the engines the
    cluster ran on several nodes, so each prediction's compute is the engine it predicts."""
    tables = [nodes_table(w, cells) for w, _, cells in by_workload(cluster, fits)]
    engines = {(e.rec.framework, e.label) for e in cluster if e.nodes > 1}
    mine = [e for e in gpus if (e.rec.framework, e.label) in engines]
    return [x for t in tables for x in (f"{t.title}:", t)], predicted(mine, cluster)


def section(doc: Doc, cluster: list[Entry], kept: list[Entry], draw: Callable, fits: dict) -> None:
    """The section of one group's cluster runs; `draw(workload, lines, used)` adds a plot after
    each table; `kept`: every record the report shows, where the predictions find their GPUs."""
    doc.heading(3, HEADING)
    doc.para(EXPLANATION)
    for workload, mine, cells in by_workload(cluster, fits):
        doc.heading(4, f"{workload} across nodes")
        doc.table(nodes_table(workload, cells))
        draw(workload, lines(cells), mine)
    doc.heading(4, "Predictions, not measurements: interconnects not lent")
    for table in predicted(kept, cluster):
        if isinstance(table, Table):
            doc.table(table)
        else:
            doc.para(table)


def fmt_seconds(x: float | None) -> str:
    return DASH if x is None else f"{x:.{decimals(abs(x)) if x else 2}f} s"


def fmt_units(x: float, unit: str) -> str:
    """Decimal prefixes, about three significant digits: `44.7 MB`, `941 Mbit/s`."""
    for prefix, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= size:
            return f"{x / size:.{decimals(x / size)}f} {prefix}{unit}"
    return f"{x:.0f} {unit}"


def fmt_bytes(x: float | None) -> str:
    return DASH if x is None else fmt_units(x, "B")


def fmt_bits(x: float | None) -> str:
    return fmt_units(x, "bit/s") if x else DASH


def fmt_model(cell: Cell) -> str:
    """`0.523 s (+3.2%)`: the model's step and its error against the measured step, to a tenth of
    a percent below 10%."""
    if cell.predicted is None or cell.error is None:
        return fmt_seconds(cell.predicted)
    percent = 100 * cell.error
    percent = f"{percent:+.1f}%" if abs(percent) < 10 else f"{percent:+.0f}%"
    return f"{fmt_seconds(cell.predicted)} ({percent})"


def link_text(e: Entry) -> str:
    """`1gbit (measured 941 Mbit/s, 52 µs)`; the 1-node run's link carries nothing."""
    if e.nodes == 1:
        return f"{e.link_name or DASH} (1 node)"
    latency = link(e).get("latency_s")
    said = [f"measured {fmt_bits(link(e).get('measured_bps'))}"]
    said += [] if latency is None else [f"{latency * 1e6:.0f} µs"]
    return f"{e.link_name} ({', '.join(said)})"
