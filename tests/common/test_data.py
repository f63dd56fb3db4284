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
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *a: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
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
