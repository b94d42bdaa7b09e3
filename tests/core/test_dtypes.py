"""Dtype names and promotion (mpcore.dtypes): the core's array-library-free dtype rules."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from mpcore.core import dtypes


@pytest.mark.parametrize("name", dtypes.ALL)
def test_canonical_names_and_numpy_spellings(name: str) -> None:
    assert dtypes.canonical(name) == name
    if name == "bfloat16":
        assert dtypes.canonical(ml_dtypes.bfloat16) == name
        assert dtypes.canonical(np.dtype(ml_dtypes.bfloat16)) == name
    else:
        assert dtypes.canonical(np.dtype(name)) == name
        assert dtypes.canonical(np.dtype(name).type) == name        # np.float16 and friends
        assert dtypes.canonical(np.zeros((), name)[()]) == name    # a NumPy scalar


def test_python_types() -> None:
    assert dtypes.canonical(float) == "float32"
    assert dtypes.canonical(int) == "int32"
    assert dtypes.canonical(bool) == "bool"


@pytest.mark.parametrize("bad", ["float8", "half", "Float32", "", "complex64"])
def test_unknown_names_list_valid_ones(bad: str) -> None:
    with pytest.raises(ValueError, match="valid dtypes: float16, bfloat16, float32") as info:
        dtypes.canonical(bad)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("bad", [None, 3, object(), complex])
def test_non_dtypes_are_type_errors(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="valid dtypes"):
        dtypes.canonical(bad)


def test_predicates() -> None:
    assert all(dtypes.is_floating(n) for n in dtypes.FLOATING)
    assert not dtypes.is_floating("int32") and not dtypes.is_floating("bool")
    assert dtypes.is_integer("uint8") and dtypes.is_integer("int64")
    assert not dtypes.is_integer("bool") and not dtypes.is_integer("float16")
    assert {"float16", "bfloat16"} == dtypes.LOW_PRECISION


@pytest.mark.parametrize(("a", "b", "want"), [
    ("float16", "float16", "float16"),
    ("float16", "float32", "float32"),
    ("bfloat16", "float32", "float32"),
    ("float16", "bfloat16", "float32"),     # neither holds the other's values
    ("float32", "float64", "float64"),
    ("float16", "int64", "float16"),         # floats win over integers
    ("bool", "int8", "int8"),
    ("bool", "float16", "float16"),
    ("int8", "int32", "int32"),
    ("uint8", "uint16", "uint16"),
    ("uint8", "int16", "int16"),
    ("uint8", "int8", "int16"),
    ("uint32", "int32", "int64"),
    ("uint64", "int64", "int64"),
])
def test_promote(a: str, b: str, want: str) -> None:
    assert dtypes.promote(a, b) == want
    assert dtypes.promote(b, a) == want


def test_promotion_is_symmetric_and_closed() -> None:
    for a, b in itertools.product(dtypes.ALL, repeat=2):
        assert dtypes.promote(a, b) == dtypes.promote(b, a)
        assert dtypes.promote(a, b) in dtypes.ALL
    assert dtypes.promote_all(["int8", "float16", "float32"]) == "float32"
    assert dtypes.promote_all(["bool"]) == "bool"


def test_float_promotion_agrees_with_numpy_where_numpy_is_right() -> None:
    for a, b in itertools.product(["float16", "float32", "float64"], repeat=2):
        assert dtypes.promote(a, b) == np.promote_types(a, b).name
