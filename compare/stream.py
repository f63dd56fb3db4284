"""`make compare`'s runner: one command, its output echoed line by line as it comes, the last
lines of stderr kept for the summary, the wait optionally bounded."""

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
    """(exit code, stderr tail, note). A session of its own: a terminal's Ctrl-C reaches this
    process only, which stops the run once (processes.stop), as on a timeout."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, bufsize=1, start_new_session=True, **pipes)
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
        threading.Thread(target=pump, args=a, daemon=True)
        for a in ((proc.stdout, False), (proc.stderr, True))
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
