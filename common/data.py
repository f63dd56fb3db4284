"""Fashion-MNIST: find, download, verify, parse IDX, and a seeded batch order (docs/design.md).

Framework-free: every framework gets the same uint8 arrays and the same index sequence.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import http.client
import os
import stat
import struct
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
HOW_TO_GET = (
    f"install the Debian package (apt-get install dataset-fashion-mnist), "
    f"or set FASHION_MNIST_DIR to a folder with the four .gz files from {URL}"
)


@dataclass(frozen=True)
class FileSpec:
    name: str
    gz_md5: str  # upstream .gz; Debian re-compressed, so the decompressed digest is what counts
    sha256: str  # of the decompressed content
    size: int  # bytes decompressed
    magic: int
    shape: tuple[int, ...]


FILES = {
    "train_images": FileSpec(
        "train-images-idx3-ubyte.gz",
        "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        47040016,
        2051,
        (60000, 28, 28),
    ),
    "train_labels": FileSpec(
        "train-labels-idx1-ubyte.gz",
        "25c81989df183df01b3e8a0aad5dffbe",
        "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        60008,
        2049,
        (60000,),
    ),
    "test_images": FileSpec(
        "t10k-images-idx3-ubyte.gz",
        "bef4ecab320f06d8554ea6380940ec79",
        "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        7840016,
        2051,
        (10000, 28, 28),
    ),
    "test_labels": FileSpec(
        "t10k-labels-idx1-ubyte.gz",
        "bb300cfdad3c16e7a12a480ee83cd310",
        "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
        10008,
        2049,
        (10000,),
    ),
}


class DatasetError(RuntimeError):
    """Missing, corrupt or unreadable data: the message is one line saying what to do."""


@dataclass(frozen=True)
class FashionMNIST:
    train_images: np.ndarray  # uint8 (N, 28, 28)
    train_labels: np.ndarray  # uint8 (N,)
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str  # the folder the files came from


def cache_dir() -> Path:
    """The user cache's folder for the dataset; a DatasetError where there is no home folder
    to put it in (HOME unset, and a user id with no entry in /etc/passwd: a container's)."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = Path.home() / ".cache"
        except (RuntimeError, KeyError):  # Path.home(): neither HOME nor a passwd entry
            raise DatasetError(
                f"no cache folder for Fashion-MNIST: HOME is unset and user id {os.getuid()} "
                "has no home folder; set XDG_CACHE_HOME (or HOME) to a writable folder, or "
                "FASHION_MNIST_DIR to a folder with the four .gz files"
            ) from None
    return Path(base) / "multidevice" / "fashion-mnist"


def search_dirs() -> list[Path]:
    """Where to look, in order: $FASHION_MNIST_DIR, the user cache (where there is one), the
    Debian package."""
    dirs = []
    if os.environ.get("FASHION_MNIST_DIR"):
        dirs.append(Path(os.environ["FASHION_MNIST_DIR"]))
    with contextlib.suppress(DatasetError):  # no home, no cache; locate() says so if it must
        dirs.append(cache_dir())
    return [*dirs, DEBIAN_DIR]


def _is_file(path: Path) -> bool:
    """Whether `path` is a file; a folder that cannot be searched is a DatasetError saying so,
    where Path.is_file() raises PermissionError (Python 3.11) or says False (3.13)."""
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        raise DatasetError(
            f"{path.parent}: cannot be read ({e.strerror or e}); fix its permissions or those "
            "of a folder above it (chmod a+rx), or set FASHION_MNIST_DIR to a folder with the "
            "four .gz files"
        ) from None


def find_dir(names=None) -> Path | None:
    """The first folder that holds every file; an explicit FASHION_MNIST_DIR must."""
    names = names or [spec.name for spec in FILES.values()]
    explicit = os.environ.get("FASHION_MNIST_DIR")
    if explicit:
        missing = [n for n in names if not _is_file(Path(explicit) / n)]
        if missing:
            raise DatasetError(
                f"FASHION_MNIST_DIR={explicit} does not hold {', '.join(missing)}; point it at a "
                "folder with the four .gz files, or unset it to search the usual places"
            )
    for d in search_dirs():
        if all(_is_file(d / n) for n in names):
            return d
    return None


def decompress(path: Path, limit: int | None = None) -> bytes:
    """The decompressed content of `path`; past `limit` bytes (the format's size) reading
    stops, so a file that inflates without end (a gzip bomb) costs no more than that."""
    try:
        with gzip.open(path, "rb") as f:
            content = f.read(-1 if limit is None else limit + 1)
    except PermissionError as e:
        raise DatasetError(_unreadable(path, e)) from None
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DatasetError(
            f"{path}: cannot be decompressed ({e}); the file is truncated or corrupt: "
            f"delete it and {HOW_TO_GET}"
        ) from None
    if limit is not None and len(content) > limit:
        raise DatasetError(
            f"{path}: decompresses to more than the {limit} bytes Fashion-MNIST's file has; "
            f"it is not that file: delete it and {HOW_TO_GET}"
        )
    return content


def _unreadable(path: Path, e: OSError) -> str:
    return (
        f"{path}: cannot be read ({e.strerror or e}); fix its permissions (chmod a+r), "
        "or set FASHION_MNIST_DIR to a folder with readable copies"
    )


def _md5(path: Path) -> str:
    """The md5 of the file, read in pieces (the file may be large, whatever it holds)."""
    digest = hashlib.md5()
    try:
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except OSError as e:
        raise DatasetError(_unreadable(path, e)) from None
    return digest.hexdigest()


def verify(path: Path, spec: FileSpec) -> bytes:
    """The decompressed content of `path`, checked against the known size and sha256."""
    content = decompress(path, spec.size)
    # The upstream .gz is proven by its md5; Debian's re-compressed one by the content's sha256.
    upstream = _md5(path) == spec.gz_md5
    if not upstream and (
        len(content) != spec.size or hashlib.sha256(content).hexdigest() != spec.sha256
    ):
        raise DatasetError(
            f"{path}: failed verification (sha256 of the decompressed content does not "
            f"match Fashion-MNIST's); delete it and {HOW_TO_GET}"
        )
    return content


def parse_idx(content: bytes, spec: FileSpec, path: Path) -> np.ndarray:
    """IDX: big-endian magic (2049 labels, 2051 images), counts, then uint8 data."""
    ndim = len(spec.shape)
    header = 4 + 4 * ndim
    if len(content) < header:
        raise DatasetError(f"{path}: too short for an IDX header; {HOW_TO_GET}")
    magic = struct.unpack(">I", content[:4])[0]
    if magic != spec.magic:
        raise DatasetError(f"{path}: IDX magic number {magic}, expected {spec.magic}; {HOW_TO_GET}")
    shape = struct.unpack(f">{ndim}I", content[4:header])
    if tuple(shape) != spec.shape or len(content) != header + int(np.prod(shape)):
        raise DatasetError(
            f"{path}: IDX shape {tuple(shape)} with {len(content) - header} data bytes, "
            f"expected {spec.shape}; {HOW_TO_GET}"
        )
    return np.frombuffer(content, dtype=np.uint8, offset=header).reshape(shape)


# A gzip of the file is never larger than the file itself and a little framing: a reply that
# goes on past this is not the file.
GZIP_SLACK = 1 << 16
DOWNLOAD_DEADLINE_S = 1800.0  # the whole of one file's download, however slowly it trickles


def download(dest: Path, base_url: str = URL, timeout: float = 60.0) -> None:
    """Fetch the files missing from `dest`: each to a temporary file, verified, then renamed."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatasetError(
            f"Fashion-MNIST not found locally and its cache folder {dest} cannot be created "
            f"({e.strerror or e}); set XDG_CACHE_HOME to a writable folder, or {HOW_TO_GET}"
        ) from None
    for spec in FILES.values():
        target = dest / spec.name
        if _is_file(target):
            continue
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{spec.name}.", suffix=".part")
            with os.fdopen(fd, "wb") as out:
                _fetch(base_url + spec.name, out, spec, timeout)
            verify(Path(tmp), spec)
            os.replace(tmp, target)
        except DatasetError as e:  # it names the temporary file, deleted below: say what it was
            why = str(e).removeprefix(f"{tmp}: ").split("; ")[0]
            raise DatasetError(
                f"the downloaded {spec.name} (from {base_url}) {why}; nothing was kept; try "
                f"again, or {HOW_TO_GET}"
            ) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
            raise DatasetError(_download_failed(spec, dest, e)) from None
        finally:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)


def _fetch(url: str, out, spec: FileSpec, timeout: float) -> None:
    """Copy the body at `url` into `out`: each wait for the server bounded by `timeout`, the
    whole by DOWNLOAD_DEADLINE_S, and its size by what a gzip of the file can be."""
    end = time.monotonic() + DOWNLOAD_DEADLINE_S
    size = 0
    with urllib.request.urlopen(url, timeout=timeout) as response:
        while chunk := response.read(1 << 20):
            size += len(chunk)
            if size > spec.size + GZIP_SLACK:
                raise ValueError(f"the reply goes on past {spec.size + GZIP_SLACK} bytes")
            if time.monotonic() > end:
                raise TimeoutError(f"not complete after {DOWNLOAD_DEADLINE_S:.0f} s")
            out.write(chunk)
        if response.length:  # the server promised more than it sent before it closed
            total = size + response.length
            raise ConnectionError(f"the connection closed after {size} of {total} bytes")


def _download_failed(spec: FileSpec, dest: Path, e: Exception) -> str:
    """One line: why the download of `spec` failed, and what to do."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"no space left in {dest} for the download of {spec.name}; nothing was kept; free "
            f"space, set XDG_CACHE_HOME to another folder, or {HOW_TO_GET}"
        )
    reason = str(e).splitlines()[0][:200] if str(e).strip() else type(e).__name__
    return (
        f"Fashion-MNIST not found locally and the download of {spec.name} failed ({reason}); "
        f"{HOW_TO_GET}"
    )


def locate(allow_download: bool = True) -> Path:
    """The folder that holds the four files: found, else (`allow_download`) downloaded into the
    user cache; a DatasetError, one line, if neither."""
    folder = find_dir()
    if folder is None:
        if not allow_download:
            raise DatasetError(f"Fashion-MNIST not found in {_where()}; {HOW_TO_GET}")
        folder = cache_dir()
        download(folder)
    return folder


def load(allow_download: bool = True) -> FashionMNIST:
    """The whole dataset as uint8 arrays, every file verified."""
    folder = locate(allow_download)
    arrays = {}
    for key, spec in FILES.items():
        path = folder / spec.name
        arrays[key] = parse_idx(verify(path, spec), spec, path)
    return FashionMNIST(**arrays, source=str(folder))


def _where() -> str:
    return ", ".join(str(d) for d in search_dirs())


def train_size(subset_size: int | None) -> int:
    """How many training images a run uses (all 60k when `subset_size` is None)."""
    n_all = FILES["train_labels"].shape[0]
    return min(subset_size or n_all, n_all)


def to_float(images: np.ndarray) -> np.ndarray:
    """uint8 (N, 28, 28) -> float32 (N, 1, 28, 28) in [0, 1], channels first (frameworks adapt)."""
    return (images.astype(np.float32) / 255.0)[:, None, :, :]


def as_float(ds, label_dtype=np.int32, channels_last=False) -> list[np.ndarray]:
    """(x_train, y_train, x_test, y_test) of uint8 images as float32 in [0, 1], NCHW (NHWC with
    `channels_last`: JAX's layout), and labels of `label_dtype` (torch's loss wants int64)."""
    x_train, y_train, x_test, y_test = ds
    layout = (0, 2, 3, 1) if channels_last else (0, 1, 2, 3)
    images = [to_float(x).transpose(layout) for x in (x_train, x_test)]
    return [images[0], y_train.astype(label_dtype), images[1], y_test.astype(label_dtype)]


def subset(images: np.ndarray, labels: np.ndarray, n: int | None, seed: int = 0):
    """The first `n` of a seeded permutation, in index order (all when `n` is None)."""
    if n is None or n >= len(labels):
        return images, labels
    if n < 1:
        raise DatasetError(f"subset size must be at least 1, got {n}")
    idx = np.sort(np.random.default_rng(seed).permutation(len(labels))[:n])
    return images[idx], labels[idx]


def load_subsets(train: int | None, test: int | None, seed: int = 0):
    """(train images, train labels, test images, test labels): the preset's subsets."""
    fm = load()
    return (
        *subset(fm.train_images, fm.train_labels, train, seed),
        *subset(fm.test_images, fm.test_labels, test, seed),
    )


def shard_batch(idx: np.ndarray, n_devices: int) -> np.ndarray:
    """A global batch of indices as `n_devices` equal rows, row i for device (or rank) i: the
    data-parallel split. Every batch divides evenly (config.check_epoch_split), never dropped."""
    if len(idx) % n_devices:
        raise ValueError(f"a batch of {len(idx)} does not split over {n_devices} devices")
    return np.asarray(idx).reshape(n_devices, -1)


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The index order of one epoch: a permutation of range(n), the same for every framework."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def batches(n: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Index arrays of one epoch's batches; the last is smaller when batch_size doesn't divide n."""
    order = epoch_order(n, seed, epoch)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def warmup_batches(batches: list[np.ndarray]) -> list[np.ndarray]:
    """One batch of each size in `batches` (the first, and the last when it is shorter): the
    shapes a warm-up must cover so that no compilation or autotuning falls inside an epoch."""
    return list({len(b): b for b in (batches[0], batches[-1])}.values())
