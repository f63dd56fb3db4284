"""The all-reduce records of `make collectives` (cluster/allreduce.py): each engine's all-reduce
alone, measured as nccl-tests measures NCCL's, read from the results files, fitted to the classic
cost model t(S) = alpha + (2(n - 1)/n) S / busbw, and shown as a fit table and a log-log plot.
The fits are the step model's input too (compare/scaling.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from common import collectives, results
from compare.records import FRAMEWORK_ORDER

FIT_PASSES = 20  # the reweighted fit's passes: it settles within a few
BANDWIDTH_SHARE = 0.05  # a fitted bandwidth needs sizes whose bytes take this share of a time


def load(paths, warnings: list[str] | None = None) -> list[dict]:
    """The all-reduce records in `paths` (their other lines are the training report's). A
    record without its fields is left out with file:line in `warnings`."""
    out = []
    for path in map(Path, [paths] if isinstance(paths, (str, Path)) else paths):
        if not path.is_file():
            continue  # the training report names a missing file
        with path.open("rb") as f:
            for number, raw in enumerate(f, start=1):
                try:
                    data = json.loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, ValueError, RecursionError):
                    continue  # the training report names the file's bad lines
                if not isinstance(data, dict) or data.get("workload") != "allreduce":
                    continue
                if problem := _problem(data):
                    if warnings is not None:
                        warnings.append(f"{path}:{number}: all-reduce record left out ({problem})")
                    continue
                try:
                    out.append(results.printable(data))
                except results.ResultsError as e:
                    if warnings is not None:
                        warnings.append(f"{path}:{number}: all-reduce record left out ({e})")
    return out


def _problem(rec: dict) -> str | None:
    if rec.get("framework") not in FRAMEWORK_ORDER:
        return "unknown framework"
    if not isinstance(rec.get("ranks"), int) or rec["ranks"] < 2:
        return "ranks must be a whole number >= 2"
    rows = rec.get("rows")
    if not isinstance(rows, list) or not rows:
        return "no rows"
    for r in rows:
        ok = isinstance(r, dict) and all(
            isinstance(r.get(k), (int, float)) and math.isfinite(r[k]) and r[k] > 0
            for k in ("bytes", "time_s")
        )
        if not ok:
            return "a row without positive bytes and time_s"
    return None


# --- the cost model ---------------------------------------------------------------------------


def fit(rows: list[dict], ranks: int) -> tuple[float, float | None, float]:
    """(alpha s, busbw B/s, median relative error) of t = alpha + f S / busbw, f = 2(n - 1)/n,
    fitted to the rows by least squares of the error relative to the model (a 4 B and a 64 MiB
    time differ by orders of magnitude: absolute errors would fit the largest sizes only;
    relative to the time measured, one size far faster than the rest, as gloo's 4 B can be,
    would pull alpha below every other small size). Iteratively reweighted: each pass weighs
    a size by 1 / the last pass's model. alpha >= 0; busbw None where the sizes never left the
    latency (their bytes are < 5% of any time)."""
    size = np.array([r["bytes"] for r in rows], dtype=float)
    t = np.array([r["time_s"] for r in rows], dtype=float)
    model = t
    for _ in range(FIT_PASSES):
        alpha, per_byte = _weighted(size, t, 1 / model)
        model = np.maximum(alpha + per_byte * size, t.min() * 1e-3)
    error = float(np.median(np.abs(alpha + per_byte * size - t) / t))
    if per_byte * size.max() < BANDWIDTH_SHARE * t[size.argmax()]:
        return float(alpha), None, error
    return float(alpha), collectives.bus_factor(ranks) / per_byte, error


def _weighted(size, t, weight) -> tuple[float, float]:
    """alpha >= 0 and seconds per byte >= 0 minimising sum((weight (alpha + b S - t))^2)."""
    design = np.stack([np.ones_like(size), size], axis=1) * weight[:, None]
    (alpha, per_byte), *_ = np.linalg.lstsq(design, t * weight, rcond=None)
    if alpha < 0:  # no negative latency: the slope alone
        alpha, per_byte = 0.0, float(np.sum(size * weight**2 * t) / np.sum((size * weight) ** 2))
    return float(alpha), max(float(per_byte), 0.0)


def fit_text(alpha: float, busbw: float | None, error: float) -> str:
    bandwidth = f"busbw {busbw / 1e9:.3g} GB/s" if busbw else "latency-bound at every size"
    return f"alpha {alpha * 1e6:.0f} us, {bandwidth} (median error of the fit {error:.0%})"


# --- the report's section -----------------------------------------------------------------------


def fits(records: list[dict]) -> dict[tuple, tuple[float, float]]:
    """The step model's inputs (compare.scaling): fit_key -> (alpha s, busbw B/s) of each
    newest run whose sizes reached a bandwidth."""
    out = {}
    for rec in latest(records):
        alpha, busbw, _ = fit(rec["rows"], rec["ranks"])
        if busbw is not None:
            link = rec.get("link", {}).get("name", "loopback")
            key = fit_key(rec["framework"], rec["ranks"], link, rec.get("hardware", {}))
            out[key] = (alpha, busbw)
    return out


def fit_key(framework: str, ranks: int, link: str | None, hardware) -> tuple:
    """An engine over a link on a machine: a training run's and an all-reduce run's alike."""
    cpu = hardware.get("cpu") if isinstance(hardware, dict) else None
    return framework, ranks, link, cpu


def setting(rec: dict) -> str:
    """Where a run ran: its rank count and link."""
    link = rec.get("link", {}).get("name", "loopback")
    where = "loopback, shared cores" if link == "loopback" else f"link {link}"
    return f"{rec['ranks']} ranks, {where}"


def latest(records: list[dict]) -> list[dict]:
    """The newest record of each (framework, ranks, link, machine), in a stable order."""
    cells = {}
    for rec in sorted(records, key=lambda r: str(r.get("timestamp"))):
        machine = rec.get("hardware", {}).get("cpu"), rec.get("platform")
        cells[(rec["framework"], setting(rec), machine)] = rec
    return sorted(cells.values(), key=_order)


def _order(rec: dict) -> tuple:
    """By engine, then loopback before links, faster links first, then by rank count."""
    link = rec.get("link", {})
    fw = FRAMEWORK_ORDER.index(rec["framework"])
    return (fw, link.get("name") != "loopback", -(link.get("rate_bps") or math.inf), rec["ranks"])


def fit_table(records: list[dict]):
    from compare.tables import Table  # pandas: the report's, not the benchmark's

    rows = []
    for rec in records:
        alpha, busbw, error = fit(rec["rows"], rec["ranks"])
        big = max(rec["rows"], key=lambda r: r["bytes"])
        rows.append(
            [
                rec["framework"],
                rec.get("collective", ""),
                setting(rec),
                f"{alpha * 1e6:.0f}",
                f"{busbw / 1e9:.3g}" if busbw else "-",
                f"{error:.0%}",
                f"{big['busbw_Bps'] / 1e9:.3g} at {_size(big['bytes'])}",
            ]
        )
    headers = ["engine", "collective", "where", "alpha (us)", "fitted busbw (GB/s)"]
    headers += ["median error", "measured busbw (GB/s)"]
    return Table("the all-reduce's cost model, fitted", headers, rows, [FIT_NOTE])


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


FIT_NOTE = (
    "alpha and busbw: the least-squares fit, in error relative to the model, of t = alpha + "
    "2(n-1)/n x size / busbw to every size of the run; median error: half the sizes are within "
    "it. busbw = algbw x 2(n-1)/n as nccl-tests defines it (what each link carries in a ring); "
    "MXNet's parameter server moves other bytes (every worker pushes and pulls the whole buffer "
    "through the servers), so its busbw is the ring's yardstick, not its links' load."
)


def plot(path: Path, records: list[dict], metadata: dict | None = None) -> Path | None:
    """Time against size, log-log, a panel per engine and a line per setting; `metadata`: the
    PNG's text chunks."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    engines = [fw for fw in FRAMEWORK_ORDER if any(r["framework"] == fw for r in records)]
    if not engines:
        return None
    fig = Figure(figsize=(4.2 * len(engines), 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(engines), sharey=True, squeeze=False)[0]
    for ax, fw in zip(axes, engines, strict=True):
        mine = [r for r in records if r["framework"] == fw]
        for i, rec in enumerate(mine):
            rows = sorted(rec["rows"], key=lambda r: r["bytes"])
            x, y = [r["bytes"] for r in rows], [r["time_s"] for r in rows]
            ax.loglog(x, y, marker="osD^vP*X"[i % 8], ms=3, lw=1, label=setting(rec))
        ax.set_title(f"{fw}: {mine[0].get('collective', '')}", fontsize=9)
        ax.set_xlabel("bytes per rank")
        ax.grid(True, which="both", lw=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("seconds per all-reduce")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata=metadata)
    return path


def section(doc, records: list[dict], out: Path) -> None:
    """The report's section on the all-reduce records: the fits and the plot of every size."""
    if not records:
        return
    records = latest(records)
    doc.heading(2, "Each engine's all-reduce, measured as nccl-tests measures NCCL's")
    doc.para(
        "Every rank is a node of one device (python -m <framework>_impl --workload allreduce "
        "--nnodes N): torch's dist.all_reduce over gloo, a jitted psum across JAX processes, "
        "MXNet's kvstore pushpull under dist_sync with a server on every node. On loopback the "
        "ranks share the machine's cores; over a link each node has a core of its own."
    )
    doc.table(fit_table(records))
    if drawn := plot(Path(out) / "collectives.png", records):
        doc.image(drawn, "time per all-reduce against its size, per engine (log-log)")
