"""`python -m common.traces DIR`: --profile's Chrome traces (common/profiling.py), the same way
for the three frameworks. Per trace its span and, per process (the host; a GPU, whose threads are
its streams) and thread, how long something ran there and the events with the most self time. A
GPU busy for most of the span runs its kernels back to back; one that idles waits for the host:
the question a loop slower than its ceiling asks. Perfetto opens the same files whole.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from common import processes

SUFFIXES = (".json", ".json.gz")
EXIT_BAD_INPUT = 2


@dataclass(frozen=True)
class Event:
    process: str
    thread: str
    name: str
    start: float  # microseconds, as Chrome traces count
    end: float
    category: str = ""  # Chrome's "cat": torch's "kernel" for a GPU kernel, say


def load(path: Path) -> list[dict]:
    """The events of a Chrome trace: an object with `traceEvents`, or a bare list."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            trace = json.load(f)
    except (OSError, EOFError, ValueError) as e:
        raise ValueError(f"{path}: not a readable Chrome trace ({e})") from None
    return trace.get("traceEvents", []) if isinstance(trace, dict) else trace


def events(raw: list[dict]) -> list[Event]:
    """Complete events ("X") and "B"/"E" pairs matched per thread, named by the metadata; no
    instants, counters or async events (no duration on a thread)."""
    processes, threads = {}, {}
    for e in raw:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            processes[e.get("pid")] = str(e.get("args", {}).get("name", ""))
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e.get("pid"), e.get("tid"))] = str(e.get("args", {}).get("name", ""))
    out, open_ = [], defaultdict(list)

    def event(e, start, end):
        pid, tid = e.get("pid"), e.get("tid")
        process = processes.get(pid) or f"pid {pid}"
        thread = threads.get((pid, tid)) or f"tid {tid}"
        return Event(process, thread, str(e.get("name", "")), start, end, str(e.get("cat", "")))

    for e in raw:
        phase, stack = e.get("ph"), open_[(e.get("pid"), e.get("tid"))]
        if e.get("cat") == "Trace":  # torch.profiler's envelope around the whole trace
            continue
        if phase == "X" and "dur" in e:
            out.append(event(e, float(e["ts"]), float(e["ts"]) + float(e["dur"])))
        elif phase == "B":
            stack.append(e)
        elif phase == "E" and stack:
            begin = stack.pop()
            out.append(event(begin, float(begin["ts"]), float(e["ts"])))
    return out


def busy(evs: list[Event]) -> float:
    """Microseconds in which at least one of `evs` ran: the union of their intervals."""
    total, reach = 0.0, float("-inf")
    for e in sorted(evs, key=lambda e: e.start):
        if e.end > reach:
            total += e.end - max(e.start, reach)
            reach = e.end
    return total


def at_once(groups: list[list[Event]]) -> float:
    """Microseconds in which two or more of `groups` (a process's events each) were busy at
    the same time: whether devices that a framework may run together did."""
    edges = []
    for evs in groups:
        reach = float("-inf")
        for e in sorted(evs, key=lambda e: e.start):  # each group's union, as `busy` counts it
            if e.end > reach:
                edges += [(max(e.start, reach), 1), (e.end, -1)]
                reach = e.end
    total, running, last = 0.0, 0, 0.0
    for time, step in sorted(edges):
        if running >= 2:
            total += time - last
        running, last = running + step, time
    return total


def self_times(evs: list[Event]) -> dict[str, tuple[float, int]]:
    """{name: (self microseconds, calls)} on one thread: an event's time less that of the
    events nested directly inside it."""
    totals: dict[str, list] = defaultdict(lambda: [0.0, 0])
    stack: list[tuple[Event, list]] = []
    for e in sorted(evs, key=lambda e: (e.start, -e.end)):
        while stack and not (stack[-1][0].start <= e.start and e.end <= stack[-1][0].end):
            stack.pop()
        entry = totals[e.name]
        entry[0] += e.end - e.start
        entry[1] += 1
        if stack:
            stack[-1][1][0] -= e.end - e.start  # the parent's self time loses the child's
        stack.append((e, entry))
    return {name: (t, n) for name, (t, n) in totals.items()}


def summary(path: Path, top: int = 5) -> str:
    """The trace's span, then its busiest processes and threads with their top events."""
    evs = events(load(path))
    if not evs:
        return f"{path.name}: no timed events"
    span = max(e.end for e in evs) - min(e.start for e in evs)
    lines = [f"{path.name}: {len(evs)} events over {span / 1e3:.1f} ms"]
    by_process = _busiest(evs, lambda e: e.process, top)
    if len(by_process) > 1:
        both = at_once([pevs for _, pevs, _ in by_process])
        lines.append(f"  two or more processes busy at once: {_share(both, span)}")
    for process, pevs, pbusy in by_process:
        lines.append(f"  {process}: busy {_share(pbusy, span)}")
        for thread, tevs, tbusy in _busiest(pevs, lambda e: e.thread, top):
            lines.append(f"    {thread}: busy {_share(tbusy, span)}, {len(tevs)} events")
            ranked = sorted(self_times(tevs).items(), key=lambda kv: -kv[1][0])[:top]
            lines += [f"      {t / 1e3:9.2f} ms {n:7d}x  {_short(k)}" for k, (t, n) in ranked]
    return "\n".join(lines)


def _busiest(evs: list[Event], key, top: int) -> list[tuple[str, list[Event], float]]:
    """The `top` groups of `evs` by `key` (a process, a thread), busiest first, with their
    events and busy time."""
    groups = defaultdict(list)
    for e in evs:
        groups[key(e)].append(e)
    ranked = sorted(((k, g, busy(g)) for k, g in groups.items()), key=lambda kgb: -kgb[2])
    return ranked[:top]


def _share(part: float, span: float) -> str:
    return f"{part / 1e3:.1f} ms ({100 * part / span:.0f}% of the span)"


def _short(name: str, width: int = 72) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def traces(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith(SUFFIXES))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m common.traces", description="Summarise --profile's Chrome traces."
    )
    p.add_argument("directory", type=Path, help="the folder a run's --profile wrote")
    p.add_argument("--top", type=int, default=5, help="processes, threads and events shown")
    args = p.parse_args(argv)
    try:
        if not args.directory.is_dir():
            raise ValueError(f"{args.directory}: no such folder; name a run's --profile folder")
        found = traces(args.directory)
        if not found:
            raise ValueError(f"{args.directory}: no traces (*.json, *.json.gz); run with --profile")
        print("\n\n".join(summary(path, max(args.top, 1)) for path in found))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(processes.quiet_when_reader_stops(main))
