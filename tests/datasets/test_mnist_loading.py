"""MNIST loading: local files, downloads from a local HTTP server on 127.0.0.1 (md5 checked,
corrupt files rejected and never left in the cache), the offline split, clear errors."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import logging
import os
import shutil
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_MNIST

from mpcore.datasets import mnist

SHARED = SHARED_MNIST


def idx_bytes(array: np.ndarray) -> bytes:
    header = b"\x00\x00\x08" + bytes([array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return gzip.compress(header + array.astype(np.uint8).tobytes())


def make_files(folder: Path, n_train: int = 30, n_test: int = 12) -> dict[str, str]:
    """Write four small IDX files; return their md5s."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte.gz": rng.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte.gz": rng.integers(0, 10, n_train),
        "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte.gz": rng.integers(0, 10, n_test),
    }
    md5s = {}
    for name, array in arrays.items():
        data = idx_bytes(array)
        (folder / name).write_bytes(data)
        md5s[name] = hashlib.md5(data).hexdigest()
    return md5s


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTP server on 127.0.0.1 serving a folder; yields (base URL, folder)."""
    root = tmp_path / "mirror"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/", root
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv("MPCORE_DATA_DIR", raising=False)
    monkeypatch.delenv("MPCORE_MNIST_MIRRORS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "mpcore" / "mnist"


def test_download_into_cache_then_load_from_it(server: tuple[str, Path],
                                               clean_env: Path) -> None:
    url, root = server
    md5s = make_files(root)
    data = mnist.load(mirrors=[url], md5s=md5s)
    assert data.split == "full"
    assert data.x_train.shape == (30, 28, 28) and data.y_train.shape == (30,)
    assert data.x_test.dtype == np.uint8
    assert sorted(os.listdir(clean_env)) == sorted(mnist.FILES)
    for name in mnist.FILES:
        assert (clean_env / name).read_bytes() == (root / name).read_bytes()
    shutil.rmtree(root)  # now served from the cache, no network needed
    (x, _), _ = mnist.load_data(mirrors=[url], md5s=md5s)
    np.testing.assert_array_equal(x, data.x_train)


def test_corrupt_download_is_rejected_and_nothing_is_left(server: tuple[str, Path],
                                                          clean_env: Path) -> None:
    url, root = server
    md5s = make_files(root)
    bad = root / "train-labels-idx1-ubyte.gz"
    bad.write_bytes(bad.read_bytes()[:-7] + b"garbage")
    with pytest.raises(mnist.MnistUnavailableError, match="md5") as info:
        mnist.load(mirrors=[url], md5s=md5s)
    message = str(info.value)
    assert "train-labels-idx1-ubyte.gz" in message and str(clean_env) in message
    assert "MPCORE_DATA_DIR" in message
    assert "train-labels-idx1-ubyte.gz" not in os.listdir(clean_env)
    assert not [f for f in os.listdir(clean_env) if f.endswith(".part")]


def test_second_mirror_is_used_when_the_first_fails(server: tuple[str, Path],
                                                    clean_env: Path) -> None:
    url, root = server
    md5s = make_files(root)
    data = mnist.load(mirrors=[url + "missing/", url], md5s=md5s)
    assert data.split == "full"


def test_published_md5s_are_checked_by_default(server: tuple[str, Path],
                                               clean_env: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    url, root = server
    make_files(root)  # generated files cannot match the real MNIST md5s
    monkeypatch.setenv("MPCORE_MNIST_MIRRORS", url)
    with pytest.raises(mnist.MnistUnavailableError, match="md5"):
        mnist.load_data()
    assert not os.listdir(clean_env)


def test_offline_error_says_what_where_and_how(clean_env: Path) -> None:
    with pytest.raises(mnist.MnistUnavailableError) as info:
        mnist.load(mirrors=["http://127.0.0.1:9/"], timeout=2)
    message = str(info.value)
    for needle in ("train-images-idx3-ubyte.gz", str(clean_env), "MPCORE_DATA_DIR",
                   "split='offline'", "127.0.0.1:9"):
        assert needle in message


@pytest.mark.parametrize("value", ["../no/such/mnist", "/no/such/mnist", "FILE"])
def test_a_data_dir_that_is_not_a_folder_is_said_at_once(
        value: str, clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if value == "FILE":
        value = str(tmp_path / "a-file")
        Path(value).write_text("")
    monkeypatch.setenv("MPCORE_DATA_DIR", value)
    with pytest.raises(mnist.MnistUnavailableError) as info:
        mnist.load(mirrors=["http://127.0.0.1:9/"])   # (never asked: no download is tried)
    message = str(info.value)
    assert message.startswith(f"MPCORE_DATA_DIR={value!r} is not a folder")
    assert ("a relative path is read from the current directory" in message) == (
        not value.startswith("/"))
    assert str(clean_env) in message and "127.0.0.1" not in message


def test_offline_split_from_data_dir(tmp_path: Path, clean_env: Path,
                                     monkeypatch: pytest.MonkeyPatch,
                                     caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "offline"
    md5s = make_files(folder, n_test=10000)
    for name in mnist.TRAIN:
        (folder / name).unlink()
    monkeypatch.setenv("MPCORE_DATA_DIR", str(folder))
    with caplog.at_level(logging.WARNING, logger="mpcore"):
        data = mnist.load(mirrors=["http://127.0.0.1:9/"], md5s=md5s)
    assert data.split == "offline"
    assert (len(data.x_train), len(data.x_test)) == (8000, 2000)
    assert "NOT the full MNIST set" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mpcore"):   # the caller says it (the demo)
        assert mnist.load(mirrors=["http://127.0.0.1:9/"], md5s=md5s, warn=False).split == (
            "offline")
    assert "NOT the full" not in caplog.text
    full = mnist.read_idx(folder / "t10k-images-idx3-ubyte.gz")
    np.testing.assert_array_equal(data.x_train, full[:8000])
    np.testing.assert_array_equal(data.x_test, full[8000:])
    with pytest.raises(mnist.MnistUnavailableError):
        mnist.load(split="full", mirrors=["http://127.0.0.1:9/"], timeout=2, md5s=md5s)


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared MNIST test files are not here")
def test_real_shared_test_files(monkeypatch: pytest.MonkeyPatch, clean_env: Path) -> None:
    monkeypatch.setenv("MPCORE_DATA_DIR", str(SHARED))
    for name in mnist.TEST:
        assert mnist.md5sum(SHARED / name) == mnist.FILES[name]
    (x, y), (xt, _) = mnist.load_data()
    assert x.shape == (8000, 28, 28) and xt.shape == (2000, 28, 28)
    assert set(np.unique(y)) == set(range(10))


def test_bad_files_and_arguments(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gz"
    bad.write_bytes(gzip.compress(b"\x00\x00\x08\x01" + struct.pack(">I", 5) + b"abc"))
    with pytest.raises(ValueError, match="header says"):
        mnist.read_idx(bad)
    with pytest.raises(ValueError, match="valid: auto, full, offline"):
        mnist.load(split="half")
