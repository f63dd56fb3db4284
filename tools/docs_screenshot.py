"""`python -m tools.docs_screenshot [--site build/site]` (make docs, after the site is built): the
README's picture of the ResNet-18 lesson, the first screen of its page at 1366 x 900 in headless
chromium, written to docs/lessons/resnet18.png; beside it, resnet18.png.sha256, the hash of the
page it shows (its HTML and the lessons' stylesheet). tests/common/test_lessons.py builds the
site and fails when the page no longer hashes the same: the picture is then out of date.
Without chromium it says so and writes nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WINDOW = (1366, 900)  # a common laptop screen, the width the pages are made to fit
PAGE = "lessons/resnet18.html"
SHOWN = [PAGE, "lessons/lessons.css"]  # what the picture is made of, within the site
PICTURE = ROOT / "docs" / "lessons" / "resnet18.png"
HASH = PICTURE.with_name(PICTURE.name + ".sha256")


def chromium(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Debian's chromium, headless at WINDOW, in a fresh profile (another may be running), with
    nothing that reaches the network on its own."""
    binary = shutil.which("chromium")
    if binary is None:
        raise FileNotFoundError("chromium")
    with tempfile.TemporaryDirectory() as profile:
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
        flags += ["--disable-background-networking", "--disable-component-update"]
        flags += ["--disable-sync", f"--user-data-dir={profile}"]
        flags += [f"--window-size={WINDOW[0]},{WINDOW[1]}", "--hide-scrollbars"]
        return subprocess.run(
            [binary, *flags, *args], capture_output=True, text=True, timeout=timeout, check=False
        )


def page_hash(site: Path) -> str:
    """The hash of what the picture shows, as the site at `site` builds it."""
    digest = hashlib.sha256()
    for name in SHOWN:
        digest.update((site / name).read_bytes())
    return digest.hexdigest()


def recorded_hash() -> str:
    return HASH.read_text().split()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=ROOT / "build" / "site")
    site = parser.parse_args(argv).site
    if shutil.which("chromium") is None:
        print(f"no chromium: {PICTURE.relative_to(ROOT)} not made again", file=sys.stderr)
        return 0
    # The budget lets the page's script (the tabs, the code blocks) finish before the shot.
    shot = ["--virtual-time-budget=3000", f"--screenshot={PICTURE}"]
    done = chromium(*shot, (site / PAGE).resolve().as_uri())
    if done.returncode != 0 or not PICTURE.is_file():
        print(done.stderr[-2000:], file=sys.stderr)
        return 1
    HASH.write_text(f"{page_hash(site)}  {' + '.join(SHOWN)} in the built site\n")
    print(f"wrote {PICTURE.relative_to(ROOT)} and {HASH.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
