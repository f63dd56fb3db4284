"""`python -m tools.docs_build [--site build/site]` (make docs): the documentation site
(mkdocs.yml) built into build/site, offline, with the picture of the ResNet-18 lesson's first
screen beside its page (tools/docs_screenshot.py). A problem (a name a page includes that the
source lacks, a records file missing or unreadable, a bad records line, a record of the wrong
types, a link to no page) fails the build with one line each, and build/site stays as it was.

The site is built in a folder of its own under build/ and put in place whole once it is done,
so builds at once never meet (the last one done stays); a build that fails or is stopped (Ctrl-C,
SIGTERM) leaves the previous site and nothing else: no half-built folder, no chromium, no profile.
"""

# ruff: noqa: E402 (a stop while mkdocs imports is handled before it imports)
from __future__ import annotations

from common import signals

if __name__ == "__main__":
    signals.before_imports()

import argparse
import contextlib
import fcntl
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from mkdocs.commands.build import build as mkdocs_build
from mkdocs.config import load_config
from mkdocs.exceptions import Abort, ConfigurationError

from common import processes
from tools import docs_screenshot

ROOT = Path(__file__).resolve().parent.parent
STAGE = ".docs-"  # a build's own folder in the site's parent: .docs-PID-xxxx
LOCK_WAIT = 60  # seconds to wait for another build to finish putting its site in place
STOPS = {signal.SIGINT, *signals.STOPS}


class DocsError(RuntimeError):
    """The site cannot be put in place: one line."""


class Problems(logging.Handler):
    """mkdocs's warnings and errors (the docs hook's among them), each as its one line."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(" ".join(record.getMessage().split()))


def build(config_file: Path, site: Path) -> list[str]:
    """The site of `config_file` built --strict into `site`; the problems that failed it."""
    problems, logger = Problems(), logging.getLogger("mkdocs")
    logger.addHandler(problems)
    propagate, logger.propagate = logger.propagate, False
    try:
        config = load_config(str(config_file), site_dir=str(site))
        config.strict = True
        mkdocs_build(config)
    except (Abort, ConfigurationError) as e:
        return problems.lines or [str(e)]
    finally:
        logger.removeHandler(problems)
        logger.propagate = propagate
    return problems.lines


@contextlib.contextmanager
def staged(parent: Path) -> Iterator[Path]:
    """A folder of this build's own in `parent`, removed when the build ends, however it ends;
    those of builds killed outright (SIGKILL) are removed once their process is gone."""
    parent.mkdir(parents=True, exist_ok=True)
    for old in parent.glob(f"{STAGE}*"):
        pid = old.name.split("-")[2]
        if old.is_dir() and not (pid.isdigit() and processes.alive(int(pid))):
            shutil.rmtree(old, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(dir=parent, prefix=f"{STAGE}{os.getpid()}-"))
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def publish(new: Path, site: Path, stage: Path) -> None:
    """`new` in `site`'s place, the previous site moved into `stage` (removed with it): two
    renames, under a lock on the folder that holds both, with stop signals held until done."""
    previous = stage / "previous"
    with locked(site.parent, LOCK_WAIT):
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
        try:
            if site.exists() or site.is_symlink():
                os.rename(site, previous)
            try:
                os.rename(new, site)
            except OSError:
                if previous.exists() or previous.is_symlink():
                    os.rename(previous, site)
                raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)


@contextlib.contextmanager
def locked(folder: Path, wait: float) -> Iterator[None]:
    """`folder` locked (flock) against the other builds' renames in it, for at most `wait` s."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise DocsError(
                        f"another build has held {folder} for over {wait} s: stop it "
                        "or wait for it, and run again"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def picture(site: Path) -> str:
    """The lesson's picture taken in `site`: what to say of it."""
    if shutil.which("chromium") is None:
        return f"no picture ({docs_screenshot.PICTURE}): no chromium (apt-get install chromium)"
    return f"with {docs_screenshot.shoot(site).relative_to(site)}"


def shown(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    return str(path)


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-file", type=Path, default=ROOT / "mkdocs.yml")
    parser.add_argument("--site", type=Path, default=ROOT / "build" / "site")
    args = parser.parse_args(argv)
    site = args.site.absolute()
    with signals.as_interrupt(), staged(site.parent) as stage:
        new = stage / "site"
        problems = build(args.config_file, new)
        for line in problems:
            print(f"make docs: {line}", file=sys.stderr)
        if problems:
            return 1
        try:
            said = picture(new)
            publish(new, site, stage)
        except (DocsError, docs_screenshot.ChromiumError, OSError) as e:
            print(f"make docs: {e}; {shown(site)} left as it was", file=sys.stderr)
            return 1
    print(f"make docs: built {shown(site)}, {said}")
    return 0


if __name__ == "__main__":
    sys.exit(signals.main(run))
