"""The documentation site (mkdocs.yml, `make docs`): it builds with --strict, each lesson shows
every definition it names from the source, a name the source lacks fails the build, and the
maintainers' notes stay in the repository. (The pages in a browser: test_lessons_browser.py;
broken pages, records and the build's safety: test_docs_build.py.)"""

import html
import logging
import re
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the site is built with mkdocs (.venv/base)")

from mkdocs.commands.build import build  # noqa: E402
from mkdocs.config import load_config  # noqa: E402
from mkdocs.exceptions import Abort  # noqa: E402

from tools import docs_hook  # noqa: E402

ROOT = docs_hook.ROOT
LESSONS = ("lenet", "resnet18", "resnet50")


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


def test_the_site_builds_with_every_page(site):
    for page in ("index", "usage", "design", "results", "contributing"):
        assert (site / f"{page}.html").is_file(), page


def test_the_maintainers_notes_stay_in_the_repository(site):
    """The site's contributing page points at CONTRIBUTING.md, whose notes are for maintainers;
    and they name no day and no session's allowance, which only age."""
    page = site / "contributing.html"
    assert "CONTRIBUTING.md" in text(page) and "Before you push" not in text(page)
    notes = (ROOT / "CONTRIBUTING.md").read_text()
    assert not re.search(r"\b20\d\d-\d\d(-\d\d)?\b|budget|device time", notes)


@pytest.mark.parametrize("workload", LESSONS)
def test_each_lesson_shows_the_definitions_it_names_and_the_results(site, workload):
    source = (ROOT / "docs" / "lessons" / f"{workload}.md").read_text()
    shown = text(site / "lessons" / f"{workload}.html")
    includes = [m for m in docs_hook.DIRECTIVE.finditer(source) if m["path"].endswith(".py")]
    assert includes
    for match in includes:
        for name in match["names"].split(","):
            last = name.rpartition(".")[2]
            assert f"def {last}(" in shown or f"class {last}" in shown, (match["path"], name)
    assert "--8<--" not in shown
    assert "speedup" in shown and "cores per device" in shown  # the results table


@pytest.mark.parametrize(
    "line",
    [
        '--8<-- "torch_impl/resnet18.py:no_such_strategy"',
        '--8<-- "torch_impl/resnet18.py:ResNet18.no_such_method"',
        '--8<-- "torch_impl/no_such_file.py:ddp"',
        '--8<-- "results/cpu-xeon-avx512-2core.jsonl:no_such_workload"',
    ],
)
def test_a_name_the_project_lacks_fails_the_build(line, tmp_path, caplog):
    docs = tmp_path / "docs"
    docs.mkdir()
    only = {"docs_dir": str(docs), "nav": [{"Page": "page.md"}], "extra_css": []}
    (docs / "page.md").write_text('# A page\n\n--8<-- "torch_impl/resnet18.py:ddp"\n')
    build_site(tmp_path / "good", **only)  # the same page with a name that is there builds
    (docs / "page.md").write_text(f"# A page\n\n{line}\n")
    with caplog.at_level(logging.WARNING, logger="mkdocs"), pytest.raises(Abort):
        build_site(tmp_path / "bad", **only)
    assert any(r.name == docs_hook.log.name for r in caplog.records), caplog.text
