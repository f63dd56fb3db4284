"""docs/results.md's scaling part (compare.readme, SCALING): made from every committed
results/cluster-*.jsonl, here the synthetic cluster records of tests/compare/fixture_cluster.py
in a copy of the repository's records; a stale part fails the check, no cluster file says so,
and a page without its markers is one line."""

import pytest

from compare import readme
from tests.compare import fixture_cluster as fc
from tests.compare.test_readme import copy_reference

CLUSTER = "results/cluster-fixture.jsonl"
MACHINE = "**2 virtual devices on 8 CPU cores (Fixture Box), preset cpu** (`results/cluster-"
STALE = "docs/results.md: the scaling tables differ from the records; run `make readme-tables`"


def part(root) -> str:
    """The text between the scaling markers of `root`'s docs/results.md."""
    text = (root / readme.SCALING.path).read_text()
    return text.split(readme.SCALING_BEGIN, 1)[1].split(readme.SCALING_END, 1)[0].strip()


def table_rows(text: str, first_header: str) -> list[list[str]]:
    """The body rows of the table whose first header cell is `first_header`."""
    lines = text.split(f"| {first_header} |", 1)[1].split("\n\n", 1)[0].splitlines()
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in lines[2:]]


@pytest.fixture
def root(tmp_path, capsys):
    """A copy of the records and generated files, every part up to date, with no cluster file."""
    copy_reference(tmp_path)
    capsys.readouterr()
    return tmp_path


def test_no_cluster_file_says_there_is_none_yet(root):
    assert part(root) == readme.NO_CLUSTER
    assert readme.main(["--check"], root=root) == 0


def test_the_part_is_made_from_each_cluster_file(root, capsys):
    before = {n: (root / n).read_text() for n in ("README.md", "docs/results.md")}
    fc.write(root / CLUSTER, fc.cluster())
    assert readme.main(["--check"], root=root) == 1
    assert capsys.readouterr().err.splitlines() == [STALE]
    assert readme.main([], root=root) == 0
    assert readme.main(["--check"], root=root) == 0
    text = part(root)
    # the machine line, in the style of the others: files, versions, commit
    assert text.startswith(MACHINE + "fixture.jsonl`; torch ") and "mxnet " in text.split("\n")[0]
    assert "resnet18 across nodes:" in text
    rows = {(r[0], r[3].split(" ")[0], r[4]): r for r in table_rows(text, "engine")}
    assert list(rows) == [
        ("torch ddp", "none", "1"),
        ("torch ddp", "unlimited", "2"),
        ("torch ddp", "1gbit", "2"),
        ("mxnet gluon", "none", "1"),
        ("mxnet dist", "1gbit", "2"),
    ]
    assert rows[("torch ddp", "1gbit", "2")][9] == "41.5 MB"  # bytes/step measured
    assert rows[("torch ddp", "none", "1")][9] == "–"  # one node: no link to count
    # the tables' notes once, under them, as quoted lines; the predictions after, labelled
    measured, predicted = text.split(readme.PREDICTIONS_LABEL)
    assert measured.count("> On nodes of one core") == 1
    assert measured.count("> sec/epoch: median ± std over the timed epochs") == 1
    assert "> Predictions, not measurements: the step's collectives of this section" in predicted
    # the H100's 1-GPU record of the one engine both ran (torch ddp; no MXNet on the GPU), at
    # 2 and 8 devices on each interconnect, with the cluster's gradient (ResNet-18's, 44.7 MB)
    gpus = table_rows(predicted, "GPU (1-device record)")
    assert {(r[0], r[1]) for r in gpus} == {("1 x NVIDIA H100 80GB HBM3", "torch ddp")}
    assert [(r[3].split(" ")[0], r[4], r[5]) for r in gpus] == [
        ("NVLink", "2", "44.7 MB"),
        ("NVLink", "8", "78.2 MB"),
        ("100", "2", "44.7 MB"),
        ("100", "8", "78.2 MB"),
    ]
    after = (root / "docs/results.md").read_text()
    assert (root / "README.md").read_text() == before["README.md"]
    old = before["docs/results.md"]
    assert after.split(readme.SCALING_BEGIN)[0] == old.split(readme.SCALING_BEGIN)[0]
    assert after.split(readme.SCALING_END)[1] == old.split(readme.SCALING_END)[1]


def test_a_changed_cluster_record_fails_the_check_until_rewritten(root, capsys):
    fc.write(root / CLUSTER, fc.cluster())
    assert readme.main([], root=root) == 0
    changed = fc.cluster()
    changed[1].images_per_sec /= 2  # torch ddp over 1gbit: 1.8 s a step, not 0.9
    fc.write(root / CLUSTER, changed)
    page = (root / "docs/results.md").read_text()
    capsys.readouterr()
    assert readme.main(["--check"], root=root) == 1
    assert capsys.readouterr().err.splitlines() == [STALE]
    assert (root / "docs/results.md").read_text() == page  # --check writes nothing
    assert readme.main([], root=root) == 0
    assert "| 1.80 s |" in part(root) and readme.main(["--check"], root=root) == 0


def test_two_cluster_files_are_shown_in_the_order_of_their_names(root):
    fc.write(root / "results/cluster-b.jsonl", fc.cluster())
    fc.write(root / "results/cluster-a.jsonl", fc.cluster()[:2])
    assert readme.main([], root=root) == 0
    text = part(root)
    assert text.index(MACHINE + "a.jsonl`") < text.index(MACHINE + "b.jsonl`")
    assert text.count(readme.PREDICTIONS_LABEL) == 2


@pytest.mark.parametrize("check", [[], ["--check"]])
def test_a_page_without_the_scaling_markers_is_one_line(root, capsys, check):
    page = root / "docs/results.md"
    text = page.read_text()
    gone = text.replace(readme.SCALING_BEGIN + "\n", "").replace(readme.SCALING_END + "\n", "")
    page.write_text(gone)
    assert readme.main(check, root=root) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"error: docs/results.md needs one line {readme.SCALING_BEGIN} and, after it, one line "
        f"{readme.SCALING_END}"
    ]
    assert page.read_text() == gone
