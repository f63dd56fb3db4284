"""The documentation site (mkdocs.yml, `make docs`), whole: it builds with --strict (slow: the
whole site), each lesson shows every definition it names from the source, and the maintainers'
notes stay in the repository. (The pages in a browser: test_lessons_browser.py;
broken pages, records and the build's safety: test_docs_build.py.)"""

import html
import re
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the site is built with mkdocs (.venv/base)")

from mkdocs.commands.build import build  # noqa: E402
from mkdocs.config import load_config  # noqa: E402

from tools import docs_hook  # noqa: E402

ROOT = docs_hook.ROOT
LESSONS = ("lenet", "resnet18", "resnet50", "zero")


def build_site(site_dir, **overrides) -> Path:
    """The site built --strict into `site_dir`, from mkdocs.yml with `overrides`."""
    config = load_config(str(ROOT / "mkdocs.yml"), site_dir=str(site_dir), **overrides)
    config.strict = True
    build(config)
    return Path(site_dir)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return build_site(tmp_path_factory.mktemp("site"))


def text(page: Path) -> str:
    """A built page's text, without its tags."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


@pytest.mark.slow
def test_the_site_builds_with_every_page(site):
    for page in ("index", "usage", "design", "results", "contributing"):
        assert (site / f"{page}.html").is_file(), page


@pytest.mark.slow
def test_the_maintainers_notes_stay_in_the_repository(site):
    """The site's contributing page points at CONTRIBUTING.md, whose notes are for maintainers."""
    page = site / "contributing.html"
    assert "CONTRIBUTING.md" in text(page) and "Before you push" not in text(page)


def test_the_maintainers_notes_name_no_day_and_no_allowance():
    """Dates and a session's allowance only age: the notes say what holds."""
    notes = (ROOT / "CONTRIBUTING.md").read_text()
    assert not re.search(r"\b20\d\d-\d\d(-\d\d)?\b|budget|device time", notes)


@pytest.mark.slow
@pytest.mark.parametrize("workload", LESSONS)
def test_each_lesson_shows_the_definitions_it_names_and_the_results(site, workload):
    source = (ROOT / "docs" / "lessons" / f"{workload}.md").read_text()
    shown = text(site / "lessons" / f"{workload}.html")
    directives = list(docs_hook.DIRECTIVE.finditer(source))
    # Code by name; `common/collectives.py:moves:WORKLOAD` is a table (test_what_moves.py).
    includes = [m for m in directives if m["path"].endswith(".py") and ":" not in m["names"]]
    assert includes
    for match in includes:
        for name in match["names"].split(","):
            last = name.partition("~")[0].rpartition(".")[2]  # `name~other`: name's lines
            assert f"def {last}(" in shown or f"class {last}" in shown, (match["path"], name)
    assert "--8<--" not in shown
    assert "speedup" in shown and re.search("cores per device|a core each", shown)  # the results


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["lenet", "resnet18"])
def test_each_trained_lesson_shows_its_accuracy_and_curves(site, workload):
    """What you should see: the trained runs' test accuracy on 1 and 2 devices and their curves,
    a picture written into the site (not into the checkout) with its alternative text."""
    page = (site / "lessons" / f"{workload}.html").read_text()
    shown = page.partition('id="what-you-should-see"')[2]
    assert "test accuracy, 1 / 2 devices" in shown
    picture = re.search(r'<img src="([^"]+)" alt="Test accuracy after each epoch', shown)
    assert picture and (site / "lessons" / picture[1]).is_file(), picture
    assert not (ROOT / "docs" / "lessons" / picture[1]).exists()
