"""The side-by-side lesson pages (tools/lessons.py, `make lessons`): generated from the code, and
checked against it, so a page never shows code that is not there. (Their layout in a browser:
test_lessons_browser.py.)"""

import ast
import html
import re

import pytest

from tools import lessons, lessons_code, lessons_render


def test_the_committed_pages_are_what_the_code_gives(capsys):
    assert lessons.main(["--check"]) == 0, capsys.readouterr().out


def test_the_check_fails_when_the_code_changes(monkeypatch, capsys):
    read = lessons_code.read

    def edited(path):
        text = read(path)
        if path.name == "lenet.py" and path.parent.name == "jax_impl":
            text = text.replace("\ndef train(", "\n# an edit the pages do not show yet\ndef train(")
        return text

    monkeypatch.setattr(lessons_code, "read", edited)
    assert lessons.main(["--check"]) == 1
    assert "docs/lessons/lenet.md differs from the code" in capsys.readouterr().out


def _text(page: str) -> str:
    """An HTML page's text, without its tags."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def test_every_row_shows_each_frameworks_own_code():
    for workload in lessons.ROWS:
        page = lessons.markdown(workload)
        for framework in lessons.FRAMEWORKS:
            assert f"<th>{framework}_impl/{workload}.py</th>" in page
        assert page.count("def train(") == 3, workload
        assert _text(lessons.html_page(workload)).count("def train(") == 3, workload
    r18 = lessons.markdown("resnet18")
    for name in ("def ddp(", "def sharding(", "def dist_sync(", "def pmap(", "def data_parallel("):
        assert name in r18, name
    for framework in lessons.FRAMEWORKS:  # how the processes start and join
        assert f"<th>{framework}_impl/launch.py</th>" in r18
        assert f"def {lessons.JOIN[framework].rpartition('.')[2]}(" in r18


def test_each_page_starts_with_the_imports_then_how_processes_start_and_join():
    for workload, rows in lessons.ROWS.items():
        assert [row.concept for row in rows[:2]] == ["imports", "start and join"], workload
        first = lessons.cells(workload)[0][1]
        for framework in lessons.FRAMEWORKS:
            lines = first[framework].pieces[0][0].lines
            assert lines[0].startswith(("import ", "from ")), (workload, framework)
            assert all(line.startswith(("import ", "from ", " ")) for line in lines if line)


def _docstring(framework: str, module: str, name: str) -> str:
    tree = ast.parse((lessons.ROOT / f"{framework}_impl" / f"{module}.py").read_text())
    node = next(n for n in tree.body if getattr(n, "name", None) == name)
    return " ".join(ast.get_docstring(node).split())


def test_the_prose_is_the_docstrings_and_the_code_folds_them():
    r18 = lessons.markdown("resnet18")
    for framework, name in (("torch", "ddp"), ("jax", "sharding"), ("mxnet", "dist_sync")):
        doc = _docstring(framework, "resnet18", name)
        assert lessons_render._md_text(f"`{name}`: {doc}") in r18
        assert doc.split(":")[0] in _text(lessons.html_page("resnet18"))
    torch_join = lessons.JOIN["torch"].rpartition(".")[2]
    assert " ".join(_docstring("torch", "launch", torch_join).split()[:8]) in r18
    assert 'def ddp(net, optimizer, world):\n    """⋯"""\n' in r18  # the text is above the code


def test_benchmark_lines_and_the_model_fold_away():
    for workload in lessons.ROWS:
        md, page = lessons.markdown(workload), lessons.html_page(workload)
        for text in lessons_code.BENCHMARK:
            assert text not in md, (workload, text)
            # in the HTML, only inside a fold (a <details>), one click away
            outside = re.sub(r"<details>.*?</details>", "", page, flags=re.S)
            assert html.escape(text, quote=False) not in _text(outside), (workload, text)
    assert "new_step()" in lessons.html_page("resnet18")
    r18 = lessons.markdown("resnet18")
    model = r18[r18.index("## model") : r18.index("## train_step")]
    assert model.count("\n") < 120, "the model row shows more than the lesson needs"
    assert "class Residual(nn.Module): ⋯" in model


def test_each_cell_ends_with_the_command_that_runs_it():
    r18 = lessons.markdown("resnet18")
    for framework, strategy in (("torch", "ddp"), ("jax", "sharding"), ("mxnet", "dist")):
        assert (
            f"run: `python -m {framework}_impl --workload resnet18 --gpus 2 --strategy {strategy}`"
            in r18
        )
    assert "run: `python -m jax_impl --workload resnet18 --gpus 1 --nnodes 2 --node-rank R" in r18
    main = lessons_code.source("torch", "resnet18")
    assert lessons_code.command("resnet18", "torch", "--gpus 2", main).endswith("--gpus 2")
    for wrong in ("--gpus 2 --strategy nope", "--gpus 2 --no-such-flag", "--nnodes 2"):
        with pytest.raises(SystemExit, match="fix ROWS"):
            lessons_code.command("resnet18", "torch", wrong, main)


def test_a_name_the_code_lacks_is_an_error(monkeypatch):
    row = lessons.Row("gone", "a function no file has", {lessons.ALL: ["no_such_function"]})
    monkeypatch.setitem(lessons.ROWS, "lenet", [lessons.ROWS["lenet"][0], row])
    with pytest.raises(SystemExit, match="torch_impl/lenet.py has no no_such_function"):
        lessons.markdown("lenet")


def test_highlighting_keeps_every_line():
    lines = ["def f():", '    """a docstring', '    over two lines"""', "", "    return 1  # one"]
    lit = lessons_render.highlight(lines)
    assert len(lit) == len(lines)
    assert [_text(line) for line in lit] == lines
    assert lit[1] == '    <span class="sd">"""a docstring</span>'  # closed per line
