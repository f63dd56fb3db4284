"""The reference tables and the README's figure (compare.readme, compare.figure): they equal
what the committed records give, their numbers follow the records, a changed record fails the
check until `make readme-tables` runs, and bad input is one line and leaves the files alone."""

import contextlib
import io
import json
import shutil
import struct
import zlib

import pytest
from PIL import Image, PngImagePlugin

from compare import figure, readme
from tests.compare import fixture_records

ROOT = readme.ROOT
H200 = "**1 x NVIDIA H200, preset full** (`results/gpu-h200.jsonl`;"
H100 = "**1 x NVIDIA H100 80GB HBM3, preset full** (`results/gpu-h100.jsonl`;"
AVX2 = "**2 virtual devices on 2 CPU cores (AMD EPYC, AVX2), preset cpu**"
AVX512 = "**2 virtual devices on 2 CPU cores (AMD EPYC), preset cpu**"
AVX512_BF16 = "**2 virtual devices on 2 CPU cores (AMD EPYC, AVX512_BF16), preset cpu**"
XEON = "**2 virtual devices on 2 CPU cores (Intel(R) Xeon(R) Processor, AMX_BF16), preset cpu**"
CORES = f"{XEON} (`results/cpu-xeon-avx512-2core.jsonl`;"  # a core per device


def test_the_committed_tables_and_figure_match_the_records(capsys):
    assert readme.main(["--check"]) == 0, (
        f"{capsys.readouterr().err}README.md, docs/results.md or docs/comparison.png differ "
        "from results/*.jsonl: run `make readme-tables`"
    )


def test_the_readme_shows_one_gpu_and_one_cpu_machine_and_the_rest_go_to_the_results_page():
    parts, _ = readme.fragments()
    shown, others = parts[readme.README], parts[readme.OTHERS]
    assert shown.startswith(H200) and CORES in shown
    assert H100 not in shown and AVX512 not in shown and AVX2 not in shown
    assert shown.count(XEON) == 1 and AVX512_BF16 not in shown  # the other sessions: not here
    assert others.startswith(H100) and AVX512 in others and AVX512_BF16 in others
    assert AVX2 in others and H200 not in others and CORES not in others
    # each note once per part, under the tables, not under every table
    assert shown.count("> ceiling: the framework's own tight-loop step") == 1
    assert others.count("> ceiling: the framework's own tight-loop step") == 1
    assert "Generated" not in shown + others  # nothing that changes from one run to the next


def test_the_readme_tables_have_the_numbers_of_the_records():
    parts, _ = readme.fragments()
    h200, cpu = parts[readme.README].split(CORES)
    assert "jax 0.11.2; commit e4ed7671585a)" in h200  # one commit: "commit", not "commits"
    assert "| torch ddp+compiled | 0.923 | 1.41 ± 0.00 s (n=10) | 99% |" in h200
    lenet = "| jax scratch | 0.836 | 0.289 ± 0.050 s (n=10) | 0.0740 ± 0.0038 s* (n=10) | 3.90x |"
    assert lenet in h200
    assert "| jax | 0.0428 ± 0.0011 s (n=10) |" in h200
    # a core per device: the pair's speedup; the comparison run on both cores with its ceiling
    assert (
        "| torch ddp | 1 | 0.106 / 0.090 | 2252 ± 38 s* (n=3) | 1116 ± 55 s* (n=3) | 2.02x* |"
        in cpu
    )
    assert "| torch ddp | shared | 0.142 / – | 1272 ± 54 s* (n=3) | – | – | 1218 ± 63 s*" in cpu
    assert (
        "| torch scratch | 1 | 0.714 / 0.724 | 24.5 ± 1.9 s (n=3) | 26.5 ± 5.1 s (n=3) | "
        "sequential |" in cpu
    )
    assert (
        "| mxnet gluon | 1 | 0.106 / 0.093 | 1357 ± 154 s* (n=3) | 1628 ± 61 s* (n=3) | 0.83x* |"
        in cpu
    )
    assert "> sequential: one process stepped its devices one after another" in cpu
    mxnet = "| mxnet | 1.44 ± 0.09 s (n=3) | 1.85 ± 0.22 s (n=3) | 2.33 ± 0.14 s (n=3), split 6 |"
    assert mxnet in cpu


def test_the_results_page_tables_have_the_numbers_of_the_records():
    parts, _ = readme.fragments()
    gpu, cpu = parts[readme.OTHERS].split(AVX512)
    # the records name their commits in full ($RESULTS_GIT_COMMIT); the line shows 12 characters
    assert "torch 2.11.0+cu130 (CUDA 13.0), jax 0.11.2; commits c84edd97b8c3, dccad87ee864)" in gpu
    assert "| torch scratch | 0.827 | 0.524 ± 0.032 s (n=10) |" in gpu
    assert "| jax sharding | 0.920 | 1.61 ± 0.01 s (n=10) | 98% |" in gpu  # NVML utilisation
    # the compiled rows of dccad87 hide those of c84edd9 (2.33 s/epoch), the same cell
    assert "| torch ddp+compiled | 0.930 | 2.13 ± 0.01 s (n=10) | 99% |" in gpu
    assert "| torch | 0.0833 ± 0.0054 s (n=10) |" in gpu
    # the newest records of each cell, not the superseded ones; shared cores: no speedup
    assert (
        "| jax scratch | 0.823 / 0.825 | 24.2 ± 0.5 s (n=10) | 11.7 ± 0.4 s (n=10) | overheads "
        "only | 24.5 ± 0.3 s* (n=3) | 0.99x |" in cpu
    )
    assert (
        "| torch ddp+bf16+compiled | 0.090 / – | 273 ± 6 s* (n=3) | – | – | 226 ± 7 s* (n=3) "
        "| 1.21x |" in cpu
    )
    assert "| mxnet gluon+bf16 | 0.090 / – | 418 ± 11 s* (n=3) | – | – | 421 ± 4 s* (n=3) |" in cpu
    # the sweep's fastest point beside the engine's 1F1B of the same run
    assert "| 0.530 ± 0.047 s (n=3), split 24 | 2.12 ± 0.08 s (n=3), split 6 |" in cpu
    assert (
        "| torch scratch+compiled | 0.828 / – | 8.20 ± 0.19 s (n=10) |" in cpu.split(AVX512_BF16)[1]
    )


def test_the_figure_shows_the_readme_gpu_with_the_ceilings_the_tables_pair():
    _, data = readme.fragments()
    assert (data["machine"], data["preset"]) == ("1 x NVIDIA H200, preset full", "full")
    assert data["sources"] == ["results/gpu-h200.jsonl"]
    assert [p["workload"] for p in data["panels"]] == ["resnet18", "lenet"]
    resnet18 = {b["label"]: b for b in data["panels"][0]["bars"]}
    assert list(resnet18) == [
        "torch ddp",
        "torch ddp+bf16+compiled",
        "torch ddp+compiled",
        "jax sharding",
        "jax sharding+bf16",
        "jax pmap+unbucketed",  # a record from before pmap packed its gradients
    ]
    compiled = resnet18["torch ddp+compiled"]
    assert (compiled["sec_per_epoch"], compiled["ceiling_sec_per_epoch"]) == (1.409, 1.411)
    assert compiled["ceiling_measured"] == "in the run" and compiled["n"] == 10
    lenet = {b["label"]: b for b in data["panels"][1]["bars"]}
    # as the table: 3.90x, the median of the epochs' ratios, not 0.289 / 0.0740
    assert round(lenet["jax scratch"]["x_ceiling"], 2) == 3.90
    assert not any(b["extrapolated"] for p in data["panels"] for b in p["bars"])


FIGURE_FILES = (readme.FIGURE, readme.FIGURE_DATA)


def copy_reference(tmp_path):
    """The reference records and the generated files in `tmp_path`, the files made from the
    records there: these tests hold the check's workings, apart from whether the committed
    files are up to date (test_the_committed_tables_and_figure_match_the_records)."""
    for name in (*readme.REFERENCE, readme.README.path, readme.OTHERS.path, *FIGURE_FILES):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    page = tmp_path / readme.SCALING.path
    if readme.SCALING_BEGIN not in page.read_text():  # a page from before the scaling part
        with open(page, "a") as f:
            f.write(f"\n## Scaling across nodes\n\n{readme.SCALING_BEGIN}\n{readme.SCALING_END}\n")
    with contextlib.redirect_stdout(io.StringIO()):  # the tests read what their own calls say
        assert readme.main([], root=tmp_path) == 0


def change_record(tmp_path, name, match, median):
    """The newest record of `name` whose line holds every string of `match`, at a new median."""
    path = tmp_path / "results" / name
    lines = path.read_text().splitlines()
    i = max(i for i, line in enumerate(lines) if all(m in line for m in match))
    rec = json.loads(lines[i])
    rec["sec_per_epoch"]["median"] = median
    lines[i] = json.dumps(rec)
    path.write_text("\n".join(lines) + "\n")


def test_a_changed_record_of_another_machine_fails_the_check_on_the_results_page(tmp_path, capsys):
    copy_reference(tmp_path)
    # the newest torch lenet record on the H100 (0.524 s/epoch), the one the table shows
    change_record(tmp_path, "gpu-h100.jsonl", ['"framework": "torch"', '"lenet"'], 0.6)
    parts, _ = readme.fragments(tmp_path)
    assert "| torch scratch | 0.827 | 0.600 ± 0.032 s (n=10) |" in parts[readme.OTHERS]
    files = {n: (tmp_path / n).read_bytes() for n in ("README.md", "docs/results.md")}
    assert readme.main(["--check"], root=tmp_path) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "docs/results.md: the other machines' tables differ from the records; run "
        "`make readme-tables`"
    ]
    assert {n: (tmp_path / n).read_bytes() for n in files} == files  # --check writes nothing
    assert readme.main([], root=tmp_path) == 0
    assert readme.main(["--check"], root=tmp_path) == 0
    after = (tmp_path / "docs/results.md").read_text()
    assert "0.600 ± 0.032 s (n=10)" in after and "0.524 ± 0.032" not in after
    before = files["docs/results.md"].decode()
    head, tail = before.split(readme.OTHERS_BEGIN)[0], before.split(readme.OTHERS_END)[1]
    assert after.startswith(head) and after.endswith(tail)  # only between the markers
    assert (tmp_path / "README.md").read_bytes() == files["README.md"]


def test_a_changed_record_of_the_figure_fails_the_check_until_it_is_drawn_again(tmp_path, capsys):
    copy_reference(tmp_path)
    match = ['"resnet18"', '"framework": "torch"', '"compiled": true', '"amp": "off"']
    change_record(tmp_path, "gpu-h200.jsonl", match, 1.5)
    assert readme.main(["--check"], root=tmp_path) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "README.md: the reference tables differ from the records; run `make readme-tables`",
        "docs/comparison.json: the figure's data differs from the records; run "
        "`make readme-tables`",
        "docs/comparison.png: drawn from other data than the records give; run "
        "`make readme-tables`",
    ]
    assert readme.main([], root=tmp_path) == 0
    assert "docs/comparison.png" in capsys.readouterr().out
    assert readme.main(["--check"], root=tmp_path) == 0
    drawn = json.loads(figure.png_text(tmp_path / readme.FIGURE)[figure.KEY])
    bars = {b["label"]: b for b in drawn["panels"][0]["bars"]}
    assert bars["torch ddp+compiled"]["sec_per_epoch"] == 1.5
    assert drawn == json.loads((tmp_path / readme.FIGURE_DATA).read_text())


def test_a_picture_not_drawn_from_the_records_fails_the_check(tmp_path, capsys):
    """The sidecar alone is not enough: the PNG must hold the same data."""
    copy_reference(tmp_path)
    png = tmp_path / readme.FIGURE
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"tEXt", figure.KEY.encode() + b"\0{}"))
    assert readme.main(["--check"], root=tmp_path) == 1
    assert capsys.readouterr().err.splitlines() == [
        "docs/comparison.png: drawn from other data than the records give; run `make readme-tables`"
    ]
    png.unlink()
    assert readme.main(["--check"], root=tmp_path) == 1
    assert capsys.readouterr().err.splitlines() == [
        "docs/comparison.png: missing; run `make readme-tables`"
    ]
    assert readme.main([], root=tmp_path) == 0 and png.is_file()
    assert readme.main(["--check"], root=tmp_path) == 0


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def test_png_text_reads_every_kind_of_text_chunk(tmp_path):
    path = tmp_path / "a.png"
    info = PngImagePlugin.PngInfo()
    info.add_text("plain", "latin \u00b1")  # tEXt
    info.add_text("packed", "zipped", zip=True)  # zTXt
    info.add_itxt("intl", "\u00b1 utf-8", lang="en")  # iTXt
    info.add_itxt("intlz", "both", zip=True)  # iTXt, compressed
    Image.new("RGB", (2, 2)).save(path, pnginfo=info)
    assert all(kind in path.read_bytes() for kind in (b"tEXt", b"zTXt", b"iTXt"))
    assert figure.png_text(path) == {
        "plain": "latin \u00b1",
        "packed": "zipped",
        "intl": "\u00b1 utf-8",
        "intlz": "both",
    }
    path.write_bytes(b"not a png")
    assert figure.png_text(path) == {}
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"tEXt", figure.KEY.encode() + b"\0{}"))
    assert figure.png_text(path) == {}  # no image header: no PNG, whatever its chunks say


@pytest.mark.parametrize(
    "text, message",
    [
        ("# no markers\n", "README.md needs one line"),
        (f"{readme.END}\n{readme.BEGIN}\n", "README.md needs one line"),
    ],
)
def test_bad_readme_is_one_line_and_untouched(tmp_path, capsys, text, message):
    copy_reference(tmp_path)
    (tmp_path / "README.md").write_text(text)
    assert readme.main([], root=tmp_path) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert (tmp_path / "README.md").read_text() == text


def test_a_results_page_without_its_markers_is_one_line_and_nothing_is_written(tmp_path, capsys):
    copy_reference(tmp_path)
    change_record(tmp_path, "gpu-h200.jsonl", ['"framework": "jax"', '"lenet"'], 0.5)
    (tmp_path / "docs/results.md").write_text("# results, markers gone\n")
    readme_before = (tmp_path / "README.md").read_text()
    assert readme.main([], root=tmp_path) == 2
    err = capsys.readouterr().err
    assert "docs/results.md needs one line <!-- other-machines:begin" in err
    assert len(err.strip().splitlines()) == 1
    assert (tmp_path / "README.md").read_text() == readme_before  # not half the job either


def test_bad_records_are_one_line_and_leave_the_files_alone(tmp_path, capsys):
    copy_reference(tmp_path)
    path = tmp_path / "results" / "cpu-2core.jsonl"
    bad_line = len(path.read_text().splitlines()) + 1
    with open(path, "a") as f:
        f.write(fixture_records.MALFORMED)
    before = {n: (tmp_path / n).read_bytes() for n in ("README.md", "docs/results.md")}
    assert readme.main([], root=tmp_path) == 2
    err = capsys.readouterr().err
    assert f"cpu-2core.jsonl:{bad_line}: bad results line" in err
    assert len(err.strip().splitlines()) == 1
    assert {n: (tmp_path / n).read_bytes() for n in before} == before
    (tmp_path / "results" / "gpu-h100.jsonl").unlink()
    assert readme.main([], root=tmp_path) == 2
    assert "gpu-h100.jsonl: no such results file" in capsys.readouterr().err
