"""The side-by-side lesson pages (tools/lessons.py, `make lessons`): generated from the code, and
checked against it, so a page never shows code that is not there."""

from tools import lessons


def test_the_committed_pages_are_what_the_code_gives(capsys):
    assert lessons.main(["--check"]) == 0, capsys.readouterr().out


def test_the_check_fails_when_the_code_changes(monkeypatch, capsys):
    sources = lessons.sources

    def edited(framework, workload):
        found = sources(framework, workload)
        if framework == "jax" and "train" in found:
            found["train"] += "\n    # an edit the pages do not show yet"
        return found

    monkeypatch.setattr(lessons, "sources", edited)
    assert lessons.main(["--check"]) == 1
    assert "docs/lessons/lenet.md differs from the code" in capsys.readouterr().out


def test_every_row_shows_each_frameworks_own_code():
    for workload in lessons.ROWS:
        page = lessons.markdown(workload)
        for framework in lessons.FRAMEWORKS:
            assert f"<th>{framework}_impl/{workload}.py</th>" in page
        assert page.count("def train(") == 3, workload
    r18 = lessons.markdown("resnet18")
    for name in ("def ddp(", "def sharding(", "def dist_sync(", "def pmap(", "def data_parallel("):
        assert name in r18, name
    assert "world &gt; 1" in lessons.html_page("resnet18")  # the source, escaped
    assert "<pre><code>" in lessons.html_page("lenet")
