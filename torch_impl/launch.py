"""torchrun, the way this project starts one process per device (resnet18's DDP, resnet50's
gpipe and 1f1b): `python -m torch.distributed.run --standalone --nproc-per-node=N -m MODULE`.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous in each worker's environment;
`torch.distributed.init_process_group` reads them there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
    rc = subprocess.run(cmd, env=env, cwd=ROOT).returncode
    if rc != 0:
        raise SystemExit(
            f"error: {what} failed: a worker exited with an error (torchrun exit {rc}); "
            "see the worker output above"
        )
