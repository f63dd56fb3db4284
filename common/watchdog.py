"""A process of a run over several processes ends itself when the run stops moving: a peer or
the link to it is gone, and an engine may wait for it for good (ps-lite has no timeout at all;
XLA's and gloo's take minutes). Then one line, and the process ends (docs/design.md, "Traps").

The bound is about liveness, not speed: a healthy run is never ended because a step, a compile
or an evaluation is slow. The harness beats as it hands out each batch of the warm-up and the
epochs, at each evaluation batch and record (common/harness.py), the all-reduce benchmark
before each all-reduce (`beating`); each beat says what begins (`kind`). What begins may take
`--peer-timeout` seconds (default 45, and a margin), or FACTOR times the longest of its kind so
far, whichever is longer; the first of a kind, FACTOR times the longest of any kind (the first
timed step, the warm-up's step: its compile included). The warm-up compiles (XLA,
TorchInductor), which can take minutes on a CPU: it has WARM_UP_S. And a process that computes
all the while (its CPU time grows: a compile, a step on a crowded machine) is moving, however
long it takes; one that waits for a peer that is gone waits idle. After the record the bound
still holds: the exit barrier, where every process waits for the others, is bounded too.
Framework-free; one per process.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time

from common import supervise

PEER_TIMEOUT_S = 45  # --peer-timeout's default
PEER_TIMEOUT_ENV = "MULTIDEVICE_PEER_TIMEOUT"  # --peer-timeout, to every process a run starts
MARGIN_S = 10  # past an engine's own bound of --peer-timeout, whose line names more
WARM_UP_S = 600  # the bound until the first timed step: compilations
# A step may take this many times the longest one seen: a shared machine's speed drifts by tens
# of percent within minutes, and a neighbour's work can halve it twice.
FACTOR = 4
BUSY = 0.25  # of a core: a process computing at least this much is not waiting for a peer
WARM, STEP, EVAL, END = "warm-up", "step", "evaluation", "record"  # what a beat begins
LOST = "lost another process of the run, or the link to it"


def peer_timeout() -> int:
    """The bound this run was given (PEER_TIMEOUT_ENV, which cli.start sets from --peer-timeout
    and every process it starts inherits), else the default."""
    given = os.environ.get(PEER_TIMEOUT_ENV, "")
    return int(given) if given.isdigit() and int(given) > 0 else PEER_TIMEOUT_S


class Progress:
    """Beats (`beat`) watched by a daemon thread; a silence longer than `allowed` ends the
    process with `line` (exit 1): left for the launcher where there is one
    (supervise.ERROR_FILE_ENV), else on stderr. `peer`: --peer-timeout; the least silence
    allowed is that and a margin (MARGIN_S, at most `peer` again: a small one stays small)."""

    def __init__(self, peer: float, line: str = LOST):
        self.peer, self.bound, self.line = peer, peer + min(MARGIN_S, peer), line
        self.now = (None, time.monotonic())  # (what began, when): one tuple, read whole
        self.longest: dict[str | None, float] = {}  # of each kind: the longest it took
        threading.Thread(target=self._watch, name="progress-watch", daemon=True).start()

    def beat(self, kind: str = STEP) -> None:
        """What was under way ended, and `kind` begins."""
        began, last = self.now
        now = time.monotonic()
        self.longest[began] = max(self.longest.get(began, 0.0), now - last)
        self.now = (kind, now)

    def allowed(self, kind: str | None) -> float:
        """The silence allowed to `kind` under way: the bound, or FACTOR x the longest of its
        kind (the first of a kind: of any kind); the warm-up, WARM_UP_S."""
        if kind == WARM:
            return max(self.bound, WARM_UP_S)
        seen = self.longest.get(kind) or max(self.longest.values(), default=0.0)
        return max(self.bound, FACTOR * seen)

    def _watch(self) -> None:
        looked = (time.monotonic(), time.process_time())
        while True:
            kind, last = self.now
            now, cpu = time.monotonic(), time.process_time()
            silence, limit = now - last, self.allowed(kind)
            computing = cpu - looked[1] >= BUSY * (now - looked[0])  # since the last look
            if silence > limit and not computing:
                break
            looked = (now, cpu)
            time.sleep(min(1.0, max(0.5, self.bound / 4)))  # CPU time: over half a second
        line = (
            f"error: {self.line}: the run has not moved for {round(limit, 1):g} s (--peer-timeout "
            f"{self.peer:g} s, or {FACTOR} x its longest {kind or STEP})"
        )
        if not supervise.note(supervise.ERROR_FILE_ENV, f"1 {line}\n"):
            print(line, file=sys.stderr, flush=True)
        supervise.note(supervise.DONE_FILE_ENV, "1\n")
        os._exit(1)


def armed(processes: int) -> Progress | None:
    """A watchdog for a process of a run of several `processes` (None: alone, nothing to lose)."""
    return Progress(peer_timeout()) if processes > 1 else None


def beating(call, progress: Progress | None):
    """`call`, each call a beat of `progress` (a step of the all-reduce benchmark)."""
    if progress is None:
        return call

    @functools.wraps(call)
    def beat_first(*args, **kwargs):
        progress.beat(STEP)
        return call(*args, **kwargs)

    return beat_first
