"""Run one command, echoing its stdout and stderr line by line as they come, keeping the last
lines of stderr for the summary, with an optional bound on the wait: `make compare`'s runner."""

from __future__ import annotations

import collections
import os
import subprocess
import threading
from pathlib import Path

from common import processes

ROOT = Path(__file__).resolve().parents[1]
TAIL_LINES = 15


def stream(cmd: list[str], echo, timeout: float | None = None) -> tuple[int, list[str], str]:
    """Run `cmd`, echoing its output line by line as it comes; (exit code, stderr tail, note)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # A session of its own: a terminal's Ctrl-C reaches this process only, which then stops the
    # run once (processes.stop), as on a timeout, and waits for it to stop its workers.
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        bufsize=1,
        start_new_session=True,
    )
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    lock = threading.Lock()

    def pump(pipe, keep):
        for line in pipe:
            line = line.rstrip("\n")
            if keep:
                tail.append(line)
            with lock:
                echo(f"    | {line}")
        pipe.close()

    threads = [
        threading.Thread(target=pump, args=(proc.stdout, False), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, True), daemon=True),
    ]
    for t in threads:
        t.start()
    note = ""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        processes.stop(proc)  # proc.kill() would leave torchrun's and ps-lite's workers running
        note = f"timed out after {timeout:g} s"
    except BaseException:
        processes.stop(proc)
        raise
    for t in threads:
        t.join(timeout=5)
    return proc.returncode, list(tail), note
