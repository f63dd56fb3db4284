import dataclasses
import errno
import json
import multiprocessing
import os
import signal
import subprocess
import sys

import pytest

from common import devices, results


def make(**kw) -> results.Record:
    base = dict(
        framework="torch",
        workload="lenet",
        strategy="scratch",
        devices=2,
        platform="cpu",
        virtual=True,
        device_names=["cpu", "cpu"],
        preset="smoke",
        batch_size=256,
        lr=0.2,
        epochs=1,
        sec_per_epoch={"median": 1.0, "mean": 1.0, "std": 0.0, "min": 1.0, "max": 1.0, "n": 1},
        test_acc=0.5,
        train_loss=[2.3],
    )
    base.update(kw)
    return results.Record(**base)


def test_round_trip(tmp_path):
    path = tmp_path / "r.jsonl"
    a, b = make(), make(framework="jax", split_size=3)
    results.append(a, path)
    results.append(b, path)
    assert results.load(path) == [a, b]


@pytest.mark.parametrize(
    "bad",
    [b'{"framework": "torch", "workl\n', b"\x89PNG\x1a\xff\xfe\x00 binary\n", b'{"a": "\xe9"}\n'],
    ids=["malformed json", "binary", "latin-1"],
)
def test_bad_line_is_reported_with_file_and_line(tmp_path, bad):
    """A malformed or undecodable line is one bad line: the lines around it still load."""
    path = tmp_path / "r.jsonl"
    results.append(make(), path)
    with path.open("ab") as f:
        f.write(bad)
    results.append(make(), path)
    with pytest.raises(results.ResultsError, match=r"r\.jsonl:2: bad results line"):
        results.load(path)
    warnings = []
    assert len(results.load(path, skip_bad=True, warnings=warnings)) == 2
    assert len(warnings) == 1 and ":2:" in warnings[0]
    if bad != b'{"framework": "torch", "workl\n':
        assert "(not UTF-8 text: byte 0x" in warnings[0]


@pytest.mark.parametrize(
    "bad, why",
    [
        (b'{"devices": ' + b"9" * 5000 + b"}\n", "Exceeds the limit"),
        (b"[" * 100_000 + b"]" * 100_000 + b"\n", "maximum recursion depth"),
        (None, "nested deeper than 32 levels"),
    ],
    ids=["5000 digits", "100000 brackets", "extra nests 900 objects"],
)
def test_lines_that_break_the_parser_are_bad_lines(tmp_path, bad, why):
    """A number past Python's digit limit (ValueError), brackets past the parser's stack
    (RecursionError), and a record nested past MAX_DEPTH (which would recurse wherever it is
    read) are bad lines like any other: skipped with file:line, the good records kept."""
    if bad is None:
        rec = dataclasses.asdict(make())
        nest = {}
        for _ in range(900):
            nest = {"x": nest}
        rec["extra"] = nest
        bad = (json.dumps(rec) + "\n").encode()
    path = tmp_path / "r.jsonl"
    results.append(make(), path)
    with path.open("ab") as f:
        f.write(bad)
    with pytest.raises(results.ResultsError, match=r"r\.jsonl:2: bad results line"):
        results.load(path)
    warnings = []
    assert len(results.load(path, skip_bad=True, warnings=warnings)) == 1
    assert len(warnings) == 1 and ":2: bad results line" in warnings[0] and why in warnings[0]


def test_record_missing_fields_is_a_bad_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"framework": "torch"}) + "\n")
    with pytest.raises(results.ResultsError, match=r":1: bad results line \(missing field"):
        results.load(path)


def test_unknown_framework_is_refused():
    with pytest.raises(results.ResultsError, match="unknown framework"):
        make(framework="tensorflow")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(results.ResultsError, match="no such results file"):
        results.load(tmp_path / "nope.jsonl")


def writer(path, index, count):
    for i in range(count):
        results.append(make(batch_size=index * 1000 + i, extra={"pad": "x" * 5000}), path)


def test_concurrent_appends_leave_only_whole_lines(tmp_path):
    path = tmp_path / "r.jsonl"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=writer, args=(path, i, 25)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    loaded = results.load(path)
    assert sorted(r.batch_size for r in loaded) == sorted(
        i * 1000 + j for i in range(4) for j in range(25)
    )


def test_interrupted_writer_never_leaves_a_half_line(tmp_path):
    """Kill a writer mid-stream many times over: every line stays whole."""
    path = tmp_path / "r.jsonl"
    code = (
        f"import sys; sys.path.insert(0, {os.getcwd()!r}); "
        f"from tests.common.test_results import writer; writer({str(path)!r}, 7, 10000)"
    )
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", code])
        while not path.exists() or path.stat().st_size < 20000:
            if proc.poll() is not None:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert results.load(path)  # raises on any partial line


def test_environment_metadata():
    versions, hardware = results.environment({"torch": "x"})
    assert versions["torch"] == "x" and "numpy" in versions and "python" in versions
    assert hardware["cpu"] and hardware["cpu_count"] >= 1
    # the ISA and any cap on it: they change the kernels, so the timings and the rounding
    assert hardware["cpu_isa"] == devices.cpu_isa()
    assert hardware["isa_caps"] == devices.isa_caps()


def test_git_commit_comes_from_the_environment_when_set(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "__file__", str(tmp_path / "results.py"))  # no .git above
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    monkeypatch.delenv(results.COMMIT_ENV, raising=False)
    assert results.git_commit() is None
    monkeypatch.setenv(results.COMMIT_ENV, "abc123")
    assert results.git_commit() == "abc123"
    monkeypatch.undo()  # back in this checkout, the variable still wins over git
    monkeypatch.setenv(results.COMMIT_ENV, "abc123")
    assert results.git_commit() == "abc123"


def test_short_commit_shortens_a_full_sha_only():
    sha = "c84edd97b8c348a8610b24fe20425e586f2efd38"  # as $RESULTS_GIT_COMMIT may give it
    assert results.short_commit(sha) == "c84edd97b8c3"
    assert results.short_commit("c84edd97b8c3-dirty") == "c84edd97b8c3-dirty"  # kept whole
    assert results.short_commit(None) == "unknown"


def test_appending_to_a_committed_results_file_is_not_dirty(tmp_path, monkeypatch):
    def git(*args):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=tmp_path,
            check=True,
            capture_output=True,
        )

    (tmp_path / "common").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "common" / "code.py").write_text("x = 1\n")
    (tmp_path / "results" / "ref.jsonl").write_text("{}\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "init")
    monkeypatch.setattr(results, "__file__", str(tmp_path / "common" / "results.py"))
    monkeypatch.delenv(results.COMMIT_ENV, raising=False)
    clean = results.git_commit()
    assert clean and not clean.endswith("-dirty")
    with open(tmp_path / "results" / "ref.jsonl", "a") as f:
        f.write("{}\n")
    assert results.git_commit() == clean
    (tmp_path / "common" / "code.py").write_text("x = 2\n")
    assert results.git_commit() == clean + "-dirty"


# --- a full disk: the append is all or nothing ----------------------------------------------------


def failing_writes(monkeypatch, path, *steps):
    """os.write on `path` follows `steps`, one per call: a number writes that many bytes of what
    it is given, an exception is raised; other files are written as usual."""
    write, todo = os.write, list(steps)

    def fake(fd, data):
        if todo and os.readlink(f"/proc/self/fd/{fd}") == str(path):
            step = todo.pop(0)
            if isinstance(step, BaseException):
                raise step
            return write(fd, bytes(data)[:step])
        return write(fd, data)

    monkeypatch.setattr(os, "write", fake)


ENOSPC = OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize(
    "steps",
    [(500, ENOSPC), (ENOSPC,), (0,), (500, 0)],
    ids=["half a line, then full", "full", "nothing taken", "half a line, then nothing"],
)
def test_a_full_disk_leaves_the_file_as_it_was_and_says_what_to_do(tmp_path, monkeypatch, steps):
    path = tmp_path / "r.jsonl"
    results.append(make(), path)
    before = path.read_bytes()
    failing_writes(monkeypatch, path, *steps)
    with pytest.raises(results.ResultsError) as raised:
        results.append(make(extra={"pad": "x" * 1000}), path)
    assert str(raised.value) == (
        f"no space left on device writing {path}: the record was not written; free space and "
        "run again"
    )
    assert path.read_bytes() == before
    monkeypatch.undo()
    results.append(make(batch_size=7), path)  # the file is whole: the next append lands after it
    assert [r.batch_size for r in results.load(path)] == [256, 7]


def test_a_failed_sync_takes_the_line_back(tmp_path, monkeypatch):
    """A network filesystem may report the lost data only when it is synced."""
    path = tmp_path / "r.jsonl"
    results.append(make(), path)
    before = path.read_bytes()

    def fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(results.ResultsError, match=r"cannot write .*r\.jsonl \(Input/output e"):
        results.append(make(), path)
    assert path.read_bytes() == before


def test_an_interrupt_mid_write_takes_the_line_back(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    results.append(make(), path)
    before = path.read_bytes()
    failing_writes(monkeypatch, path, 300, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        results.append(make(), path)
    assert path.read_bytes() == before


def test_a_results_file_that_cannot_be_opened_is_one_line(tmp_path):
    (tmp_path / "f").write_text("a file")
    with pytest.raises(results.ResultsError, match="cannot write .*: the record was not written"):
        results.append(make(), tmp_path / "f" / "r.jsonl")
