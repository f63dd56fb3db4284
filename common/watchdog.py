"""A process of a run over several processes ends itself when the run stops moving: no step,
evaluation or record for `--peer-timeout` seconds (default 45) means a peer or the link to it is
gone, and an engine may wait for it for good (ps-lite has no timeout at all; XLA's and gloo's
take minutes). Then one line, and the process ends (docs/design.md, "Traps").

The harness beats as it hands out each batch of the warm-up and the epochs, at each evaluation
and record (common/harness.py). The warm-up compiles (XLA, TorchInductor), which can take
minutes on a CPU, so until the first epoch the bound is WARM_UP_S. After the record the bound
still holds: the exit barrier, where every process waits for the others, is bounded too.
Framework-free; one per process.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from common import supervise

PEER_TIMEOUT_S = 45  # --peer-timeout's default
PEER_TIMEOUT_ENV = "MULTIDEVICE_PEER_TIMEOUT"  # --peer-timeout, to the workers a launcher starts
MARGIN_S = 10  # past an engine's own bound of --peer-timeout, whose line names more
WARM_UP_S = 600  # the bound until the first timed step: compilations


def peer_timeout() -> int:
    """The bound a launcher gave its workers (PEER_TIMEOUT_ENV), else the default."""
    given = os.environ.get(PEER_TIMEOUT_ENV, "")
    return int(given) if given.isdigit() and int(given) > 0 else PEER_TIMEOUT_S


class Progress:
    """Beats (`beat`) watched by a daemon thread; `bound` s without one ends the process with
    `line` (exit 1): left for the launcher where there is one (supervise.ERROR_FILE_ENV),
    else on stderr."""

    def __init__(self, bound: float, line: str):
        self.bound, self.line = bound, line
        self.limit = max(bound, WARM_UP_S)
        self.last = time.monotonic()
        threading.Thread(target=self._watch, name="progress-watch", daemon=True).start()

    def beat(self, warm: bool = False) -> None:
        """A step or an evaluation went on; `warm`: still warming up (compiling)."""
        self.last = time.monotonic()
        if not warm:
            self.limit = self.bound

    def _watch(self) -> None:
        while time.monotonic() - self.last <= self.limit:
            time.sleep(min(1.0, self.bound / 4))
        line = f"error: {self.line}: the run has not moved for {self.limit:g} s (--peer-timeout)"
        if not supervise.note(supervise.ERROR_FILE_ENV, f"1 {line}\n"):
            print(line, file=sys.stderr, flush=True)
        supervise.note(supervise.DONE_FILE_ENV, "1\n")
        os._exit(1)
