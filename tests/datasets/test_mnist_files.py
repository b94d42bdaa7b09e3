"""Damaged MNIST files: corrupt, truncated or non-gzip files, local files that fail their md5,
swapped or misshapen IDX files all raise MnistFileError naming the file and what to do; a
property test of the IDX parser on random headers, bodies and truncations."""

from __future__ import annotations

import gzip
import hashlib
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_MNIST
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mpcore.datasets import mnist

SHARED = SHARED_MNIST
IMAGES, LABELS = mnist.TEST
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="the shared MNIST files are absent")


def idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return gzip.compress(header + array.astype(np.uint8).tobytes())


def write_test_files(folder: Path, images: bytes, labels: bytes) -> dict[str, str]:
    """The two t10k files with the given bytes; returns their md5s (for ``md5s=``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / IMAGES).write_bytes(images)
    (folder / LABELS).write_bytes(labels)
    return {name: hashlib.md5((folder / name).read_bytes()).hexdigest() for name in mnist.TEST}


@pytest.fixture
def real_copy(tmp_path: Path) -> Path:
    """A writable copy of the shared test files (the originals are never touched)."""
    if not SHARED.is_dir():
        pytest.skip("the shared MNIST files are absent")
    folder = tmp_path / "mnist"
    folder.mkdir()
    for name in mnist.TEST:
        shutil.copyfile(SHARED / name, folder / name)
    return folder


def damage(data: bytes, how: str) -> bytes:
    return {"truncated": data[:len(data) // 2],
            "corrupt": data[:100] + bytes(b ^ 0x5A for b in data[100:400]) + data[400:],
            "not gzip": b"<html>404 Not Found</html>\n",
            "empty": b""}[how]


@pytest.mark.parametrize("how", ["truncated", "corrupt", "not gzip", "empty"])
def test_damaged_gzip_names_the_file_and_what_to_do(real_copy: Path, how: str) -> None:
    path = real_copy / IMAGES
    path.write_bytes(damage(path.read_bytes(), how))
    with pytest.raises(mnist.MnistFileError) as info:
        mnist.read_idx(path)
    assert str(path) in str(info.value) and "delete" in str(info.value)
    with pytest.raises(ValueError, match="md5") as info:  # load() checks the md5 first
        mnist.load(real_copy, split="offline")
    assert str(path) in str(info.value) and "delete" in str(info.value)


@needs_shared
def test_a_changed_label_that_still_parses_fails_the_md5(real_copy: Path) -> None:
    path = real_copy / LABELS
    raw = bytearray(gzip.decompress(path.read_bytes()))
    raw[-1] = (raw[-1] + 1) % 10
    path.write_bytes(gzip.compress(bytes(raw)))
    with pytest.raises(mnist.MnistFileError, match="md5") as info:
        mnist.load(real_copy, split="offline")
    message = str(info.value)
    assert str(path) in message and mnist.FILES[LABELS] in message and "md5s=" in message


@needs_shared
def test_real_files_pass_and_a_later_change_is_still_caught(real_copy: Path) -> None:
    data = mnist.load(real_copy, split="offline")
    assert data.x_train.shape == (8000, 28, 28) and data.y_test.shape == (2000,)
    again = mnist.load(real_copy, split="offline")  # md5 remembered for this size and mtime
    np.testing.assert_array_equal(again.x_test, data.x_test)
    path = real_copy / LABELS
    path.write_bytes(path.read_bytes()[:-8] + bytes(8))
    with pytest.raises(mnist.MnistFileError, match="md5"):
        mnist.load(real_copy, split="offline")


@needs_shared
def test_swapped_images_and_labels_are_named(real_copy: Path) -> None:
    images, labels = (real_copy / IMAGES).read_bytes(), (real_copy / LABELS).read_bytes()
    md5s = write_test_files(real_copy, labels, images)
    with pytest.raises(mnist.MnistFileError, match="md5"):
        mnist.load(real_copy, split="offline")
    with pytest.raises(mnist.MnistFileError, match="swapped") as info:
        mnist.load(real_copy, split="offline", md5s=md5s)
    assert str(real_copy / IMAGES) in str(info.value)


RNG = np.random.default_rng(3)
GOOD_IMAGES = RNG.integers(0, 256, (12, 28, 28))
GOOD_LABELS = RNG.integers(0, 10, 12)


@pytest.mark.parametrize("images, labels, bad, needle", [
    (idx_bytes(GOOD_IMAGES[:, :, :27]), idx_bytes(GOOD_LABELS), IMAGES, "28 x 28"),
    (idx_bytes(GOOD_IMAGES.reshape(12, -1)), idx_bytes(GOOD_LABELS), IMAGES, "28 x 28"),
    (idx_bytes(GOOD_IMAGES), idx_bytes(GOOD_LABELS[:, None]), LABELS, "rank 1"),
    (idx_bytes(GOOD_IMAGES), idx_bytes(GOOD_LABELS[:11]), LABELS, "12 images"),
    (idx_bytes(GOOD_IMAGES), idx_bytes(np.full(12, 10)), LABELS, "0 to 9"),
    (idx_bytes(GOOD_IMAGES, type_code=0x0B), idx_bytes(GOOD_LABELS), IMAGES, "unsigned-byte"),
], ids=["27 columns", "images rank 2", "labels rank 2", "counts differ", "label 10", "int16"])
def test_idx_magic_and_dimensions_are_checked(tmp_path: Path, images: bytes, labels: bytes,
                                              bad: str, needle: str) -> None:
    md5s = write_test_files(tmp_path, images, labels)
    with pytest.raises(mnist.MnistFileError, match=needle) as info:
        mnist.load(tmp_path, split="offline", md5s=md5s)
    assert str(tmp_path / bad) in str(info.value)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("idx") / "t10k-images-idx3-ubyte.gz"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(magic=st.one_of(st.just(b"\x00\x00\x08"), st.binary(min_size=0, max_size=3)),
       ndim=st.integers(0, 255), dims=st.lists(st.integers(0, 6), max_size=5),
       body=st.binary(max_size=300), cut=st.one_of(st.none(), st.integers(0, 400)),
       gzipped=st.booleans())
# found by hypothesis: no values, under dimensions no array can have (0 x 3298820292 x ...)
@example(magic=b"\x00\x00\x08", ndim=5, dims=[0, 0, 0], body=b"\xc4\x00\x00\x00\xa7/\x05:",
         cut=None, gzipped=True)
def test_idx_parser_gives_a_value_error_naming_the_file_or_a_right_array(
        scratch: Path, magic: bytes, ndim: int, dims: list[int], body: bytes, cut: int | None,
        gzipped: bool) -> None:
    raw = magic + bytes([ndim]) + b"".join(struct.pack(">I", d) for d in dims) + body
    data = gzip.compress(raw) if gzipped else raw
    scratch.write_bytes(data if cut is None else data[:cut])
    try:
        array = mnist.read_idx(scratch)
    except ValueError as exc:
        assert str(scratch) in str(exc)
        return
    header = 4 + 4 * raw[3]
    assert raw[:3] == b"\x00\x00\x08" and array.dtype == np.uint8
    assert array.shape == struct.unpack(f">{raw[3]}I", raw[4:header])
    assert array.tobytes() == raw[header:]

