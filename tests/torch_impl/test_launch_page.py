"""The ResNet-18 page shows torch's launch as it runs (docs/lessons/resnet18.md, "Several
processes: start and join"): the command torch's launcher builds, and the one `ps` shows during
a run on one machine, as guard.run_torchrun hands it to its supervisor."""

import os
import re
import sys
from pathlib import Path

from common import supervise
from torch_impl import guard, launch

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "lessons" / "resnet18.md"
WORKER = ["--workload", "resnet18"]  # the page writes the rest of the user's line as `...`


def shown_commands() -> list[str]:
    """The page's shell commands, each on one line (continuations joined)."""
    blocks = re.findall(r"```sh\n(.*?)```", PAGE.read_text(), re.S)
    return [" ".join(line.split()) for b in blocks for line in b.replace("\\\n", " ").splitlines()]


def as_shown(cmd: list[str], port: str | None = None) -> str:
    """`cmd` as the page writes it: `python`, the port and the launcher's pid as names."""
    text = " ".join(["python", *cmd[1:]]) + " ..."
    text = text.replace(f"multidevice-{os.getpid()}", "multidevice-PID")
    return text.replace(f"127.0.0.1:{port}", "127.0.0.1:PORT") if port else text


def test_the_page_shows_the_command_the_launcher_builds():
    built = as_shown(launch.torchrun_command(WORKER, 2))
    assert built in shown_commands(), f"the page lacks {built!r}"


def test_the_page_shows_the_command_ps_shows(monkeypatch):
    """What guard.run_torchrun runs on one machine (the supervisor stubbed: nothing starts)."""
    ran = []

    def run_launcher(cmd, env, nproc, *wait, **options):
        ran.append(cmd)
        return 0

    monkeypatch.setattr(supervise, "run_launcher", run_launcher)
    guard.run_torchrun(launch.torchrun_command(WORKER, 2), 2, "DDP training", None)
    (cmd,) = ran
    assert cmd[0] == sys.executable
    port = next(a for a in cmd if a.startswith("--rdzv-endpoint=")).rpartition(":")[2]
    shown = as_shown(cmd, port)
    assert shown in shown_commands(), f"the page lacks {shown!r}"
