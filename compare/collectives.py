"""`python -m compare.collectives --frameworks torch jax mxnet --ranks 2 4 8 --links unlimited
1gbit`: each engine's all-reduce alone (`<framework>_impl/allreduce.py`), measured the way
nccl-tests measures NCCL's (common/collectives.py), and the fit of the classic cost model
t(S) = alpha + (2(n - 1)/n) S / busbw to each run.

Every rank is a node of its own, started with the command a user types on a machine of a
cluster (`python -m <framework>_impl --workload allreduce --gpus 1 --nnodes N --node-rank R
--rdzv-endpoint HOST:PORT`), so that the three engines run the same topology: torchrun's c10d
rendezvous and a gloo ring, JAX processes under one coordinator, and ps-lite with a server on
every node. `--ranks`: N nodes on this machine's loopback, sharing its cores (a collective
needs little compute; the records say so). `--links`: 2 nodes, each on a core of its own, in the
cluster in one box (compare/cluster.py) at each link rate.

The records go to --results (one line per run, `workload: allreduce`, which the training
report leaves to this module); `report` turns them into tables, fits and a log-log plot.
"""

from __future__ import annotations

import argparse
import json
import math
import socket
import sys
import tempfile
from pathlib import Path

import numpy as np

from common import collectives, config, cores, netns, results, signals, supervise
from compare import cluster

PORT = cluster.PORT
FIT_PASSES = 20  # the reweighted fit's passes: it settles within a few
BANDWIDTH_SHARE = 0.05  # a fitted bandwidth needs sizes whose bytes take this share of a time
TIMEOUT_S = 900.0  # one run, all its sizes; a lost peer ends it sooner (--peer-timeout)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m compare.collectives", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--frameworks", nargs="+", default=list(cluster.ENGINES), choices=cluster.ENGINES
    )
    p.add_argument("--ranks", nargs="*", type=int, default=[2, 4, 8], help="loopback rank counts")
    p.add_argument("--links", nargs="*", default=[], help="2 nodes at each: unlimited, 1gbit, ...")
    p.add_argument("--preset", default="cpu", choices=config.PRESETS)
    p.add_argument("--results", default=str(results.DEFAULT_PATH))
    p.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per run")
    p.add_argument("--venv", default=str(cluster.ROOT / ".venv"))
    p.add_argument("--python", default=None, help="one interpreter for every framework")
    return p


def check(args) -> None:
    """Every setting before anything starts: one line for the first that is wrong."""
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise config.ConfigError(f"--timeout must be a number of seconds > 0, got {args.timeout}")
    if any(n < 2 for n in args.ranks):
        raise config.ConfigError(f"--ranks must each be at least 2, got {args.ranks}")
    if not args.ranks and not args.links:
        raise config.ConfigError("nothing to run: give --ranks, --links or both")
    for rate in args.links:
        netns.rate_bps(rate)
    if args.links:
        if len(cores.allowed()) < 2:
            raise config.ConfigError("--links runs 2 nodes of a core each: this machine gives 1")
        netns.check_can_make()
    results.check_writable(args.results)


def node_command(fw: str, node: int, nodes: int, host: str, port: int, out: Path, args):
    python = args.python or str(Path(args.venv) / fw / "bin" / "python")
    cmd = [python, "-m", f"{fw}_impl", "--workload", "allreduce", "--gpus", "1"]
    cmd += ["--platform", "cpu", "--preset", args.preset, "--no-progress", "--results", str(out)]
    return cmd + [
        "--nnodes",
        str(nodes),
        "--node-rank",
        str(node),
        "--rdzv-endpoint",
        f"{host}:{port}",
    ]


def run_nodes(fw: str, nodes: int, args, net: netns.Network | None) -> dict:
    """One run of `nodes` ranks, all or nothing: the record rank 0 wrote."""
    where = f"link {net.rate}" if net else "loopback"
    what = f"{fw} all-reduce on {nodes} node(s), {where}"
    host = net.address(0) if net else "127.0.0.1"
    port = PORT if net else _free_port()
    with tempfile.TemporaryDirectory() as tmp, supervise.Group(what, prefix=True) as group:
        outs = [Path(tmp) / f"node{i}.jsonl" for i in range(nodes)]
        for i in range(nodes):
            cmd = node_command(fw, i, nodes, host, port, outs[i], args)
            pinned = cores.allowed()[i : i + 1] if net else None  # a core per node
            group.start(f"node {i}", cmd, cluster.node_env(), pinned, net.ns(i) if net else None)
        checks = [lambda: supervise.stopped_member(group)]
        if net:
            checks.append(net.link_problem)
        try:
            group.watch(checks, deadline=args.timeout, exit_wait=cluster.EXIT_WAIT_S)
        finally:
            group.stop(cluster.STOP_GRACE_S)
        written = [r for out in outs if out.is_file() for r in load(out)]
    if len(written) != 1:
        raise supervise.Failed(f"error: {what}: {len(written)} records written, expected one")
    rec = written[0]
    rec["nodes"] = nodes
    rec["link"] = {
        "name": net.rate if net else "loopback",
        "rate_bps": net and netns.rate_bps(net.rate),
    }
    rec["extra"]["cores"] = (
        "a core per node" if net else f"{nodes} ranks share {len(cores.allowed())} core(s)"
    )
    return rec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    if rec.get("framework") not in cluster.ENGINES:
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


def plan(args) -> list[tuple[str, int, str | None]]:
    """(framework, nodes, link) of every run: loopback rank counts, then 2 nodes per link."""
    runs = []
    for fw in args.frameworks:
        runs += [(fw, n, None) for n in sorted(args.ranks)]
        runs += [(fw, 2, rate) for rate in args.links]
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return cluster.ended(lambda: run_all(args))


def run_all(args) -> None:
    check(args)
    runs = plan(args)
    linked = cores.allowed()[:2] if args.links else []  # a cluster's cores: one run at a time
    with cores.held(linked, "collectives"), signals.as_interrupt():
        for i, (fw, nodes, rate) in enumerate(runs, start=1):
            print(f"[{i}/{len(runs)}] {fw} all-reduce, {nodes} nodes, {rate or 'loopback'}")
            if rate is None:
                rec = run_nodes(fw, nodes, args, None)
            else:
                with netns.Network(nodes, rate) as net:
                    rec = run_nodes(fw, nodes, args, net)
            results.append_line(rec, args.results)
            print(f"[{i}/{len(runs)}] ok: {fit_text(*fit(rec['rows'], rec['ranks']))}", flush=True)


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
    order = list(cluster.ENGINES)
    return sorted(cells.values(), key=lambda r: (order.index(r["framework"]), _order(r)))


def _order(rec: dict) -> tuple:
    link = rec.get("link", {})
    return (link.get("name") != "loopback", -(link.get("rate_bps") or math.inf), rec["ranks"])


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


def size_table(title: str, records: list[dict]):
    """Time (us) and busbw (GB/s) per size, a column pair per engine."""
    from compare.tables import Table

    sizes = sorted({r["bytes"] for rec in records for r in rec["rows"]})
    headers = ["size"]
    for rec in records:
        headers += [f"{rec['framework']} time (us)", f"{rec['framework']} busbw (GB/s)"]
    rows = []
    for nbytes in sizes:
        line = [_size(nbytes)]
        for rec in records:
            r = next((r for r in rec["rows"] if r["bytes"] == nbytes), None)
            line += ["-", "-"] if r is None else [_us(r["time_s"]), f"{r['busbw_Bps'] / 1e9:.3g}"]
        rows.append(line)
    return Table(title, headers, rows)


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def _us(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:.3g}" if us < 1000 else f"{us:,.0f}"


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

    engines = [fw for fw in cluster.ENGINES if any(r["framework"] == fw for r in records)]
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
    """The report's section on the all-reduce records: the fits, a table per setting, the plot."""
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
    for where in dict.fromkeys(setting(r) for r in records):
        doc.heading(3, f"All-reduce, {where}")
        doc.table(size_table(where, [r for r in records if setting(r) == where]))
    if drawn := plot(Path(out) / "collectives.png", records):
        doc.image(drawn, "time per all-reduce against its size, per engine (log-log)")


if __name__ == "__main__":
    sys.exit(signals.main(main))
