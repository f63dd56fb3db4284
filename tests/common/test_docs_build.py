"""`make docs` (tools/docs_build.py with tools/docs_hook.py and tools/docs_screenshot.py) on small
sites of planted pages and records, built with the project's mkdocs.yml: what a record carries
reaches a page as text and nothing of it runs; a broken page fails the build in one line; the
tables draw their records by one rule; builds at once, and a stopped one, leave one whole site
and nothing else."""

import html
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the site is built with mkdocs (.venv/base)")

from common import processes  # noqa: E402
from common.results import Record  # noqa: E402
from tools import docs_build, docs_hook, docs_screenshot  # noqa: E402

ROOT = docs_build.ROOT
CHROMIUM = pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="needs chromium (apt-get install chromium; .ci/run installs it)",
)
PAGE = "lessons/resnet18.md"  # the page the picture is taken of


def record(devices: int, median: float, **kw) -> dict:
    """A resnet18 record that the report reads (compare/checks.py), on a core per device."""
    extra = {"cores_per_device": 1, "execution": "processes" if devices > 1 else "single"}
    fields = dict(
        framework="torch",
        workload="resnet18",
        strategy="ddp",
        devices=devices,
        platform="cpu",
        virtual=False,
        device_names=["cpu"] * devices,
        preset="cpu",
        batch_size=256 * devices,
        lr=0.1 * devices,
        epochs=3,
        sec_per_epoch={"median": median, "mean": median, "std": 0.1, "n": 3},
        test_acc=0.5,
        extra=extra | kw.pop("extra", {}),
        versions={"torch": "2.0"} | kw.pop("versions", {}),
        hardware={"cpu": "Test CPU", "cpu_isa": "avx2", "cpu_count": 2} | kw.pop("hardware", {}),
        git_commit="0123456789ab",
        timestamp="2026-01-01T00:00:00+00:00",
    )
    return Record(**(fields | kw)).to_dict()


def write_records(path: Path, *recs: dict) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def site_config(tmp_path: Path, page: str) -> Path:
    """mkdocs.yml for a site of `page` alone (as lessons/resnet18.md), the project's otherwise."""
    (tmp_path / "docs" / "lessons").mkdir(parents=True, exist_ok=True)
    (tmp_path / "docs" / PAGE).write_text(f"# A page\n\n{page}\n")
    config = tmp_path / "mkdocs.yml"
    settings = {
        "INHERIT": str(ROOT / "mkdocs.yml"),
        "docs_dir": "docs",
        "hooks": [str(ROOT / "tools" / "docs_hook.py")],
        "extra_css": [],
        "nav": [{"Page": PAGE}],
    }
    config.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in settings.items()))
    return config


def table(records: Path) -> str:
    return f'--8<-- "{records}:resnet18"'


def make_docs(config: Path, site: Path, capsys) -> tuple[int, list[str], list[str]]:
    """docs_build's exit code, and its lines on stdout and stderr."""
    code = docs_build.run(["--config-file", str(config), "--site", str(site)])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


@pytest.fixture
def listener():
    """An HTTP server on loopback: its address, and the paths it is asked for."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", asked
    server.shutdown()
    server.server_close()


def hostile(url: str) -> dict:
    """A record's fields that, as markup, would run a script, call `url` or make a link."""
    return {
        "hardware": {"cpu": f"<img src=x onerror=\"fetch('{url}/img')\">"},
        "versions": {"torch": f"<script>fetch('{url}/script')</script>"},
        "strategy": "[x](javascript:alert(1))",
        "git_commit": "&lt;b&gt;0123",
    }


def test_record_strings_reach_the_page_as_text(tmp_path):
    """In the speed table, and in the accuracy table, its curves' alternative text and numbers."""
    fields = hostile("http://127.0.0.1:9") | {"test_acc_per_epoch": [0.5]}
    records = write_records(
        tmp_path / "r.jsonl", record(1, 8.0, **fields), record(2, 5.0, **fields)
    )
    page = f"{table(records)}\n\n{accuracy(records)}"
    assert docs_build.build(site_config(tmp_path, page), tmp_path / "site") == []
    page = (tmp_path / "site" / "lessons" / "resnet18.html").read_text()
    assert "<script>fetch" not in page and "<img src=x" not in page
    assert 'href="javascript:' not in page
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    for value in ("<script>fetch(", "<img src=x onerror=", "torch [x](javascript:alert(1))"):
        assert value in text, value  # shown as it is
    assert "&lt;b&gt;0123" in text


def plant_bad_line(path: Path) -> None:
    with path.open("a") as f:
        f.write("not JSON\n")


def plant_wrong_type(path: Path) -> None:
    lines = path.read_text().splitlines()
    wrong = json.loads(lines[1]) | {"devices": "two"}
    path.write_text("\n".join([lines[0], json.dumps(wrong), *lines[2:]]) + "\n")


def plant_script_in_execution(path: Path) -> None:
    lines = path.read_text().splitlines()
    wrong = json.loads(lines[1])
    wrong["extra"]["execution"] = "<script>fetch('http://127.0.0.1:9/x')</script>"
    path.write_text("\n".join([lines[0], json.dumps(wrong), *lines[2:]]) + "\n")


def plant_binary(path: Path) -> None:
    with path.open("ab") as f:
        f.write(b"\xff\xfe{}\n")


@pytest.mark.parametrize(
    "page, plant, says",
    [
        ('--8<-- "torch_impl/lenet.py:nonexistent"', None, "torch_impl/lenet.py defines no "),
        ('--8<-- "torch_impl/no_such_file.py:ddp"', None, "cannot read torch_impl/no_such_file"),
        ('--8<-- "torch_impl/resnet18.py:ResNet18.nope"', None, "defines no ResNet18.nope"),
        ('--8<-- "{path}:no_such_workload"', None, "has no no_such_workload runs on 1 and 2"),
        ('--8<-- "{path}:resnet18:accuracy"', None, "has no resnet18 runs on 1 or 2 devices test"),
        ("{moved}", None, "moved.jsonl: no such results file"),
        ("{records}", plant_bad_line, "r.jsonl:3: bad results line (Expecting value"),
        ("{records}", plant_binary, "r.jsonl:3: bad results line (not UTF-8 text"),
        ("{records}", plant_wrong_type, "r.jsonl:2: devices must be a whole number"),
        ("{records}", plant_script_in_execution, "r.jsonl:2: extra.execution must be one of"),
    ],
    ids=[
        "snippet",
        "source",
        "method",
        "workload",
        "untested",
        "records-moved",
        "bad-line",
        "binary",
        "wrong-type",
        "execution",
    ],
)
def test_a_broken_page_fails_the_build_in_one_line(tmp_path, capsys, page, plant, says):
    records = write_records(tmp_path / "r.jsonl", record(1, 8.0), record(2, 5.0))
    if plant:
        plant(records)
    page = page.format(records=table(records), moved=table(tmp_path / "moved.jsonl"), path=records)
    site = tmp_path / "build" / "site"
    code, out, err = make_docs(site_config(tmp_path, page), site, capsys)
    assert code == 1
    assert len(err) == 1 and says in err[0] and "docs/lessons/resnet18.md" in err[0], err
    assert not site.exists() and list(site.parent.iterdir()) == []  # nothing half-built left


def test_quiet_does_not_hide_a_broken_page(tmp_path):
    """mkdocs itself (`mkdocs build --quiet`, without make docs) fails on a missing name too."""
    config = site_config(tmp_path, '--8<-- "torch_impl/lenet.py:nonexistent"')
    done = subprocess.run(
        [Path(sys.executable).parent / "mkdocs", "build", "--quiet", "-f", config],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert done.returncode != 0
    assert "torch_impl/lenet.py defines no nonexistent" in done.stderr


def rows(page: Path | str) -> list[list[str]]:
    """The cells of each row of the page's table, as text."""
    found = re.findall(r"<tr>(.*?)</tr>", page if isinstance(page, str) else page.read_text(), re.S)
    cells = [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S) for row in found]
    return [[html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in row] for row in cells]


def tables(page: Path) -> list[list[list[str]]]:
    """The rows of each of the page's tables."""
    return [rows(t) for t in re.findall(r"<table>.*?</table>", page.read_text(), re.S)]


def test_the_table_draws_clean_commits_the_newest_record_per_cell_and_medians(tmp_path, capsys):
    """The same rule as the report's: a -dirty record is left out, a cell shows its newest
    record, BatchNorm over the whole batch is labelled, and each time is the run's median."""
    later = {"timestamp": "2026-02-01T00:00:00+00:00"}
    sync = {"framework": "jax", "strategy": "sharding", "versions": {"jax": "0.5"}}
    records = write_records(
        tmp_path / "r.jsonl",
        record(1, 8.0, **later) | {"sec_per_epoch": {"median": 8.0, "mean": 20.0, "n": 3}},
        record(1, 10.0),  # later in the file, but older: the record above is its cell's newest
        record(2, 5.0),
        record(2, 1.0, git_commit="0123456789ab-dirty", **later),  # newer, but dirty
        record(1, 6.0, **sync),
        record(2, 4.0, **sync, extra={"execution": "concurrent", "batch_norm": "sync"}),
    )
    code, _, err = make_docs(site_config(tmp_path, table(records)), tmp_path / "site", capsys)
    assert code == 0, err
    page = tmp_path / "site" / "lessons" / "resnet18.html"
    shown = {row[0]: row for row in rows(page)[1:]}
    assert shown["torch ddp"][3:6] == ["8", "5", "1.60x"], shown
    assert shown["jax sharding+sync-bn"][3:6] == ["6", "4", "1.50x"], shown
    assert "dirty" not in page.read_text()


def trained(devices: int, accs: list[float], **kw) -> dict:
    """A resnet18 record tested after each of its epochs, `accs`."""
    fields = dict(test_acc=accs[-1], test_acc_per_epoch=accs, epochs=len(accs))
    return record(devices, 8.0 / devices, **(fields | kw))


ON_A_GPU = {  # a GPU's run: its hardware, the full preset, no core of its own per device
    "platform": "gpu",
    "preset": "full",
    "device_names": ["Test GPU"],
    "hardware": {"gpus": [{"name": "Test GPU"}]},
    "extra": {"cores_per_device": None},
}
JAX = {"framework": "jax", "strategy": "sharding", "versions": {"jax": "0.5"}}


def accuracy(*paths: Path) -> str:
    return f'--8<-- "{",".join(map(str, paths))}:resnet18:accuracy"'


def build_learning(tmp_path: Path, capsys, name: str, *paths: Path) -> tuple[Path, bytes]:
    """The page of `paths`' accuracy table and curves, built into a site of its own; the
    picture's bytes."""
    code, _, err = make_docs(site_config(tmp_path, accuracy(*paths)), tmp_path / name, capsys)
    assert code == 0, err
    page = tmp_path / name / "lessons" / "resnet18.html"
    src = re.search(r'<img src="([^"]+)" alt="([^"]*)"', page.read_text())
    assert src and "torch ddp, 2 devices" in html.unescape(src[2]), "no picture, or no alt text"
    return page, (page.parent / src[1]).read_bytes()


def test_the_accuracy_and_its_curves_come_from_the_records(tmp_path, capsys):
    """Each run's accuracy on 1 and 2 devices, a column per records file, and the curves of
    every epoch: drawn by the tables' rule (a -dirty record is not drawn), from the records
    (a record changed, the table and the picture change), at chance labelled so."""
    later = {"timestamp": "2026-02-01T00:00:00+00:00"}
    dirty = trained(2, [0.9, 0.95, 0.99], git_commit="0123456789ab-dirty", **later)
    clean = [trained(1, [0.3, 0.5, 0.7]), trained(2, [0.3, 0.55, 0.72])]
    gluon = 'gluon"><b>x</b>'  # a record's string, which no attribute or tag may take in
    chance = trained(1, [0.1, 0.11, 0.12], framework="mxnet", strategy=gluon)
    gpu = write_records(tmp_path / "gpu.jsonl", trained(1, [0.6, 0.8], **JAX, **ON_A_GPU))
    cpu = write_records(tmp_path / "cpu.jsonl", *clean, dirty, chance)
    page, picture = build_learning(tmp_path, capsys, "site", cpu, gpu)
    (head, *accs), *epochs = tables(page)  # the curves' numbers: a table per file
    assert head[1:] == ["Test CPU, 2 corespreset cpu, 3 epochs", "Test GPUpreset full, 2 epochs"]
    assert accs == [
        ["torch ddp", "0.700 / 0.720", "–"],
        ["jax sharding", "–", "0.800 / –"],
        [f"mxnet {gluon}", "0.120 (chance) / –", "–"],
    ]
    assert epochs == [
        [
            ["run", "devices", "1", "2", "3"],
            ["torch ddp", "1", "0.300", "0.500", "0.700"],
            ["torch ddp", "2", "0.300", "0.550", "0.720"],
            [f"mxnet {gluon}", "1", "0.100", "0.110", "0.120"],
        ],
        [["run", "devices", "1", "2"], ["jax sharding", "1", "0.600", "0.800"]],
    ]
    assert "dirty" not in page.read_text() and "0.990" not in page.read_text()
    assert "<b>x" not in page.read_text()

    write_records(cpu, *clean, chance)  # the dirty record gone: the same picture
    same = build_learning(tmp_path, capsys, "clean", cpu, gpu)[1] == picture
    assert same, "the picture drew the -dirty record"
    write_records(cpu, clean[0], trained(2, [0.3, 0.6, 0.72]), dirty, chance)
    page, changed = build_learning(tmp_path, capsys, "changed", cpu, gpu)
    assert changed != picture, "the picture is not drawn from the records"
    assert ["torch ddp", "2", "0.300", "0.600", "0.720"] in tables(page)[1]


@pytest.mark.parametrize("acc, shown", [(0.12, False), (0.5, True)], ids=["chance", "learnt"])
def test_an_accuracy_at_chance_is_left_out_of_the_speed_table(tmp_path, acc, shown):
    """Left out where every run's is at chance, else each at chance labelled so."""
    records = write_records(
        tmp_path / "r.jsonl", record(1, 8.0, test_acc=acc), record(2, 5.0, test_acc=0.11)
    )
    lines = docs_hook._scaling_table(str(records), "resnet18").splitlines()
    head, row, note = lines[2], lines[4], lines[6]
    assert ("| test accuracy, 1 / 2 devices |" in head) == shown, head
    assert (f"| {acc:.3f} / 0.110 (chance) |" in row) == shown, row
    assert ("every run's is at chance" in note) != shown, note


@CHROMIUM
def test_the_picture_is_taken_offline_and_not_as_root(tmp_path, listener):
    """A page that calls out (a script, an image) calls nobody while its picture is taken."""
    (url, asked), site = listener, tmp_path / "site"
    (site / "lessons").mkdir(parents=True)
    calls = f"<script>fetch('{url}/script')</script><img src='{url}/img'>"
    (site / docs_screenshot.PAGE).write_text(f"<html><body><h1>A page</h1>{calls}</body></html>")
    assert docs_screenshot.shoot(site).is_file()
    assert asked == []


@pytest.fixture
def fake_chromium(monkeypatch):
    """A `chromium` on PATH that logs its user and arguments, and, unless its first argument is
    --no-sandbox, says as chromium does without user namespaces that it has no sandbox. The log's
    path."""
    folder = Path(tempfile.mkdtemp())  # not under pytest's folder: `nobody` must reach it
    os.chmod(folder, 0o755)
    log = folder / "calls"
    log.touch(0o666)
    os.chmod(log, 0o666)
    script = folder / "chromium"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$(id -u) $*" >> {log}\n'
        'if [ "$1" != --no-sandbox ]; then echo "FATAL: No usable sandbox!" >&2; exit 1; fi\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    yield log
    shutil.rmtree(folder)


def test_chromium_runs_without_rights_in_its_sandbox_else_without_it(tmp_path, fake_chromium):
    (tmp_path / "site" / "lessons").mkdir(parents=True)
    (tmp_path / "site" / docs_screenshot.PAGE).write_text("<html></html>")
    assert docs_screenshot.browse(tmp_path / "site", docs_screenshot.PAGE).returncode == 0
    calls = [line.split() for line in fake_chromium.read_text().splitlines()]
    assert [args[1] == "--no-sandbox" for args in calls] == [False, True], calls
    assert all(int(args[0]) != 0 for args in calls), "chromium ran as root"
    assert all(set(docs_screenshot.OFFLINE) <= set(args) for args in calls), calls


def test_the_folder_of_a_picture_killed_outright_goes_with_the_next(tmp_path, fake_chromium):
    gone = subprocess.Popen(["true"])  # its pid, once it has ended, is no process's
    gone.wait()
    where = Path("/tmp" if os.geteuid() == 0 else tempfile.gettempdir())
    stale = where / f"{docs_screenshot.HOME}{gone.pid}-planted"
    stale.mkdir()
    (tmp_path / "site").mkdir()
    try:
        docs_screenshot.browse(tmp_path / "site", "page.html")
        assert not stale.exists()
    finally:
        shutil.rmtree(stale, ignore_errors=True)


def wait_for(check, what: str, bound: float = 120) -> None:
    deadline = time.monotonic() + bound
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {bound} s"
        time.sleep(0.02)


def start_make_docs(config: Path, site: Path, tmp: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tools.docs_build", "--config-file", config, "--site", site],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"TMPDIR": str(tmp)},
    )


@pytest.mark.slow
def test_two_builds_at_once_both_end_well_with_one_whole_site(tmp_path):
    records = write_records(tmp_path / "r.jsonl", record(1, 8.0), record(2, 5.0))
    config, site = site_config(tmp_path, table(records)), tmp_path / "build" / "site"
    (tmp_path / "tmp").mkdir()
    runs = [start_make_docs(config, site, tmp_path / "tmp") for _ in range(2)]
    for run in runs:
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0 and err == "" and out.count("\n") == 1, (out, err)
    assert (site / "lessons" / "resnet18.html").is_file()
    assert [p.name for p in site.parent.iterdir()] == ["site"]
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not any(chromium_homes(run.pid) for run in runs)


def test_a_site_is_put_in_place_only_under_the_lock(tmp_path, monkeypatch):
    """Another build's rename under way (the lock held): this one waits, within its bound."""
    monkeypatch.setattr(docs_build, "LOCK_WAIT", 0.2)
    site, new, stage = (tmp_path / "build" / name for name in ("site", "new", "stage"))
    for folder, page in ((site, "old.html"), (new, "new.html")):
        folder.mkdir(parents=True)
        (folder / page).write_text(page)
    stage.mkdir()
    with docs_build.locked(site.parent, 1), pytest.raises(docs_build.DocsError, match="held"):
        docs_build.publish(new, site, stage)
    assert [p.name for p in site.iterdir()] == ["old.html"]
    docs_build.publish(new, site, stage)
    assert [p.name for p in site.iterdir()] == ["new.html"]
    assert [p.name for p in (stage / "previous").iterdir()] == ["old.html"]


def chromium_homes(pid: int) -> list[Path]:
    """The folders chromium was given by make docs of process `pid` (docs_screenshot.browse)."""
    homes = {Path(tempfile.gettempdir()), Path("/tmp")}
    return [p for home in homes for p in home.glob(f"{docs_screenshot.HOME}{pid}-*")]


def chromium_under(pid: int) -> bool:
    """Whether a process that `pid` started runs chromium."""
    for child in processes.descendants(pid):
        try:
            if "chromium" in Path(f"/proc/{child}/cmdline").read_text(errors="replace"):
                return True
        except OSError:  # ended meanwhile
            continue
    return False


@pytest.mark.slow
@pytest.mark.parametrize("step", ["build", pytest.param("picture", marks=CHROMIUM)])
def test_a_stopped_build_leaves_the_previous_site_and_nothing_else(tmp_path, step):
    records = write_records(tmp_path / "r.jsonl", record(1, 8.0), record(2, 5.0))
    config, site = site_config(tmp_path, table(records)), tmp_path / "build" / "site"
    site.mkdir(parents=True)
    (site / "previous.html").write_text("the previous site")
    (tmp_path / "tmp").mkdir()
    run = start_make_docs(config, site, tmp_path / "tmp")
    if step == "build":
        wait_for(
            lambda: any(p.name.startswith(docs_build.STAGE) for p in site.parent.iterdir()), step
        )
    else:
        wait_for(lambda: chromium_under(run.pid), step)
    started = processes.descendants(run.pid)
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 130 and out == "", (out, err)
    assert err.splitlines() == ["interrupted; no record written"], err
    assert [p.name for p in site.parent.iterdir()] == ["site"]
    assert [p.name for p in site.iterdir()] == ["previous.html"]
    assert list((tmp_path / "tmp").iterdir()) == [] and not chromium_homes(run.pid)
    wait_for(lambda: not any(map(docs_screenshot._running, started)), "end of chromium", 10)


def test_lesson_fours_tables_are_drawn_from_the_records_as_text(tmp_path, capsys):
    """`results/X.jsonl:zero:KIND` (tools/docs_memory.py): each of lesson 4's tables from the
    records (tests/compare/fixture_zero.py), a record's strings shown as text; a kind the hook
    does not know fails the build in one line."""
    from tests.compare import fixture_zero

    recs = fixture_zero.records()
    recs[0]["strategy"] = "<script>fetch('http://127.0.0.1:9/x')</script>"
    path = write_records(tmp_path / "zero.jsonl", *recs)
    kinds = ("holds", "memory", "bytes", "time")
    page = "\n\n".join(f'--8<-- "{path}:zero:{kind}"' for kind in kinds)
    assert docs_build.build(site_config(tmp_path, page), tmp_path / "site") == []
    built = tmp_path / "site" / "lessons" / "resnet18.html"
    shown = tables(built)
    assert [t[0][:2] for t in shown] == [["", "each device holds"], ["run", "closed form"]] + [
        ["run", "ZeRO stage"],
        ["run", "N = 1, a core each"],
    ]
    zero2 = shown[0][3]  # the holds table's stages, after its header: DDP, ZeRO-1, ZeRO-2
    assert zero2[:3] == [
        "ZeRO-2",
        "its shard of the gradients and optimizer state",
        "4Ψ + (4 + 8)Ψ/N",
    ]
    assert "<script>fetch" not in built.read_text()
    assert any("torch <script>fetch(" in row[0] for row in shown[3])
    page = f'--8<-- "{path}:zero:nope"'
    code, _, err = make_docs(site_config(tmp_path, page), tmp_path / "b" / "site", capsys)
    assert code == 1 and len(err) == 1 and "no zero table 'nope'" in err[0], err


def test_a_name_against_another_marks_the_lines_that_change(tmp_path):
    """`name~other` (lesson 4's side-by-side grids): the lines of `name` that `other` lacks are
    marked, their comments aside, counted across the block's parts; another file's by path."""
    source = tmp_path / "two.py"
    source.write_text(
        "def ddp(net):\n    a = 1  # one\n    wrapped = wrap(net)\n    return a\n\n\n"
        "def fsdp(net):\n    a = 1\n    shard(net)\n    return a\n"
    )
    block = docs_hook._code(str(source), ["ddp", "fsdp~ddp"])
    assert block.splitlines()[0].endswith('hl_lines="6 8"')  # fsdp's def and shard lines
    block = docs_hook._code(str(source), [f"ddp~{source}:fsdp"])
    assert block.splitlines()[0].endswith('hl_lines="1 3"')
    assert "hl_lines" not in docs_hook._code(str(source), ["ddp"]).splitlines()[0]
