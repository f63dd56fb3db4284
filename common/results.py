"""Result records, an append-only JSON Lines store, and environment metadata (docs/design.md).

One run appends one line. An append writes the whole line at the end of a file opened with
O_APPEND, under an exclusive lock, and cuts the file back to its old size if any of it fails (a
full disk, an interrupt), so concurrent writers and a failed or interrupted run never leave half
a line; the loader names the file and line of anything it cannot read.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import math
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from common import devices

DEFAULT_PATH = Path("results/results.jsonl")
FRAMEWORKS = ("torch", "jax", "mxnet")
SCHEMA_VERSION = 1


class ResultsError(ValueError):
    """An unreadable results file or record: the message names file:line."""


@dataclass
class Record:
    framework: str
    workload: str
    strategy: str
    devices: int
    platform: str  # "gpu" or "cpu"
    virtual: bool  # True: virtual CPU devices sharing the host's cores
    device_names: list[str]
    preset: str
    batch_size: int
    lr: float
    epochs: int | None = None
    # {"median", "mean", "std", "min", "max", "n"}: per epoch (lenet, resnet18) ...
    sec_per_epoch: dict | None = None
    # ... or per repeat of `num_batches` training steps (resnet50)
    seconds: dict | None = None
    warmup_seconds: float | None = None
    images_per_sec: float | None = None
    test_acc: float | None = None
    test_acc_per_epoch: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    extrapolated: bool = False  # True: the epoch time is projected from fewer steps
    steps_timed: int | None = None  # steps actually run per epoch when extrapolated
    split_size: int | None = None
    diverged_at_epoch: int | None = None  # the epoch whose loss went non-finite; training stopped
    # model FLOPs per image, achieved TFLOP/s and the fraction of peak (common.flops.record_fields)
    flops: dict | None = None
    extra: dict = field(default_factory=dict)  # workload-specific: memory, utilisation, ...
    versions: dict = field(default_factory=dict)
    hardware: dict = field(default_factory=dict)
    git_commit: str | None = None
    timestamp: str = ""
    schema: int = SCHEMA_VERSION

    def __post_init__(self):
        if self.framework not in FRAMEWORKS:
            raise ResultsError(f"unknown framework {self.framework!r}")
        if self.sec_per_epoch is None and self.seconds is None:
            raise ResultsError("a record needs sec_per_epoch or seconds")
        if not self.timestamp:
            self.timestamp = utc_now()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Record:
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [f.name for f in dataclasses.fields(cls) if _required(f) and f.name not in d]
        if missing:
            raise ResultsError(f"missing field(s) {', '.join(missing)}")
        return cls(**{k: v for k, v in d.items() if k in names})


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def utc_now() -> str:
    """A record's timestamp: UTC, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def append(record: Record, path: str | os.PathLike = DEFAULT_PATH) -> Path:
    """Append `record` as one line, all or nothing (append_line)."""
    return append_line(record.to_dict(), path)


def append_line(data: dict, path: str | os.PathLike) -> Path:
    """Append `data` (a record's dict, or a probe's) to `path` as one line, under an exclusive
    lock: all of it or, on a failed write (a full disk), none of it and a ResultsError."""
    path = Path(path)
    # A diverged run's nan/inf become null: JSON has no such numbers, and the record is kept.
    line = (json.dumps(_finite(data), sort_keys=True, allow_nan=False) + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
        raise ResultsError(_not_written(path, e)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        # A previous writer killed mid-write (not by us) could leave no newline; start fresh.
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        _write_whole(fd, line, size, path)
    finally:
        os.close(fd)  # closing releases the lock
    return path


def _write_whole(fd: int, line: bytes, size: int, path: Path) -> None:
    """Write `line` at the end of `fd` (`size` bytes before it) and sync it; on any failure,
    an interrupt included, cut the file back to `size`, so no part of the line stays."""
    done = 0
    try:
        while done < len(line):
            written = os.write(fd, line[done:])
            if written <= 0:  # a regular file takes nothing only when it cannot grow
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            done += written
        os.fsync(fd)  # a network or full filesystem may say only here that the data is lost
    except BaseException as e:
        try:
            os.ftruncate(fd, size)
        except OSError as cut:
            raise ResultsError(
                f"{_not_written(path, e)}; and the part written could not be removed "
                f"({cut.strerror}): delete the last line of {path} by hand"
            ) from None
        if isinstance(e, OSError):
            raise ResultsError(_not_written(path, e)) from None
        raise


def _not_written(path: Path, e: OSError) -> str:
    """One line: why the record is not in `path`, and what to do."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        what = "no space left on device" if e.errno == errno.ENOSPC else "disk quota exceeded"
        return f"{what} writing {path}: the record was not written; free space and run again"
    return (
        f"cannot write {path} ({e.strerror or e}): the record was not written; "
        "choose another --results (RESULTS=) and run again"
    )


def _finite(value):
    """`value` with every non-finite float (nan, inf) replaced by None, at any depth."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def check_writable(path) -> None:
    """Refuse, before any training, a results path that could not be appended to."""
    path = Path(path)
    _check_reachable(path)
    if path.is_symlink():  # appending follows the link and makes no folder on the way
        target = Path(os.path.realpath(path))
        if not target.parent.is_dir():
            raise ResultsError(
                f"results file {path} links to {target}, whose folder does not exist; "
                "choose another --results (RESULTS=)"
            )
        path = target
    parent = next((p for p in path.parents if p.exists()), Path("."))
    problem = None
    if path.exists() and not path.is_file():
        problem = "is not a file"
    elif path.exists() and not os.access(path, os.W_OK):
        problem = "is not writable"
    elif not parent.is_dir():
        problem = f"cannot be created: {parent} is not a folder"
    elif not os.access(parent, os.W_OK | os.X_OK):
        problem = f"cannot be created: {parent} is not writable"
    if problem:
        raise ResultsError(f"results file {path} {problem}; choose another --results (RESULTS=)")


def _check_reachable(path: Path) -> None:
    """Refuse a path that cannot be followed: a loop of symbolic links (the path's own, or a
    folder's on the way to it), which the checks below would take for a file yet to be made
    and the append after the run would fail on; a folder this user may not enter."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return  # a file yet to be made, or a file where a folder should be: said below
        why = "a loop of symbolic links is on its way" if e.errno == errno.ELOOP else e.strerror
        raise ResultsError(
            f"results file {path} cannot be reached ({why}); choose another --results (RESULTS=)"
        ) from None


# Lines of a results file that are not training records (a file may hold both).
OTHER_KINDS = ("allreduce",)


def load(paths, skip_bad: bool = False, warnings: list[str] | None = None) -> list[Record]:
    """All records in `paths`. A bad line raises ResultsError naming file:line, or with
    `skip_bad` is left out and described in `warnings`."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    records = []
    for path in map(Path, paths):
        if not path.is_file():
            raise ResultsError(f"{path}: no such results file")
        with path.open("rb") as f:  # bytes: one undecodable line must not lose the others
            for number, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                try:
                    data = printable(json.loads(raw.decode("utf-8")))
                    if not isinstance(data, dict):
                        raise ResultsError("not a JSON object")
                    if data.get("workload") in OTHER_KINDS:
                        continue  # the collectives benchmark's: compare/collectives.py reads it
                    records.append(Record.from_dict(data))
                # ValueError: a number past Python's digit limit (json's own errors are one);
                # RecursionError: brackets nested past the parser's stack.
                except (
                    UnicodeDecodeError,
                    ValueError,
                    RecursionError,
                    ResultsError,
                    TypeError,
                ) as e:
                    message = f"{path}:{number}: bad results line ({_short(e)})"
                    if not skip_bad:
                        raise ResultsError(message) from None
                    if warnings is not None:
                        warnings.append(message)
    return records


# JSON can hold what no font draws and no page should carry: a lone surrogate (`"\ud800"`),
# control characters (NUL, ESC and its terminal sequences). A record is read as text to show.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
SURROGATE = re.compile(r"[\ud800-\udfff]")


MAX_DEPTH = 32  # a record nests a few levels; deeper is no record, and would recurse later


def printable(value, depth: int = 0):
    """`value` (a record's JSON) with its strings printable: each control character a space
    (as the report's escapes make it), each lone surrogate `?`. Nested past MAX_DEPTH: refused."""
    if depth > MAX_DEPTH:
        raise ResultsError(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        return SURROGATE.sub("?", CONTROL.sub(" ", value))
    if isinstance(value, dict):
        return {printable(k): printable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [printable(v, depth + 1) for v in value]
    return value


def _short(e: Exception) -> str:
    if isinstance(e, UnicodeDecodeError):  # binary or another encoding: say so plainly
        return f"not UTF-8 text: byte 0x{e.object[e.start]:02x} at column {e.start + 1}"
    return str(e).splitlines()[0][:200]


COMMIT_ENV = "RESULTS_GIT_COMMIT"


def short_commit(commit: str | None) -> str:
    """`commit` as git_commit writes it: a full SHA ($RESULTS_GIT_COMMIT may give all 40
    characters) shortened to 12; `-dirty` and anything else kept as they are."""
    commit = commit or "unknown"
    return commit[:12] if re.fullmatch(r"[0-9a-f]{40}", commit) else commit


def git_commit() -> str | None:
    """$RESULTS_GIT_COMMIT when set (a copy of the tree, whose .git may be stale or absent),
    else the checkout's commit, with `-dirty` when tracked files outside results/ have
    uncommitted changes."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    # Appending to a committed results file is not a change of the code that made the record.
    dirty = subprocess.run(
        [
            "git",
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ":(top)",
            ":(top,exclude)results",
        ],
        capture_output=True,
        text=True,
        timeout=10,
        cwd=Path(__file__).resolve().parent,
    ).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_details() -> list[dict]:
    """Name, memory and driver of each GPU, from nvidia-smi (empty without one)."""
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,memory.total,driver_version",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            rows.append({"name": parts[0], "memory": parts[1], "driver": parts[2]})
    return rows


def environment(framework_versions: dict[str, str]) -> tuple[dict, dict]:
    """(versions, hardware) for a record: what produced a number, and on what."""
    import numpy

    versions = {
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        **framework_versions,
    }
    hardware = {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_isa": devices.cpu_isa(),  # one CPU name, several ISAs: timings differ by it
        "isa_caps": devices.isa_caps(),
        "gpus": gpu_details(),
        "host_platform": f"{sys.platform}-{platform.machine()}",
        "accelerators_visible": devices.count_accelerators(),
    }
    return versions, hardware
