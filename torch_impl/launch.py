"""torchrun, the way this project starts one process per device (resnet18's DDP, resnet50's
gpipe and 1f1b): `python -m torch.distributed.run --standalone --nproc-per-node=N -m MODULE`.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous in each worker's environment;
`torch.distributed.init_process_group` reads them there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import cli

ROOT = Path(__file__).resolve().parent.parent
ERROR_FILE_ENV = "MULTIDEVICE_WORKER_ERROR_FILE"  # where a worker leaves its one-line error


def torchrun(module: str, argv: list[str], nproc: int, what: str) -> None:
    """Run `python -m module *argv` in `nproc` processes on this machine; raise SystemExit with
    one line if any of them fails (torchrun then stops the others)."""
    env = dict(os.environ)
    # torchrun sets OMP_NUM_THREADS=1 when it is unset (docs/design.md, traps): the processes
    # share the cores instead.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={nproc}", "--monitor-interval=0.5", "-m", module, *argv]
    with tempfile.TemporaryDirectory() as tmp:
        env[ERROR_FILE_ENV] = str(Path(tmp) / "error.txt")
        rc = subprocess.run(cmd, env=env, cwd=ROOT).returncode
        if rc == 0:
            return
        # A worker's own error is the line to end on, not torchrun's summary of it.
        said = Path(env[ERROR_FILE_ENV])
        if said.is_file():
            raise SystemExit(said.read_text().strip())
    raise SystemExit(
        f"error: {what} failed: a worker exited with an error (torchrun exit {rc}); "
        "see the worker output above"
    )


def worker_main(entry, argv: list[str]) -> None:
    """Run a worker's `entry(argv)`: a user error is one line (and is left for the launcher to
    end on), Ctrl-C ends quietly; the exit code tells torchrun."""
    try:
        entry(argv)
    except cli.USER_ERRORS as e:
        line = f"error: {e}"
        print(line, file=sys.stderr)
        if os.environ.get(ERROR_FILE_ENV):
            with open(os.environ[ERROR_FILE_ENV], "a") as f:
                f.write(line + "\n")
        sys.exit(cli.EXIT_DIVERGED if isinstance(e, cli.training.Diverged) else 2)
    except KeyboardInterrupt:
        sys.exit(cli.EXIT_INTERRUPTED)
