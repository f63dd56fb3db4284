"""The README's reference tables (compare.readme): they equal what the committed records give,
their numbers follow the records, and bad input is one line and leaves the README alone."""

import json
import shutil

import pytest

from compare import readme
from tests.compare import fixture_records

ROOT = readme.ROOT


def test_readme_tables_match_the_committed_records():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.splice(text, readme.fragment()) == text, (
        "README.md's reference tables differ from results/*.jsonl: run `make readme-tables`"
    )


def test_fragment_shows_each_machine_with_numbers_from_the_records():
    text = readme.fragment()
    gpus, cpu = text.split("**2 virtual devices on 2 CPU cores (AMD EPYC), preset cpu**")
    h200, gpu = gpus.split("**1 x NVIDIA H100 80GB HBM3, preset full** (`results/gpu-h100.jsonl`;")
    assert h200.startswith("**1 x NVIDIA H200, preset full** (`results/gpu-h200.jsonl`;")
    assert "jax 0.11.2; commit e4ed7671585a)" in h200  # one commit: "commit", not "commits"
    assert "| torch ddp+compiled | 0.923 | 1.41 ± 0.00 s (n=10) | 99% |" in h200
    lenet = "| jax scratch | 0.836 | 0.289 ± 0.050 s (n=10) | 0.0740 ± 0.0038 s* (n=10) | 3.90x |"
    assert lenet in h200
    # the records name their commits in full ($RESULTS_GIT_COMMIT); the line shows 12 characters
    assert "torch 2.11.0+cu130 (CUDA 13.0), jax 0.11.2; commits c84edd97b8c3, dccad87ee864)" in gpu
    assert "| torch scratch | 0.827 | 0.524 ± 0.032 s (n=10) |" in gpu
    assert "| jax sharding | 0.920 | 1.61 ± 0.01 s (n=10) | 98% |" in gpu  # NVML utilisation
    # the compiled rows of dccad87 hide those of c84edd9 (2.33 s/epoch), the same cell
    assert "| torch ddp+compiled | 0.930 | 2.13 ± 0.01 s (n=10) | 99% |" in gpu
    assert "| torch | 0.0833 ± 0.0054 s (n=10) |" in gpu
    # 24.2 / 11.7 = 2.07; the newest records of each cell, not the superseded ones; the
    # ceiling of the same framework and precision beside the 1-device time (24.5 s: 0.99x)
    assert (
        "| jax scratch | 0.823 / 0.825 | 24.2 ± 0.5 s (n=10) | 11.7 ± 0.4 s (n=10) | 2.07x "
        "| 24.5 ± 0.3 s* (n=3) | 0.99x |" in cpu
    )
    assert "| torch ddp | 0.106 / 0.098 | 492 ± 7 s* (n=3) | 485 ± 9 s* (n=3) | 1.01x* |" in cpu
    # the faster paths as rows of their own, each beside the ceiling of its precision and tier
    assert (
        "| torch ddp+bf16+compiled | 0.090 / – | 273 ± 6 s* (n=3) | – | – | 226 ± 7 s* (n=3) "
        "| 1.21x |" in cpu
    )
    assert "| mxnet gluon+bf16 | 0.090 / – | 418 ± 11 s* (n=3) | – | – | 421 ± 4 s* (n=3) |" in cpu
    assert "| mxnet | 0.763 ± 0.012 s (n=3) |" in cpu and "0.897 ± 0.023 s (n=3), split 24" in cpu
    assert "| torch | 7.5% / 23.3% | 3.9% / 7.0% | serial |" in cpu  # the round-robin sweep
    assert "| jax | 15.6% / 34.4% | 5.0% / 15.6% | serial |" in cpu
    assert "Generated" not in text  # nothing that changes from one run to the next


def copy_reference(tmp_path):
    for name in readme.REFERENCE:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")


def test_a_changed_record_changes_the_tables_and_fails_the_check(tmp_path, capsys):
    copy_reference(tmp_path)
    path = tmp_path / "results" / "gpu-h100.jsonl"
    lines = path.read_text().splitlines()
    # the newest torch lenet record on the H100 (0.524 s/epoch), the one the table shows
    i = max(i for i, rec in enumerate(lines) if '"framework": "torch"' in rec and '"lenet"' in rec)
    shown = json.loads(lines[i])
    shown["sec_per_epoch"]["median"] = 0.6
    lines[i] = json.dumps(shown)
    path.write_text("\n".join(lines) + "\n")
    assert "| torch scratch | 0.827 | 0.600 ± 0.032 s (n=10) |" in readme.fragment(root=tmp_path)
    before = (tmp_path / "README.md").read_text()
    assert readme.main(["--check"], root=tmp_path) == 1
    err = capsys.readouterr().err
    assert "differ from the records; run `make readme-tables`" in err
    assert (tmp_path / "README.md").read_text() == before  # --check writes nothing
    assert readme.main([], root=tmp_path) == 0
    assert readme.main(["--check"], root=tmp_path) == 0
    after = (tmp_path / "README.md").read_text()
    assert "0.600 ± 0.032 s (n=10)" in after and "0.524 ± 0.032" not in after
    # only the part between the markers changed
    head = before.split(readme.BEGIN)[0]
    tail = before.split(readme.END)[1]
    assert after.startswith(head) and after.endswith(tail)


@pytest.mark.parametrize(
    "readme_text, message",
    [
        ("# no markers\n", "the README needs one line"),
        (f"{readme.END}\n{readme.BEGIN}\n", "the README needs one line"),
    ],
)
def test_bad_readme_is_one_line_and_untouched(tmp_path, capsys, readme_text, message):
    copy_reference(tmp_path)
    (tmp_path / "README.md").write_text(readme_text)
    assert readme.main([], root=tmp_path) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert (tmp_path / "README.md").read_text() == readme_text


def test_bad_records_are_one_line_and_leave_the_readme_alone(tmp_path, capsys):
    copy_reference(tmp_path)
    path = tmp_path / "results" / "cpu-2core.jsonl"
    bad_line = len(path.read_text().splitlines()) + 1
    with open(path, "a") as f:
        f.write(fixture_records.MALFORMED)
    before = (tmp_path / "README.md").read_text()
    assert readme.main([], root=tmp_path) == 2
    err = capsys.readouterr().err
    assert f"cpu-2core.jsonl:{bad_line}: bad results line" in err
    assert len(err.strip().splitlines()) == 1
    assert (tmp_path / "README.md").read_text() == before
    (tmp_path / "results" / "gpu-h100.jsonl").unlink()
    assert readme.main([], root=tmp_path) == 2
    assert "gpu-h100.jsonl: no such results file" in capsys.readouterr().err
