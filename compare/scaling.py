"""Scaling across nodes: each run of the cluster in one box (extra.nodes) set against its
engine's 1-node run and against the alpha-beta model of compare/comm_model.py.

Per step, not per epoch: seconds per step = batch_size / images_per_sec. images_per_sec is the
timed epochs' images over their seconds (common/training.py, EpochLog), and every step of a
bounded epoch (the scaling runs') is a whole batch, so this is exactly the timed seconds over
the timed steps; over whole epochs, whose last batch is smaller, it is the mean step within
that batch's share. extra.link_bytes counts the same timed epochs, so its bytes per step
((tx + rx) / 2 / steps, one direction's mean) are of the same steps. A record's batch_size and
devices are the whole cluster's, all nodes together.

A run's engine is its framework and tier (the label past the strategy: +bf16, +compiled), and
its BatchNorm (+sync-bn), at the same cores per device, preset, batch per device and devices per
node: the 1-node run of an engine may train with another strategy than its runs on several nodes
(MXNet's gluon, where several nodes need kvstore dist and its servers), and on one device
BatchNorm is the same either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from common import flops
from compare import comm_model as cm
from compare.records import FRAMEWORK_ORDER, Entry
from compare.tables import DASH, decimals

# Which exchange a framework's strategy makes, to choose the model's formulas; the record's
# extra.engine text is read only for a strategy not listed here.
ALGORITHMS = {
    ("torch", "ddp"): cm.RING,
    ("jax", "sharding"): cm.RING,
    ("jax", "shard_map"): cm.RING,
    ("jax", "pmap"): cm.RING,
    ("mxnet", "dist"): cm.PS,
}
BUCKETED = {("torch", "ddp")}  # DDP all-reduces its gradient in buckets of DDP_BUCKET_BYTES
LAYERS = {"lenet": flops.lenet_layers, "resnet18": flops.resnet18_layers}  # layers with weights


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


def algorithm(e: Entry) -> str | None:
    """The exchange the run's engine makes (comm_model.RING or PS), or None (not known)."""
    known = ALGORITHMS.get((e.rec.framework, e.rec.strategy))
    if known is not None:
        return known
    text = str(e.rec.extra.get("engine") or "").lower()
    if "parameter server" in text:
        return cm.PS
    return cm.RING if "all-reduce" in text or "allreduce" in text else None


def step_seconds(e: Entry | None) -> float | None:
    """Seconds per step over the timed epochs (the module's docstring), or None."""
    if e is None or e.diverged or not e.rec.images_per_sec:
        return None
    return e.rec.batch_size / e.rec.images_per_sec


def measured_bytes(e: Entry) -> float | None:
    """Bytes node 0's link carried per step, the mean of the two directions; None on one
    node, which has no link: what its interface counts there is stray packets, not training."""
    counts = e.extra.get("link_bytes")
    if e.nodes == 1 or not isinstance(counts, dict):
        return None
    return (counts["tx"] + counts["rx"]) / 2 / counts["steps"]


def link(e: Entry) -> dict:
    value = e.extra.get("link")
    return value if isinstance(value, dict) else {}


@dataclass
class Cell:
    """One cluster run, and what the model says of it (None: cannot be worked out)."""

    entry: Entry
    base: Entry | None  # the engine's 1-node run
    step: float | None = None  # measured seconds per step
    compute: float | None = None  # the 1-node run's seconds per step
    bytes_measured: float | None = None
    bytes_model: float | None = None
    comm: float | None = None  # modelled seconds of the exchange per step
    tail: float | None = None  # the part of it that cannot overlap the backward
    predicted: dict[str, float] = field(default_factory=dict)  # model -> seconds per step
    errors: dict[str, float] = field(default_factory=dict)  # model -> relative error

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


def analyse(e: Entry, base: Entry | None) -> Cell:
    cell = Cell(e, base, step_seconds(e), step_seconds(base), measured_bytes(e))
    alg, n, grad = algorithm(e), e.nodes, e.rec.extra.get("gradient_bytes")
    if n == 1 or alg is None or grad is None:
        return cell
    cell.bytes_model = cm.link_bytes(alg, n, grad)
    bits = link(e).get("measured_bps")
    if not bits:
        return cell
    bandwidth, alpha = bits / 8, link(e).get("latency_s") or 0.0
    bucket = cm.DDP_BUCKET_BYTES if (e.rec.framework, e.rec.strategy) in BUCKETED else None
    cell.comm = cm.comm_time(alg, n, grad, bandwidth, alpha, cm.pieces(grad, bucket))
    share = cm.tail_share(grad, bucket, layers(e.rec.workload))
    cell.tail = cm.comm_time(alg, n, share * grad, bandwidth, alpha)
    if cell.compute is not None:
        cell.predicted = {m: cm.step_time(m, cell.compute, cell.comm, cell.tail) for m in cm.MODELS}
    if cell.predicted and cell.step is not None:
        cell.errors = {m: cm.relative_error(t, cell.step) for m, t in cell.predicted.items()}
    return cell


def layers(workload: str) -> int | None:
    count = LAYERS.get(workload)
    return None if count is None else len(count())


def cells_of(entries: list[Entry]) -> list[Cell]:
    """Every run of one workload with its engine's 1-node run (the newest), in the table's
    order: framework, engine, the 1-node run first, then by link and node count."""
    bases: dict[Engine, Entry] = {}
    for e in sorted(entries, key=lambda e: (e.time, e.order)):
        if e.nodes == 1:
            bases[engine_of(e)] = e
    cells = [analyse(e, base_of(engine_of(e), bases)) for e in entries]
    return sorted(cells, key=order)


def base_of(engine: Engine, bases: dict[Engine, Entry]) -> Entry | None:
    """The engine's 1-node run: one of one device per node has no +sync-bn (the same math)."""
    return bases.get(engine) or bases.get(replace(engine, sync_bn=False))


def order(cell: Cell) -> tuple:
    e = cell.entry
    rate = link(e).get("rate_bps")
    fw = e.rec.framework
    rank = FRAMEWORK_ORDER.index(fw) if fw in FRAMEWORK_ORDER else 99
    engine = engine_of(e)
    return (rank, str(engine), e.nodes > 1, rate is not None, -(rate or 0), e.nodes, e.order)


def choices(cells: list[Cell]) -> dict[Engine, str | None]:
    """Per engine, the model with the smaller mean |error| over its runs on several nodes, if
    that is within comm_model.MODEL_LIMIT (one model for all of an engine's links)."""
    errors: dict[Engine, list[dict[str, float]]] = {}
    for c in cells:
        if c.errors:
            errors.setdefault(engine_of(c.entry), []).append(c.errors)
    return {engine: cm.choose(errs) for engine, errs in errors.items()}


# --- formatting -----------------------------------------------------------------------------------


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


def fmt_error(x: float) -> str:
    """`+3.2%`, `-15%`: a tenth of a percent below 10%, where a model's fit is judged."""
    percent = 100 * x
    return f"{percent:+.1f}%" if abs(percent) < 10 else f"{percent:+.0f}%"


def fmt_model(cell: Cell, model: str | None) -> str:
    """`0.523 s (+3%)`: a model's step and its error against the measured step."""
    if model is None or model not in cell.predicted:
        return DASH
    error = cell.errors.get(model)
    return fmt_seconds(cell.predicted[model]) + ("" if error is None else f" ({fmt_error(error)})")


def link_text(e: Entry) -> str:
    """`1gbit (measured 941 Mbit/s, 52 µs)`; the 1-node run's link carries nothing."""
    if e.nodes == 1:
        return f"{e.link_name or DASH} (1 node)"
    info = link(e)
    latency = info.get("latency_s")
    said = [f"measured {fmt_bits(info.get('measured_bps'))}"]
    if latency is not None:
        said.append(f"{latency * 1e6:.0f} µs")
    return f"{e.link_name} ({', '.join(said)})"
