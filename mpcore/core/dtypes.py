"""Dtype names and promotion rules.

mpcore names dtypes with strings ("float16", "bfloat16", "float32", ...) so that the core never
depends on an array library. Backends map these names to their native dtypes.

>>> canonical("float16")
'float16'
>>> promote("float16", "float32")
'float32'
>>> promote("float16", "bfloat16")   # no common 16-bit type: widen to float32
'float32'
"""

from __future__ import annotations

from typing import Any

FLOATING: tuple[str, ...] = ("float16", "bfloat16", "float32", "float64")
SIGNED: tuple[str, ...] = ("int8", "int16", "int32", "int64")
UNSIGNED: tuple[str, ...] = ("uint8", "uint16", "uint32", "uint64")
ALL: tuple[str, ...] = (*FLOATING, *SIGNED, *UNSIGNED, "bool")

LOW_PRECISION = frozenset({"float16", "bfloat16"})
FLOATING_SET = frozenset(FLOATING)
INTEGER_SET = frozenset(SIGNED + UNSIGNED)

_FLOAT_RANK = {"float16": 1, "bfloat16": 1, "float32": 2, "float64": 3}
_INT_BITS = {name: int(name.lstrip("uint")) for name in SIGNED + UNSIGNED}


class DTypeName(str):
    """A dtype name that also answers ``.name``, so TF/NumPy-style code such as the guide's
    ``x.dtype.name`` runs; everywhere else it is the plain string."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return str(self)


_NAMED = {n: DTypeName(n) for n in ALL}


def named(name: str) -> str:
    """``name`` as a :class:`DTypeName` (what ``Tensor.dtype`` reports)."""
    return _NAMED.get(name, name)


# Python's own types map to what Keras calls floatx / TF's default integer type.
_PYTHON_TYPES = {float: "float32", int: "int32", bool: "bool"}


def canonical(dtype: Any) -> str:
    """The dtype's name, from a name, a Python type, or any object with a ``.name`` (NumPy,
    ml_dtypes and CuPy dtypes all have one). Raises with the list of valid names otherwise."""
    if isinstance(dtype, str):
        name = dtype
    elif dtype in _PYTHON_TYPES:
        return _PYTHON_TYPES[dtype]
    else:
        name = getattr(dtype, "name", None)
        if name is None and isinstance(dtype, type):
            # scalar types (np.float16, ml_dtypes.bfloat16) are named after their dtype
            name = dtype.__name__
        elif name is None:
            name = getattr(getattr(dtype, "dtype", None), "name", None)
        if not isinstance(name, str):
            raise TypeError(f"expected a dtype name such as 'float16', got {dtype!r}; "
                            f"valid dtypes: {', '.join(ALL)}")
    if name not in ALL:
        raise ValueError(f"unknown dtype {name!r}; valid dtypes: {', '.join(ALL)}")
    return name


def is_floating(name: str) -> bool:
    return name in FLOATING_SET


def is_integer(name: str) -> bool:
    return name in INTEGER_SET


def promote(a: str, b: str) -> str:
    """The dtype two operands are computed in: floats win over integers, wider wins over
    narrower, and float16 with bfloat16 meet in float32."""
    if a == b:
        return a
    fa, fb = a in FLOATING_SET, b in FLOATING_SET
    if fa and fb:
        ra, rb = _FLOAT_RANK[a], _FLOAT_RANK[b]
        if ra == rb:  # float16 vs bfloat16: neither holds the other's values
            return "float32"
        return a if ra > rb else b
    if fa:
        return a
    if fb:
        return b
    if a == "bool":
        return b
    if b == "bool":
        return a
    bits = max(_INT_BITS[a], _INT_BITS[b])
    if a.startswith("u") == b.startswith("u"):
        return ("uint" if a.startswith("u") else "int") + str(bits)
    unsigned, signed = (a, b) if a.startswith("u") else (b, a)
    if _INT_BITS[signed] > _INT_BITS[unsigned]:
        return signed
    return "int" + str(min(2 * _INT_BITS[unsigned], 64))


def promote_all(names: list[str]) -> str:
    result = names[0]
    for name in names[1:]:
        result = promote(result, name)
    return result
