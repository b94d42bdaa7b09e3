"""mp.datasets.stdlib_text: the vocabulary, encode/decode, windows shifted by one, a split by
file (no file on both sides), determinism, the skipped folders and clear errors. Small
folders of made-up files, and the real standard library read to a few thousand characters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mpcore as mp
from mpcore.datasets import stdlib_text as st


def make_tree(root: Path, files: int = 12, size: int = 600) -> Path:
    for i in range(files):
        folder = root / ("pkg" if i % 2 else "") / ""
        folder.mkdir(parents=True, exist_ok=True)
        body = "".join(f"def f{i}_{j}(x):\n\treturn x + {j}  # file {i}\n" for j in range(size))
        (folder / f"mod{i}.py").write_text(body[:size], encoding="utf-8")
    return root


def test_public_name_and_vocabulary() -> None:
    assert mp.datasets.stdlib_text is st
    assert st.vocab_size() == 98 == len(st.VOCABULARY) + 1
    assert st.VOCABULARY[:2] == "\t\n" and st.VOCABULARY[2] == " " and st.VOCABULARY[-1] == "~"


def test_encode_decode_round_trip_and_unknown() -> None:
    text = "def f(x):\n\treturn x ** 2  # ok ~\n"
    ids = st.encode(text)
    assert ids.dtype == np.int32 and len(ids) == len(text)
    assert st.decode(ids) == text
    unknown = st.vocab_size() - 1
    assert st.encode("é\x7f€").tolist() == [unknown] * 3
    assert st.decode([unknown, 0, 999, -1], unknown="?") == "?\t??"
    assert st.encode("ab", vocab="ba").tolist() == [1, 0]
    assert st.encode("é", vocab="aé").tolist() == [1]


def test_windows_are_shifted_by_one_and_split_by_file(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    data = st.load(max_chars=None, seq_len=16, validation_fraction=0.25, root=root)
    assert data.x_train.dtype == data.y_train.dtype == np.int32
    assert data.x_train.shape == data.y_train.shape and data.x_train.shape[1] == 16
    assert data.x_val.shape[1] == 16 and len(data.x_val) > 0
    np.testing.assert_array_equal(data.x_train[:, 1:], data.y_train[:, :-1])
    np.testing.assert_array_equal(data.x_train[1:, 0], data.y_train[:-1, -1])
    assert not set(data.train_files) & set(data.val_files)
    assert len(data.train_files) + len(data.val_files) == 12
    assert data.train_chars + data.val_chars == 12 * 600
    assert 0.1 < data.val_chars / (data.train_chars + data.val_chars) < 0.4
    # the validation windows are the held-out files' text, in order
    val_text = "".join((root / f).read_text() for f in data.val_files)
    assert st.decode(data.x_val[0]) == val_text[:16]


def test_deterministic_and_max_chars(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    a = st.load(max_chars=2000, seq_len=8, root=root)
    b = st.load(max_chars=2000, seq_len=8, root=root)
    assert a.train_files == b.train_files and a.val_files == b.val_files
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert a.train_chars + a.val_chars == 2000
    (x, _), (_, yv) = st.load_data(max_chars=2000, seq_len=8, root=root)
    np.testing.assert_array_equal(x, a.x_train)
    np.testing.assert_array_equal(yv, a.y_val)


def test_skips_third_party_and_cache_folders(tmp_path: Path) -> None:
    root = make_tree(tmp_path, files=2)
    for skipped in ("site-packages/x", "dist-packages", "__pycache__"):
        (root / skipped).mkdir(parents=True)
        (root / skipped / "other.py").write_text("x = 1\n")
    names = [p.relative_to(root).as_posix() for p in st.source_files(root)]
    assert sorted(names) == ["mod0.py", "pkg/mod1.py"]


def test_real_standard_library_sample() -> None:
    data = st.load(max_chars=200_000, seq_len=32, validation_fraction=0.2)
    assert len(data.x_train) > 0 and len(data.x_val) > 0
    assert all(f.endswith(".py") for f in data.train_files + data.val_files)
    assert not set(data.train_files) & set(data.val_files)
    assert int(data.x_train.max()) < data.vocab_size


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"seq_len": 0}, "seq_len must be an int >= 1"),
    ({"validation_fraction": 1.0}, r"validation_fraction must be in \[0, 1\)"),
    ({"max_chars": 0}, "max_chars must be an int >= 1 or None"),
    ({"vocab": "aa"}, "must not repeat"),
    ({"vocab": ""}, "non-empty string"),
    ({"max_chars": 50, "seq_len": 64}, "too little text .* raise max_chars or lower seq_len"),
])
def test_clear_errors(tmp_path: Path, kwargs: dict[str, object], match: str) -> None:
    root = make_tree(tmp_path, files=3)
    with pytest.raises(ValueError, match=match):
        st.load(root=root, **{"max_chars": None, **kwargs})  # type: ignore[arg-type]


def test_missing_root_names_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no folder"):
        st.load(root=tmp_path / "nope")


def test_import_stays_free_of_numpy() -> None:
    code = ("import sys, mpcore, mpcore.datasets.stdlib_text as st; st.decode([1, 2]); "
            "assert 'numpy' not in sys.modules, 'numpy imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_one_big_file_does_not_fill_a_small_sample(tmp_path: Path) -> None:
    root = make_tree(tmp_path, files=12, size=300)
    (root / "aaa_big.py").write_text("x = 1\n" * 10_000)
    data = st.load(max_chars=3000, seq_len=8, root=root)
    assert len(data.train_files) + len(data.val_files) >= 10 and data.val_files
