import gzip
import http.server
import os
import shutil
import threading
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from common import data


@pytest.fixture(scope="module")
def dataset():
    if data.find_dir() is None:
        pytest.skip("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
    return data.load(allow_download=False)


def test_real_dataset_shapes_labels_and_balance(dataset):
    assert dataset.train_images.shape == (60000, 28, 28)
    assert dataset.test_images.shape == (10000, 28, 28)
    assert dataset.train_images.dtype == np.uint8
    assert dataset.train_labels.min() == 0 and dataset.train_labels.max() == 9
    assert np.bincount(dataset.train_labels, minlength=10).tolist() == [6000] * 10
    assert np.bincount(dataset.test_labels, minlength=10).tolist() == [1000] * 10


def test_to_float_range_and_layout(dataset):
    x = data.to_float(dataset.test_images[:5])
    assert x.shape == (5, 1, 28, 28) and x.dtype == np.float32
    assert x.min() >= 0.0 and x.max() <= 1.0


@pytest.fixture(scope="module")
def source() -> Path:
    """The real files, found before any test isolates the search path (module scope: first)."""
    src = data.find_dir()
    if src is None:
        pytest.skip("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
    return src


def copy_dataset(src: Path, dest: Path) -> Path:
    for spec in data.FILES.values():
        shutil.copy(src / spec.name, dest / spec.name)
    return dest


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """An empty cache, no Debian copy, FASHION_MNIST_DIR pointing at tmp_path/mnist."""
    folder = tmp_path / "mnist"
    folder.mkdir()
    monkeypatch.setenv("FASHION_MNIST_DIR", str(folder))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(data, "DEBIAN_DIR", tmp_path / "no-debian")
    return folder


def test_truncated_file_is_refused_with_its_name(source, isolated):
    copy_dataset(source, isolated)
    target = isolated / data.FILES["test_labels"].name
    target.write_bytes(target.read_bytes()[:-100])
    with pytest.raises(data.DatasetError, match=r"t10k-labels-idx1-ubyte\.gz.*(truncated|corrupt)"):
        data.load(allow_download=False)


def test_byte_flipped_file_is_refused(source, isolated):
    """Same size, valid gzip, wrong content: only the digest catches it."""
    copy_dataset(source, isolated)
    target = isolated / data.FILES["test_labels"].name
    content = bytearray(gzip.decompress(target.read_bytes()))
    content[5000] ^= 0xFF
    target.write_bytes(gzip.compress(bytes(content)))
    with pytest.raises(data.DatasetError, match=r"t10k-labels.*failed verification"):
        data.load(allow_download=False)


def test_wrong_magic_is_refused(tmp_path):
    spec = data.FILES["test_labels"]
    content = (2051).to_bytes(4, "big") + (10000).to_bytes(4, "big") + bytes(10000)
    with pytest.raises(data.DatasetError, match="magic number 2051, expected 2049"):
        data.parse_idx(content, spec, tmp_path / spec.name)


def test_wrong_shape_is_refused(tmp_path):
    spec = data.FILES["test_labels"]
    content = (2049).to_bytes(4, "big") + (9999).to_bytes(4, "big") + bytes(9999)
    with pytest.raises(data.DatasetError, match="shape"):
        data.parse_idx(content, spec, tmp_path / spec.name)


def test_not_found_offline_says_how_to_get_it(isolated, monkeypatch):
    monkeypatch.delenv("FASHION_MNIST_DIR")
    with pytest.raises(data.DatasetError, match="apt-get install dataset-fashion-mnist"):
        data.load(allow_download=False)


def test_an_explicit_folder_without_the_files_is_an_error_naming_it(source, isolated):
    copy_dataset(source, isolated)
    (isolated / data.FILES["test_labels"].name).unlink()
    with pytest.raises(data.DatasetError, match=r"FASHION_MNIST_DIR=.*mnist does not hold t10k-l"):
        data.load(allow_download=False)


@pytest.fixture
def server(tmp_path):
    """A local HTTP server on 127.0.0.1 serving tmp_path/www."""
    www = tmp_path / "www"
    www.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # no line per request in the test's output
            pass

    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request, client_address):  # a client that hangs up early
            pass

    httpd = Server(("127.0.0.1", 0), partial(Quiet, directory=str(www)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


def test_download_of_truncated_file_leaves_nothing(source, server, tmp_path):
    www, url = server
    copy_dataset(source, www)
    labels = www / data.FILES["test_labels"].name
    labels.write_bytes(labels.read_bytes()[:-50])
    dest = tmp_path / "cache"
    with pytest.raises(data.DatasetError, match="t10k-labels"):
        data.download(dest, base_url=url)
    names = sorted(os.listdir(dest))
    # Files before the bad one landed whole; the bad one and every temporary file are gone.
    assert data.FILES["test_labels"].name not in names
    assert not [n for n in names if n.endswith(".part")]
    for n in names:
        spec = next(s for s in data.FILES.values() if s.name == n)
        data.verify(dest / n, spec)


def test_download_verifies_and_renames(source, server, tmp_path):
    www, url = server
    copy_dataset(source, www)
    dest = tmp_path / "cache"
    data.download(dest, base_url=url)
    assert sorted(os.listdir(dest)) == sorted(s.name for s in data.FILES.values())


def test_unreachable_server_is_a_clear_error(tmp_path):
    with pytest.raises(data.DatasetError, match="download .* failed"):
        data.download(tmp_path / "cache", base_url="http://127.0.0.1:9/", timeout=5)
    assert not [n for n in os.listdir(tmp_path / "cache") if n.endswith(".part")]


def test_epoch_order_is_seeded_permutation():
    a = data.epoch_order(1000, seed=3, epoch=1)
    assert np.array_equal(a, data.epoch_order(1000, seed=3, epoch=1))
    assert np.array_equal(np.sort(a), np.arange(1000))
    assert not np.array_equal(a, data.epoch_order(1000, seed=3, epoch=2))
    assert not np.array_equal(a, data.epoch_order(1000, seed=4, epoch=1))


def test_epoch_order_is_pinned():
    """The order must not change with numpy versions (base env: numpy 2, mxnet env: 1.23)."""
    assert data.epoch_order(10, seed=0, epoch=0).tolist() == PINNED_ORDER


# numpy default_rng([0, 0]).permutation(10): PCG64 streams are stable across numpy versions.
PINNED_ORDER = [4, 6, 2, 7, 3, 5, 9, 0, 8, 1]


def test_batches_cover_every_index_once():
    parts = data.batches(1000, 256, seed=0, epoch=0)
    assert [len(p) for p in parts] == [256, 256, 256, 232]
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(1000))


def test_subset_is_seeded_and_sorted():
    images = np.arange(100).reshape(100, 1, 1)
    labels = np.arange(100)
    x, y = data.subset(images, labels, 10, seed=1)
    x2, y2 = data.subset(images, labels, 10, seed=1)
    assert np.array_equal(y, y2) and len(y) == 10 and np.all(np.diff(y) > 0)
    assert data.subset(images, labels, None)[1] is labels


def test_warmup_batches_cover_each_batch_size_once():
    parts = data.batches(1000, 256, seed=0, epoch=0)  # 3 x 256 + 232
    warm = data.warmup_batches(parts)
    assert [len(b) for b in warm] == [256, 232] and warm[0] is parts[0] and warm[1] is parts[-1]
    assert [len(b) for b in data.warmup_batches(parts[:2])] == [256]


# --- unreadable folders and files, no home, a gzip bomb, a broken download -----------------------
# Tests run as root here, and root reads whatever the permissions say: each permission case is
# simulated (the PermissionError Python raises for a non-root user), and runs for real as well
# where the tests run as another user.


def reads_any_file() -> bool:
    """Whether this process reads a file whatever its permissions (root, with its usual
    capabilities): then a real permission case cannot be made."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        probe = Path(folder) / "probe"
        probe.write_text("x")
        probe.chmod(0)
        try:
            probe.read_text()
        except PermissionError:
            return False
        return True


ROOT_READS_ALL = pytest.mark.skipif(reads_any_file(), reason="this user reads any file (root)")


def deny(monkeypatch, folder: Path) -> None:
    """Path.stat() under `folder` raises PermissionError, as for a user who may not search it
    (Path.is_file() then raises too in Python 3.11, and says False in 3.13)."""
    original = Path.stat

    def denied(self, *args, **kwargs):
        if folder in Path(self).parents:
            raise PermissionError(13, "Permission denied", str(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", denied)


def test_an_unreadable_data_folder_is_one_line_saying_to_fix_its_permissions(isolated, monkeypatch):
    deny(monkeypatch, isolated)
    with pytest.raises(data.DatasetError, match=rf"^{isolated}: cannot be read \(Permission d"):
        data.locate(allow_download=False)


def test_an_unreadable_cache_folder_is_one_line(tmp_path, isolated, monkeypatch):
    monkeypatch.delenv("FASHION_MNIST_DIR")
    cache = data.cache_dir()
    cache.mkdir(parents=True)
    deny(monkeypatch, cache)
    with pytest.raises(data.DatasetError, match="cannot be read .*fix its permissions"):
        data.locate()


@ROOT_READS_ALL
def test_an_unreadable_data_folder_for_real(isolated):
    isolated.chmod(0)
    try:
        with pytest.raises(data.DatasetError, match="cannot be read"):
            data.locate(allow_download=False)
    finally:
        isolated.chmod(0o755)


def test_an_unreadable_dataset_file_says_so_not_corrupt(source, isolated, monkeypatch):
    copy_dataset(source, isolated)
    target = isolated / data.FILES["train_images"].name
    opened = data.gzip.open

    def denied(path, *args, **kwargs):
        if Path(path) == target:
            raise PermissionError(13, "Permission denied", str(path))
        return opened(path, *args, **kwargs)

    monkeypatch.setattr(data.gzip, "open", denied)
    with pytest.raises(data.DatasetError) as raised:
        data.load(allow_download=False)
    message = str(raised.value)
    assert message.startswith(f"{target}: cannot be read (Permission denied); fix its perm")
    assert "corrupt" not in message and "delete" not in message


@ROOT_READS_ALL
def test_an_unreadable_dataset_file_for_real(source, isolated):
    copy_dataset(source, isolated)
    (isolated / data.FILES["test_labels"].name).chmod(0)
    with pytest.raises(data.DatasetError, match="cannot be read .*fix its permissions"):
        data.load(allow_download=False)


def no_home(monkeypatch) -> None:
    """HOME unset and no /etc/passwd entry for this user id (a container's arbitrary user)."""
    import pwd

    def unknown(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", unknown)


def test_no_home_still_finds_the_data_elsewhere(source, isolated, monkeypatch):
    copy_dataset(source, isolated)
    no_home(monkeypatch)
    assert data.locate() == isolated  # FASHION_MNIST_DIR
    monkeypatch.delenv("FASHION_MNIST_DIR")
    monkeypatch.setattr(data, "DEBIAN_DIR", isolated)
    assert data.locate() == isolated  # the Debian package's folder


def test_no_home_and_nothing_found_says_what_to_set(isolated, monkeypatch):
    monkeypatch.delenv("FASHION_MNIST_DIR")
    no_home(monkeypatch)
    with pytest.raises(data.DatasetError, match="HOME is unset .*set XDG_CACHE_HOME"):
        data.locate()
    with pytest.raises(data.DatasetError, match="Fashion-MNIST not found in "):
        data.locate(allow_download=False)


def test_a_gzip_bomb_is_refused_after_reading_no_more_than_the_format_holds(tmp_path):
    import tracemalloc

    spec = data.FILES["test_labels"]  # 10008 bytes decompressed
    bomb = tmp_path / spec.name
    with gzip.open(bomb, "wb", compresslevel=1) as f:
        for _ in range(64):  # 64 MB of zeros in a file of a few hundred KB
            f.write(bytes(1 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(data.DatasetError, match="decompresses to more than the 10008 bytes"):
            data.verify(bomb, spec)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # the 64 MB were never held


def test_a_cache_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(data.DatasetError, match=r"cache folder .*/file/cache cannot be created"):
        data.download(tmp_path / "file" / "cache", base_url="http://127.0.0.1:9/", timeout=5)


@pytest.fixture
def raw_server():
    """A TCP server on 127.0.0.1 that answers every connection with the bytes given."""
    import socket

    replies, stop = [], threading.Event()
    sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(0.1)  # a short look each time, so the server stops soon after the test

    def serve():
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:  # no one yet
                continue
            with conn:
                conn.settimeout(10)
                conn.recv(65536)
                conn.sendall(replies[0])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield replies, f"http://127.0.0.1:{sock.getsockname()[1]}/"
    stop.set()
    thread.join(10)
    sock.close()


@pytest.mark.parametrize(
    "reply, why",
    [
        (b"garbage from a broken proxy\r\n\r\n", "garbage from a broken proxy"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + bytes(10), "closed after 10 of 5000"),
    ],
    ids=["bad status line", "body cut short"],
)
def test_a_broken_proxy_is_one_line(raw_server, tmp_path, reply, why):
    replies, url = raw_server
    replies.append(reply)
    with pytest.raises(data.DatasetError, match=rf"download of train-images.*failed \(.*{why}"):
        data.download(tmp_path / "cache", base_url=url, timeout=5)
    assert not [n for n in os.listdir(tmp_path / "cache") if n.endswith(".part")]


def test_a_truncated_download_names_no_deleted_file(source, server, tmp_path):
    www, url = server
    copy_dataset(source, www)
    labels = www / data.FILES["train_labels"].name
    labels.write_bytes(labels.read_bytes()[:-50])
    with pytest.raises(data.DatasetError) as raised:
        data.download(tmp_path / "cache", base_url=url)
    message = str(raised.value)
    assert ".part" not in message and "nothing was kept" in message
    assert message.startswith("the downloaded train-labels-idx1-ubyte.gz (from http://127")
    assert "cannot be decompressed" in message


def test_a_reply_longer_than_the_file_can_be_is_cut_off(server, tmp_path):
    www, url = server
    spec = data.FILES["train_images"]
    (www / spec.name).write_bytes(bytes(spec.size + data.GZIP_SLACK + (2 << 20)))
    with pytest.raises(data.DatasetError, match="the reply goes on past"):
        data.download(tmp_path / "cache", base_url=url)
    assert not [n for n in os.listdir(tmp_path / "cache") if n.endswith(".part")]
