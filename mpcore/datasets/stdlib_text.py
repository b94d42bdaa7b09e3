"""Character-level text from the source of Python's own standard library: real data that every
Python installation ships, so a language model trains offline with nothing to download.

    (x_train, y_train), (x_val, y_val) = mp.datasets.stdlib_text.load_data(seq_len=64)
    text = mp.datasets.stdlib_text.decode(x_val[0])

The text is the ``*.py`` files under ``sysconfig.get_paths()["stdlib"]`` (or ``root``), in a
fixed order (a checksum of each path relative to it, so a sample mixes the packages),
skipping ``site-packages``/``dist-packages`` (third party code, which differs from one
machine to the next) and ``__pycache__``. Files are read as UTF-8 with newlines normalised
to ``\\n``; reading stops at ``max_chars`` characters (the last file cut short; no file gives
more than a tenth of them, its beginning, so a sample spans ten files at least), so the same
interpreter always gives the same data.

The split is by file, not by window: a file's text is all in training or all in validation, so
the validation loss is measured on text the model never saw (random windows would leak the
neighbouring lines of a training window). Walking the files in order, each goes to validation
where that brings validation's share of the characters read so far nearer to
``validation_fraction`` than leaving it out would: the held-out files are spread over the whole
library and their share of characters stays close to the fraction.

The vocabulary (:data:`VOCABULARY`, or ``vocab``) is a string of characters, id = position;
any other character maps to one unknown id, ``len(vocab)``, so ``vocab_size(vocab)`` is
``len(vocab) + 1`` (98 for the default: tab, newline and printable ASCII 32-126). Windows are
int32 arrays (N, seq_len), cut without overlap from each split's text; ``y`` is ``x`` shifted
by one character (the next character at every position), as a language model's targets.

Arrays are NumPy's; NumPy is imported on first use only, so ``import mpcore`` stays free of it.
"""

from __future__ import annotations

import sysconfig
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: tab, newline and printable ASCII (space to tilde): the characters of Python source but for
#: the odd non-ASCII one in a string or a comment, which maps to the unknown id
VOCABULARY = "\t\n" + "".join(chr(c) for c in range(32, 127))
#: folders under the standard library's that are not the standard library
SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
DEFAULT_MAX_CHARS = 2_000_000
#: the most of ``max_chars`` that one file gives (its beginning): a sample spans at least ten
#: files, so a small one still has files to hold out (the library has files of 200k characters)
PER_FILE = 0.1


@dataclass(frozen=True)
class StdlibText:
    """What :func:`load` returns: the windows, the vocabulary and where the text came from."""

    x_train: Any
    y_train: Any
    x_val: Any
    y_val: Any
    vocab: str
    train_files: tuple[str, ...]
    val_files: tuple[str, ...]
    train_chars: int
    val_chars: int

    @property
    def vocab_size(self) -> int:
        return vocab_size(self.vocab)


def vocab_size(vocab: str | None = None) -> int:
    """The number of ids: one per character of ``vocab`` plus the unknown id."""
    return len(_vocab(vocab)) + 1


def _vocab(vocab: str | None) -> str:
    if vocab is None:
        return VOCABULARY
    if not isinstance(vocab, str) or not vocab:
        raise ValueError(f"vocab must be a non-empty string of characters, got {vocab!r}")
    if len(set(vocab)) != len(vocab):
        raise ValueError("vocab must not repeat a character (a character's id is its position)")
    return vocab


def _table(vocab: str) -> Any:
    """A lookup array: code point (below 128, else handled apart) -> id."""
    import numpy as np

    table = np.full(128, len(vocab), np.int32)
    for i, ch in enumerate(vocab):
        if ord(ch) < 128:
            table[ord(ch)] = i
    return table


def encode(text: str, vocab: str | None = None) -> Any:
    """``text`` as an int32 array of ids; characters outside the vocabulary get the unknown id
    ``len(vocab)``."""
    import numpy as np

    chars = _vocab(vocab)
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    ids = _table(chars)[np.minimum(codes, 127)]
    wide = codes >= 127
    if wide.any():
        # DEL and non-ASCII code points: in the vocabulary only if it lists them
        index = {ord(ch): i for i, ch in enumerate(chars) if ord(ch) >= 127}
        ids[wide] = [index.get(int(c), len(chars)) for c in codes[wide]]
    return ids.astype(np.int32, copy=False)


def decode(ids: Iterable[int] | Any, vocab: str | None = None, unknown: str = "\ufffd") -> str:
    """The text of ``ids`` (any iterable of ints, an array included); the unknown id (and any id
    out of range) becomes ``unknown``."""
    chars = _vocab(vocab)
    return "".join(chars[i] if 0 <= i < len(chars) else unknown for i in map(int, ids))


def source_files(root: str | Path | None = None) -> list[Path]:
    """The ``*.py`` files of the standard library (or under ``root``), third-party and cache
    folders skipped, in the fixed order of :func:`_order`."""
    base = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
    if not base.is_dir():
        raise FileNotFoundError(f"no folder {base} to read Python source from (root=...)")
    files = [p for p in base.rglob("*.py")
             if p.is_file() and not SKIPPED_DIRS.intersection(p.relative_to(base).parts[:-1])]
    return sorted(files, key=lambda p: _order(p.relative_to(base).as_posix()))


def _order(relative: str) -> tuple[int, str]:
    """Files are read in the order of a checksum of their relative path (then the path): a
    fixed order on every machine that mixes the packages, so that a ``max_chars`` sample (and
    the validation files in it) spans the library instead of its first letters."""
    return zlib.crc32(relative.encode()), relative


def _texts(files: list[Path], max_chars: int | None) -> Iterator[tuple[Path, str]]:
    """Each file's text, until ``max_chars`` characters in all (the last one cut short), each
    file's at most ``PER_FILE`` of ``max_chars``."""
    left = max_chars
    most = None if max_chars is None else max(1, int(max_chars * PER_FILE))
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue  # unreadable (a broken link, no permission): not part of the data
        if not text:
            continue
        if left is not None:
            text = text[:min(left, most or left)]
            left -= len(text)
        yield path, text
        if left == 0:
            return


def _windows(ids: Any, seq_len: int) -> tuple[Any, Any]:
    import numpy as np

    count = max((len(ids) - 1) // seq_len, 0)
    x = np.ascontiguousarray(ids[:count * seq_len].reshape(count, seq_len))
    y = np.ascontiguousarray(ids[1:count * seq_len + 1].reshape(count, seq_len))
    return x, y


def load(max_chars: int | None = DEFAULT_MAX_CHARS, seq_len: int = 64,
         validation_fraction: float = 0.1, vocab: str | None = None,
         root: str | Path | None = None) -> StdlibText:
    """The split as a :class:`StdlibText` (windows, vocabulary, file lists, character counts).
    ``max_chars=None`` reads the whole library (tens of millions of characters)."""
    import numpy as np

    chars = _vocab(vocab)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be an int >= 1, got {seq_len!r}")
    if max_chars is not None and (isinstance(max_chars, bool) or not isinstance(max_chars, int)
                                  or max_chars < 1):
        raise ValueError(f"max_chars must be an int >= 1 or None, got {max_chars!r}")
    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction!r}")
    base = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
    parts: dict[str, list[str]] = {"train": [], "val": []}
    names: dict[str, list[str]] = {"train": [], "val": []}
    sizes = {"train": 0, "val": 0}
    for path, text in _texts(source_files(base), max_chars):
        total = sizes["train"] + sizes["val"] + len(text)
        # to validation where that brings its share nearer the fraction than leaving it out
        side = ("val" if sizes["val"] + len(text) / 2 <= validation_fraction * total
                else "train")
        parts[side].append(text)
        names[side].append(path.relative_to(base).as_posix())
        sizes[side] += len(text)
    arrays = {}
    for side in ("train", "val"):
        ids = encode("".join(parts[side]), chars) if parts[side] else np.zeros(0, np.int32)
        arrays[side] = _windows(ids, seq_len)
    if len(arrays["train"][0]) == 0 or (validation_fraction > 0 and len(arrays["val"][0]) == 0):
        raise ValueError(
            f"too little text for windows of seq_len={seq_len}: {sizes['train']} training and "
            f"{sizes['val']} validation characters from {base}; raise max_chars or lower "
            "seq_len")
    return StdlibText(*arrays["train"], *arrays["val"], vocab=chars,
                      train_files=tuple(names["train"]), val_files=tuple(names["val"]),
                      train_chars=sizes["train"], val_chars=sizes["val"])


def load_data(max_chars: int | None = DEFAULT_MAX_CHARS, seq_len: int = 64,
              validation_fraction: float = 0.1, vocab: str | None = None,
              root: str | Path | None = None) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """``(x_train, y_train), (x_val, y_val)``: int32 windows (N, seq_len), ``y`` the next
    character of every position of ``x``; see :func:`load` and the module's docstring."""
    data = load(max_chars, seq_len, validation_fraction, vocab, root)
    return (data.x_train, data.y_train), (data.x_val, data.y_val)


__all__ = ["DEFAULT_MAX_CHARS", "VOCABULARY", "StdlibText", "decode", "encode", "load",
           "load_data", "source_files", "vocab_size"]
