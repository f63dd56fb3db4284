"""Scaling across nodes: each run of the cluster in one box (extra.nodes) against its engine's
1-node run and a model of its step (compare/comm_model.py): the step's collectives
(common.collectives.step_collectives) timed at the fit of the engine's all-reduce measured alone
over the same link on the same machine (compare.collectives), placed beside the backward.

Per step: seconds per step = batch_size / images_per_sec over the timed epochs, whose steps are
whole batches in the bounded epochs of the scaling runs; extra.link_bytes counts the same epochs,
so bytes per step ((tx + rx) / 2 / steps) are of the same steps. batch_size and devices are the
whole cluster's. An engine is the framework, tier and BatchNorm at the same cores per device,
preset, batch per device and devices per node: its 1-node run may train with another strategy
(MXNet's gluon, where several nodes need kvstore dist), and on one device BatchNorm is the same
either way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from common import collectives, flops
from compare import comm_model as cm
from compare.collectives import fit_key
from compare.records import FRAMEWORK_ORDER, Entry


@dataclass(frozen=True)
class Engine:
    framework: str
    tier: str  # the label past the strategy: precision and compilation
    sync_bn: bool  # BatchNorm over the whole batch of several devices
    cores: int | None
    preset: str
    per_device_batch: float
    devices_per_node: float


def engine_of(e: Entry) -> Engine:
    r, nodes = e.rec, e.nodes or 1
    per_device = r.batch_size / r.devices
    return Engine(
        r.framework, e.tier, e.sync_bn, e.cores_per_device, r.preset, per_device, r.devices / nodes
    )


def step_seconds(e: Entry | None) -> float | None:
    if e is None or e.diverged or not e.rec.images_per_sec:
        return None
    return e.rec.batch_size / e.rec.images_per_sec


def measured_bytes(e: Entry) -> float | None:
    """Bytes node 0's link carried per step, the mean of the two directions; None on one node,
    whose interface counts stray packets, not training."""
    counts = e.extra.get("link_bytes")
    if e.nodes == 1 or not isinstance(counts, dict):
        return None
    return (counts["tx"] + counts["rx"]) / 2 / counts["steps"]


def link(e: Entry) -> dict:
    value = e.extra.get("link")
    return value if isinstance(value, dict) else {}


def made(e: Entry, grad: float | None) -> list[tuple] | None:
    """The step's collectives of `e`'s engine (common.collectives.step_collectives), as
    (bytes, ready); None unless its model is ResNet-18 and `grad` ResNet-18's gradient."""
    if e.rec.workload != "resnet18" or grad != flops.gradient_bytes("resnet18"):
        return None
    fw, strategy = e.rec.framework, e.rec.strategy
    return collectives.step_collectives(fw, strategy, e.sync_bn, not e.unbucketed)


def timed(pieces: list[tuple], n: int, alpha: float, busbw: float) -> list[tuple]:
    """(seconds, ready) of each (bytes, ready): alpha + 2 (n - 1) / n x bytes / busbw."""
    return [(alpha + collectives.bus_factor(n) * size / busbw, ready) for size, ready in pieces]


def measured_exchange(e: Entry, fits: dict) -> list[tuple[float, float | None]] | None:
    """The step's collectives timed at the engine's alpha and busbw fitted over the same link
    on the same machine (compare.collectives.fits); None without both."""
    pieces = made(e, e.rec.extra.get("gradient_bytes"))
    fitted = fits.get(fit_key(e.rec.framework, e.nodes, e.link_name, e.rec.hardware))
    return None if pieces is None or fitted is None else timed(pieces, e.nodes, *fitted)


def nccl_exchange(e: Entry, n: int, grad: float, bandwidth: float, step_latency: float):
    """The step's collectives over an interconnect not lent, at NCCL's latency
    (comm_model.nccl_latency) and its bus bandwidth; None unless `grad`, the cluster's
    gradient, is ResNet-18's. XLA:GPU hands an op's operands to NCCL together: those at the
    backward's end are one."""
    if (pieces := made(e, grad)) is None:
        return None
    if e.rec.framework == "jax":
        at_end = sum(size for size, ready in pieces if ready == 1.0)
        pieces = [(size, ready) for size, ready in pieces if ready != 1.0] + [(at_end, 1.0)]
    return timed(pieces, n, cm.nccl_latency(n, step_latency), bandwidth)


@dataclass
class Cell:
    """One cluster run, and what the model says of it (None: cannot be worked out)."""

    entry: Entry
    base: Entry | None  # the engine's 1-node run
    step: float | None = None  # measured seconds per step
    compute: float | None = None  # the 1-node run's seconds per step
    bytes_measured: float | None = None
    bytes_model: float | None = None
    comm: float | None = None  # modelled seconds of the step's collectives, one after another
    predicted: float | None = None  # the model's seconds per step (comm_model.timeline)
    error: float | None = None  # its error relative to the measured step

    @property
    def nodes(self) -> int:
        return self.entry.nodes

    def speedup(self) -> tuple[float, float] | None:
        """(speedup, efficiency): the 1-node run's sec/epoch over this one's, and that / nodes."""
        if self.base is None or self.nodes == 1 or self.base.diverged or self.entry.diverged:
            return None
        speedup = self.base.median / self.entry.median
        return speedup, speedup / self.nodes

    @property
    def exposed(self) -> float | None:
        """The step's time over the 1-node step: communication the compute did not hide."""
        if self.step is None or self.compute is None or self.nodes == 1:
            return None
        return self.step - self.compute

    @property
    def overlap(self) -> float | None:
        """The modelled exchange less the exposed time (>= 0): what the compute hid."""
        if self.comm is None or self.exposed is None:
            return None
        return max(0.0, self.comm - self.exposed)


def analyse(e: Entry, base: Entry | None, fits: dict) -> Cell:
    cell = Cell(e, base, step_seconds(e), step_seconds(base), measured_bytes(e))
    n, grad = e.nodes, e.rec.extra.get("gradient_bytes")
    if n == 1 or grad is None:
        return cell
    counted = e.rec.extra.get("step_collectives")  # lesson 4's: the step's own collectives
    ring = counted and not any(c["op"] in ("push", "pull") for c in counted)
    cell.bytes_model = cm.collective_link_bytes(n, counted) if ring else cm.link_bytes(n, grad)
    if pieces := measured_exchange(e, fits):
        cell.comm = sum(t for t, _ in pieces)
        if cell.compute is not None:
            cell.predicted = cm.timeline(cell.compute, pieces)
    if cell.predicted is not None and cell.step is not None:
        cell.error = cm.relative_error(cell.predicted, cell.step)
    return cell


def cells_of(entries: list[Entry], fits: dict) -> list[Cell]:
    """Every run of one workload with its engine's newest 1-node run (one of one device per node
    has no +sync-bn: the same math), in the table's order: framework, engine, the 1-node run
    first, then by link and node count. `fits`: compare.collectives.fits of the same files."""
    bases: dict[Engine, Entry] = {}
    for e in sorted(entries, key=lambda e: (e.time, e.order)):
        if e.nodes == 1:
            bases[engine_of(e)] = e
    cells = []
    for e in entries:
        engine = engine_of(e)
        base = bases.get(engine) or bases.get(replace(engine, sync_bn=False))
        cells.append(analyse(e, base, fits))

    def order(cell: Cell) -> tuple:
        e, rate = cell.entry, link(cell.entry).get("rate_bps")
        fw = FRAMEWORK_ORDER.index(e.rec.framework) if e.rec.framework in FRAMEWORK_ORDER else 99
        return (
            fw,
            str(engine_of(e)),
            e.nodes > 1,
            rate is not None,
            -(rate or 0),
            e.nodes,
            e.order,
        )

    return sorted(cells, key=order)
