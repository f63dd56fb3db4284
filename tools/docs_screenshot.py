"""`python -m tools.docs_screenshot [--site build/site]` (make docs takes it as it builds the site):
the first screen of the ResNet-18 lesson at 1366 x 900 in headless chromium, written beside its
page (lessons/resnet18.png in the site, which git ignores), to see the page's layout at a glance.
Without chromium it says so and writes nothing.

The pages quote records, which anyone can edit; the docs hook escapes what they carry, and
chromium opens a page all the same as one that could hold anything: a copy of the site, opened by
a user without rights (`nobody` when this runs as root), in chromium's sandbox where the kernel
allows one, and offline (every request but a file's goes to a proxy that cannot be reached).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import processes, signals

ROOT = Path(__file__).resolve().parent.parent
WINDOW = (1366, 900)  # a common laptop screen, the width the pages are made to fit
PAGE = "lessons/resnet18.html"
PICTURE = "lessons/resnet18.png"  # within the site
TIMEOUT = 120  # seconds chromium may take for a page
OFFLINE = ["--proxy-server=http://0.0.0.0:0", "--proxy-bypass-list=<-loopback>"]
NO_SANDBOX = "No usable sandbox"  # chromium's words where the kernel gives it no namespaces
UNPRIVILEGED = "nobody"
HOME = (
    "docs-chromium-"  # chromium's folder, with the copy of the site and the profile: HOME-PID-...
)


class ChromiumError(RuntimeError):
    """Chromium failed or ran past its time: one line."""


def browse(
    site: Path, page: str, *args: str, shot: Path | None = None, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess:
    """Debian's chromium, headless at WINDOW with `args`, on `page` of a copy of `site`, in a
    fresh profile (another may be running); `shot`: its screenshot written there. However it
    ends (its time up, a Ctrl-C), it ends with every process it started, and its copy of the
    site and its profile are removed."""
    binary = shutil.which("chromium")
    if binary is None:
        raise FileNotFoundError("chromium")
    user = _user()
    # A user without rights reaches /tmp, not always the folders above $TMPDIR.
    where = Path("/tmp" if user else tempfile.gettempdir())
    _remove_stale(where)
    home = Path(tempfile.mkdtemp(prefix=f"{HOME}{os.getpid()}-", dir=where))
    try:
        shutil.copytree(site, home / "site", symlinks=True)
        if user:
            _give(home, user)
        flags = ["--headless", "--disable-gpu", "--no-first-run", *OFFLINE]
        flags += ["--disable-background-networking", "--disable-component-update"]
        flags += ["--disable-sync", f"--user-data-dir={home / 'profile'}"]
        flags += [f"--window-size={WINDOW[0]},{WINDOW[1]}", "--hide-scrollbars"]
        flags += [f"--screenshot={home / 'shot.png'}"] if shot else []
        command = [binary, *flags, *args, (home / "site" / page).as_uri()]
        done = _run(command, home, user, timeout)
        if done.returncode != 0 and NO_SANDBOX in done.stderr:  # still a user without rights
            done = _run([binary, "--no-sandbox", *command[1:]], home, user, timeout)
        if shot and (home / "shot.png").is_file():
            shutil.copyfile(home / "shot.png", shot)
        return done
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _remove_stale(where: Path) -> None:
    """The folders of builds killed outright (SIGKILL), once their process is gone."""
    for old in where.glob(f"{HOME}*"):
        pid = old.name.removeprefix(HOME).split("-")[0]
        if pid.isdigit() and not processes.alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)


def _user() -> tuple[int, int] | None:
    """(uid, gid) of UNPRIVILEGED where this process is root, else None: itself."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(UNPRIVILEGED)
    except KeyError:
        raise ChromiumError(f"no user {UNPRIVILEGED} to run chromium as, not as root") from None
    return entry.pw_uid, entry.pw_gid


def _give(home: Path, user: tuple[int, int]) -> None:
    for path in [home, *home.rglob("*")]:
        os.chown(path, *user, follow_symlinks=False)


def _run(
    command: list[str], home: Path, user: tuple[int, int] | None, timeout: float
) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}
    env |= {"TMPDIR": str(home), "LANG": "C.UTF-8"}
    ids = {"user": user[0], "group": user[1], "extra_groups": []} if user else {}
    # A session of its own: a Ctrl-C reaches this process alone, which ends chromium.
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=home,
        env=env,
        start_new_session=True,
        **ids,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ChromiumError(f"chromium did not finish within {timeout:.0f} s") from None
    finally:
        _end(proc)
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _end(proc: subprocess.Popen) -> None:
    """Chromium and each process it started gone (they write into its profile until then)."""
    started = [proc.pid, *processes.descendants(proc.pid)]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.communicate()
    deadline = time.monotonic() + 10
    while any(map(_running, started)) and time.monotonic() < deadline:
        time.sleep(0.05)


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended but not yet reaped by its new parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def shoot(site: Path) -> Path:
    """The picture of `site`'s PAGE, written to `site`/PICTURE."""
    picture = site / PICTURE
    # The budget lets the page's script (the tabs, the code blocks) finish before the shot.
    done = browse(site, PAGE, "--virtual-time-budget=3000", shot=picture)
    if done.returncode != 0 or not picture.is_file():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ChromiumError(f"chromium could not take {PICTURE} (exit {done.returncode}): {last}")
    return picture


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=ROOT / "build" / "site")
    site = parser.parse_args(argv).site
    if shutil.which("chromium") is None:
        print(f"no chromium: {PICTURE} not taken (apt-get install chromium)", file=sys.stderr)
        return 0
    if not (site / PAGE).is_file():
        print(f"no {PAGE} in {site}: build the site first (make docs)", file=sys.stderr)
        return 1
    with signals.as_interrupt():
        try:
            print(f"wrote {shoot(site)}")
        except (ChromiumError, OSError) as e:
            print(f"docs_screenshot: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(signals.main(run))
