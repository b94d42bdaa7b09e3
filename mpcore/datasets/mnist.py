"""MNIST from its original IDX gzip files, as ``keras.datasets.mnist.load_data``.

Where the files are looked for, in order: ``path`` (when given), else ``$MPCORE_DATA_DIR``
(when set; one that is not a folder raises at once, without a download: a typo or a relative
path from another folder) and the cache folder (``$XDG_CACHE_HOME/mpcore/mnist``, by default
``~/.cache/mpcore/mnist``). Files that are missing are downloaded into the cache folder (or
``path``) from the standard mirrors (override with ``mirrors=`` or ``$MPCORE_MNIST_MIRRORS``,
comma-separated base URLs), each checked against its published md5 and written atomically:
a file that fails the check or a download cut short never lands in the cache. Local files are
md5-checked too (once per process for a given size and mtime), and their IDX headers must say
what MNIST's do (uint8 images N x 28 x 28, N labels 0 to 9): a corrupt, truncated, swapped or
foreign file raises :class:`MnistFileError` naming it and saying what to do.

Offline split: where only the two test-set files are available (as in the project's shared
data folder), ``split="offline"`` (or ``split="auto"`` when the files come from
``$MPCORE_DATA_DIR``) trains on the first 8,000 test images and tests on the last 2,000. It
logs a warning saying so (not with ``warn=False``): it is not the full 60,000/10,000 set.
``load()`` returns the split used; ``load_data()`` returns the Keras tuples.

Arrays are NumPy ``uint8``: images (N, 28, 28), labels (N,). NumPy is imported here only.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import logging
import os
import struct
import tempfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("mpcore")

FILES: dict[str, str] = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
TRAIN = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
TEST = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
MIRRORS: tuple[str, ...] = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
OFFLINE_TRAIN = 8000
SPLITS = ("auto", "full", "offline")
IMAGE_SHAPE = (28, 28)
CLASSES = 10
# md5s of local files already checked, by (path, device, inode, size, mtime): a changed file
# gets a new key, so it is checked again
_checked_md5s: dict[tuple[str, int, int, int, int], str] = {}


class MnistUnavailableError(FileNotFoundError):
    """The MNIST files are neither on disk nor downloadable; the message says what to do."""


class MnistFileError(ValueError):
    """An MNIST file is corrupt, truncated or not the file its name says; the message names it
    and says what to do."""


def _remedy(path: Path) -> str:
    return (f"delete {path} so that mpcore downloads a fresh copy (or put the original file "
            "there)")


@dataclass(frozen=True)
class MnistData:
    x_train: Any
    y_train: Any
    x_test: Any
    y_test: Any
    split: str        # "full" (60,000/10,000) or "offline" (first 8,000 / last 2,000 of t10k)
    source: str       # the folder the files were read from

    def as_tuples(self) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
        return (self.x_train, self.y_train), (self.x_test, self.y_test)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mpcore" / "mnist"


def _search_dirs(path: str | os.PathLike[str] | None) -> list[Path]:
    if path is not None:
        return [Path(path)]
    dirs = []
    env = os.environ.get("MPCORE_DATA_DIR")
    if env:
        dirs.append(Path(env))
    dirs.append(cache_dir())
    return dirs


def _find(name: str, dirs: Sequence[Path]) -> Path | None:
    for d in dirs:
        p = d / name
        if p.is_file():
            return p
    return None


def md5sum(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _mirrors(mirrors: Sequence[str] | None) -> list[str]:
    if mirrors is None:
        env = os.environ.get("MPCORE_MNIST_MIRRORS", "")
        mirrors = [m.strip() for m in env.split(",") if m.strip()] or list(MIRRORS)
    return [m if m.endswith("/") else m + "/" for m in mirrors]


def download(name: str, folder: Path, mirrors: Sequence[str] | None = None,
             timeout: float = 30.0, md5s: Mapping[str, str] | None = None) -> Path:
    """Fetch ``name`` into ``folder`` from the first mirror that serves it with the right md5.
    The bytes go to a temporary file in ``folder`` that is renamed into place only after the
    md5 matched, so nothing half-written or corrupt is ever left under ``name``."""
    expected = {**FILES, **(md5s or {})}[name]
    folder.mkdir(parents=True, exist_ok=True)
    errors = []
    for base in _mirrors(mirrors):
        url = base + name
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=folder)
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as r:
                while chunk := r.read(1 << 16):
                    out.write(chunk)
            got = md5sum(Path(tmp))
            if got != expected:
                errors.append(f"{url}: md5 {got} != expected {expected}")
                continue
            target = folder / name
            os.replace(tmp, target)
            _checked_md5s[_md5_key(target)] = got
            logger.info("downloaded %s from %s", name, url)
            return target
        except (urllib.error.URLError, OSError, ValueError) as exc:
            errors.append(f"{url}: {exc}")
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    raise MnistUnavailableError(f"could not download {name}: " + "; ".join(errors))


def _md5_key(path: Path) -> tuple[str, int, int, int, int]:
    st = path.stat()
    return (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def check_md5(path: Path, expected: str) -> None:
    """Raise :class:`MnistFileError` unless ``path`` has the md5 ``expected``."""
    key = _md5_key(path)
    got = _checked_md5s.get(key) or md5sum(path)
    if got != expected:
        raise MnistFileError(
            f"{path} has md5 {got}, not the published md5 {expected} of {path.name}: it is "
            f"corrupt, incomplete or another file; {_remedy(path)}. For another data set in "
            "MNIST's format (e.g. Fashion-MNIST), pass md5s={file name: md5} with its md5s.")
    _checked_md5s[key] = got


def read_idx(path: Path) -> Any:
    """An IDX gzip file as a NumPy array (uint8 images or labels); a file that is not one
    raises :class:`MnistFileError` naming it."""
    import numpy as np

    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise MnistFileError(f"{path} is not a readable gzip file ({type(exc).__name__}: "
                             f"{exc}): it is corrupt or cut short; {_remedy(path)}") from exc
    if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] != 0x08:
        raise MnistFileError(f"{path} is not an unsigned-byte IDX file (it starts with "
                             f"{data[:4].hex() or 'nothing'}, MNIST's start with 00000803 or "
                             f"00000801); {_remedy(path)}")
    ndim = data[3]
    start = 4 + 4 * ndim
    if len(data) < start:
        raise MnistFileError(f"{path}: its IDX header of rank {ndim} needs {start} bytes, the "
                             f"file holds {len(data)}; {_remedy(path)}")
    dims = struct.unpack(f">{ndim}I", data[4:start])
    body = np.frombuffer(data, dtype=np.uint8, offset=start)
    expected = 1
    for d in dims:
        expected *= d
    if body.size != expected:
        raise MnistFileError(f"{path}: header says {dims} ({expected} values), found "
                             f"{body.size}; {_remedy(path)}")
    try:
        return body.reshape(dims)
    except ValueError as exc:   # an empty body under dimensions too big to index (0 x 2**32)
        raise MnistFileError(f"{path}: header says {dims}, which no array can have ({exc}); "
                             f"{_remedy(path)}") from exc


def read_pair(images_path: Path, labels_path: Path) -> tuple[Any, Any]:
    """MNIST images and their labels, each file checked for what MNIST's hold."""
    x, y = read_idx(images_path), read_idx(labels_path)
    swapped = x.ndim == 1 and y.ndim == 3
    hint = " (the images and labels files look swapped)" if swapped else ""
    if x.ndim != 3 or x.shape[1:] != IMAGE_SHAPE:
        raise MnistFileError(f"{images_path} holds an array of shape {x.shape}; MNIST images "
                             f"are N x 28 x 28{hint}; {_remedy(images_path)}")
    if y.ndim != 1:
        raise MnistFileError(f"{labels_path} holds an array of shape {y.shape}; MNIST labels "
                             f"are rank 1{hint}; {_remedy(labels_path)}")
    if len(y) != len(x):
        raise MnistFileError(f"{labels_path} holds {len(y)} labels for the {len(x)} images in "
                             f"{images_path}; {_remedy(labels_path)}")
    if y.size and int(y.max()) >= CLASSES:
        raise MnistFileError(f"{labels_path} holds label {int(y.max())}; MNIST labels are 0 "
                             f"to {CLASSES - 1}; {_remedy(labels_path)}")
    return x, y


def _how_to(dirs: Sequence[Path]) -> str:
    return ("Provide the files by placing them in one of: "
            + ", ".join(str(d) for d in dirs)
            + " (or set MPCORE_DATA_DIR to their folder), or let mpcore download them "
            "(network access, or MPCORE_MNIST_MIRRORS=<base URL> for a local mirror). With only "
            "the two t10k files, load_data(split='offline') trains on the first 8,000 and "
            "tests on the last 2,000 test images.")


def load(path: str | os.PathLike[str] | None = None, split: str = "auto",
         mirrors: Sequence[str] | None = None, timeout: float = 30.0,
         md5s: Mapping[str, str] | None = None, warn: bool = True) -> MnistData:
    """Load MNIST (see the module docstring for where from, and for ``split``). ``md5s``
    replaces the published checksums (file name -> md5) for a mirror that repackages them.
    ``warn=False``: no warning for the offline split (``MnistData.split`` says it; the demo
    prints its own line)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    env_dir = os.environ.get("MPCORE_DATA_DIR") if path is None else None
    if env_dir and not Path(env_dir).is_dir():
        # a typo or a relative path from another folder: said at once, no download tried
        raise MnistUnavailableError(
            f"MPCORE_DATA_DIR={env_dir!r} is not a folder"
            + (f" (a relative path is read from the current directory, {os.getcwd()})"
               if not Path(env_dir).is_absolute() else "")
            + ". Point it at the folder holding the MNIST IDX files, or unset it to download "
            f"them into {cache_dir()}.")
    dirs = _search_dirs(path)
    found = {name: _find(name, dirs) for name in FILES}
    test_local = all(found[n] is not None for n in TEST)
    train_local = all(found[n] is not None for n in TRAIN)
    offline = split == "offline" or (
        split == "auto" and env_dir is not None and test_local and not train_local
        and all(Path(env_dir) == found[n].parent for n in TEST))  # type: ignore[union-attr]
    wanted = TEST if offline else tuple(FILES)
    missing = [n for n in wanted if found[n] is None]
    if missing:
        target = Path(path) if path is not None else cache_dir()
        problems = []
        for name in missing:
            try:
                found[name] = download(name, target, mirrors, timeout, md5s)
            except MnistUnavailableError as exc:
                problems.append(str(exc))
        if problems:
            still = [n for n in missing if found[n] is None]
            raise MnistUnavailableError(
                f"MNIST files missing: {', '.join(still)}. Looked in: "
                f"{', '.join(str(d) for d in dirs)}. Download failed: {' | '.join(problems)}. "
                + _how_to(dirs))
    checksums = {**FILES, **(md5s or {})}
    for name in wanted:
        check_md5(found[name], checksums[name])  # type: ignore[arg-type]
    x_test, y_test = read_pair(found[TEST[0]], found[TEST[1]])  # type: ignore[arg-type]
    source = str(found[TEST[0]].parent)  # type: ignore[union-attr]
    if offline and warn:
        logger.warning("MNIST offline split: only the test-set files are used (from %s): "
                       "training on its first %d images, testing on its last %d. This is NOT "
                       "the full MNIST set (60,000 train / 10,000 test).", source,
                       OFFLINE_TRAIN, len(x_test) - OFFLINE_TRAIN)
    if offline:
        return MnistData(x_test[:OFFLINE_TRAIN], y_test[:OFFLINE_TRAIN],
                         x_test[OFFLINE_TRAIN:], y_test[OFFLINE_TRAIN:], "offline", source)
    x_train, y_train = read_pair(found[TRAIN[0]], found[TRAIN[1]])  # type: ignore[arg-type]
    return MnistData(x_train, y_train, x_test, y_test, "full", source)


def load_data(path: str | os.PathLike[str] | None = None, split: str = "auto",
              mirrors: Sequence[str] | None = None, md5s: Mapping[str, str] | None = None,
              ) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """``((x_train, y_train), (x_test, y_test))`` as Keras returns them."""
    return load(path, split, mirrors, md5s=md5s).as_tuples()
