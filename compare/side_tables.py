"""The tables beside the comparison tables: peak memory and utilisation per run, and the
terminal's view of the main tables (one line per row and device count)."""

from __future__ import annotations

from compare.tables import (
    DASH,
    DpRow,
    Table,
    acc_of,
    cores_text,
    fmt_acc,
    fmt_rate,
    time_cell,
)

# --- other measurements (memory, utilisation) -----------------------------------------------------


def extras_table(title: str, rows: list[DpRow]) -> Table | None:
    """Peak memory and utilisation (per device or process), where the runs recorded them."""
    body = []
    for row in rows:
        for n, e in sorted(row.cells.items()):
            extra = e.rec.extra
            mem, util = extra.get("peak_memory_bytes"), extra.get("utilization")
            if mem is None and util is None:
                continue
            source = extra.get("utilization_source") or DASH
            if extra.get("memory_source"):
                source += f"; memory: {extra['memory_source']}"
            cells = [row.framework, row.label, cores_text(row), str(n)]
            body.append([*cells, fmt_memory(mem), fmt_percent(util), source])
    if not body:
        return None
    headers = ["framework", "strategy", "cores/device", "devices"]
    headers += ["peak memory (MiB)", "utilization (%)", "source"]
    return Table(title, headers, body, ["Several values: one per device or process."])


def fmt_percent(x) -> str:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return f"{x:.0f}"
    if isinstance(x, list):
        return " / ".join(fmt_percent(v) for v in x)
    return DASH if x is None else str(x)


def fmt_memory(x) -> str:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return f"{x / 2**20:,.0f}"
    if isinstance(x, list):
        return " / ".join(fmt_memory(v) for v in x)
    return DASH if x is None else str(x)


# --- the terminal: the same figures, one line per row and device count ----------------------------


def dp_terminal(rows: list[DpRow]) -> Table:
    headers = [
        "framework",
        "strategy",
        "cores/device",
        "devices",
        "test acc",
        "sec/epoch",
        "images/s",
        "speedup",
        "efficiency",
    ]
    body = []
    for row in rows:
        for n, e in sorted(row.cells.items()):
            star = e.rec.extrapolated
            body.append(
                [
                    row.framework,
                    row.label,
                    cores_text(row),
                    str(n),
                    fmt_acc(acc_of(e)),
                    time_cell(e),
                    fmt_rate(None if e.diverged else e.rec.images_per_sec, star),
                    row.scaling_cell(n) if n > 1 else DASH,
                    row.scaling_cell(n, efficiency=True) if n > 1 else DASH,
                ]
            )
    return Table("terminal", headers, body)


def r50_terminal(table: Table) -> Table:
    keep = [i for i, h in enumerate(table.headers) if h not in ("platform", "preset", "env")]
    return Table(
        "terminal",
        [table.headers[i] for i in keep],
        [[row[i] for i in keep] for row in table.rows],
    )
