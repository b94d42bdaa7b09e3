"""Program generation, building and caching, and the base of every kernel family.

A program is one template of ``kernels/`` (``elementwise.cl``, ``reduce.cl``, ``nn.cl`` ...)
built for the dtypes in its slots (``A`` input, ``O`` output, ``L`` labels and indices) and one
float16 variant (:mod:`mpcore_opencl.half`); :meth:`mpcore_opencl.runtime.Runtime.program`
builds it. The elementwise program is generated too: its kernels are the ``UNARY``/``BINARY``
macro lines written here from the C expression of each op in the dtype's compute type. Every
program is built on first use and cached on the backend with its kernel objects.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .arrays import FLOATS, NAMES, NP_DTYPES, SCALAR, SIGNED, UNSIGNED, CLArray

Key = tuple[Any, ...]

# op -> C expression over x (and y) in the compute type, for float and integer dtypes
# (None: not defined there; the core only calls these ops on floats).
UNARY: dict[str, tuple[str | None, str | None]] = {
    "copy": ("x", "x"),
    "negative": ("-x", "-x"),
    "abs": ("fabs(x)", "(x < 0 ? -x : x)"),
    "sign": ("(MP_ISNAN(x) ? x : (A_CT)((x > 0) - (x < 0)))", "(A_CT)((x > 0) - (x < 0))"),
    "square": ("x * x", "x * x"),
    "relu": ("((x > 0 || MP_ISNAN(x)) ? x : (A_CT)0)", "(x > 0 ? x : (A_CT)0)"),
    "exp": ("exp(x)", None), "log": ("log(x)", None), "sqrt": ("sqrt(x)", None),
    "tanh": ("tanh(x)", None), "erf": ("erf(x)", None),
    "cos": ("cos(x)", None), "sin": ("sin(x)", None),
    "sigmoid": ("(A_CT)0.5 * ((A_CT)1 + tanh((A_CT)0.5 * x))", None),
}
UNARY_BOOL: dict[str, tuple[str, str]] = {
    "isfinite": ("MP_ISFINITE(x)", "1"),
    "logical_not": ("x == 0", "x == 0"),
}
BINARY: dict[str, tuple[str | None, str | None]] = {
    "add": ("x + y", "x + y"), "subtract": ("x - y", "x - y"), "multiply": ("x * y", "x * y"),
    "divide": ("x / y", None), "power": ("pow(x, y)", None),
    # NaN wins, as NumPy's maximum/minimum
    "maximum": ("((x > y || MP_ISNAN(x)) ? x : y)", "(x > y ? x : y)"),
    "minimum": ("((x < y || MP_ISNAN(x)) ? x : y)", "(x < y ? x : y)"),
}
BINARY_BOOL: dict[str, str] = {
    "equal": "x == y", "not_equal": "x != y", "less": "x < y", "less_equal": "x <= y",
    "greater": "x > y", "greater_equal": "x >= y",
    "logical_and": "(x != 0) && (y != 0)", "logical_or": "(x != 0) || (y != 0)",
}


def _expr(table_entry: tuple[str | None, str | None], dtype: str) -> str | None:
    f, i = table_entry
    if dtype in FLOATS:
        return f
    if dtype == "bool":
        return None
    if i is not None and dtype in UNSIGNED:
        i = i.replace("(x < 0 ? -x : x)", "x")
    return i


def elementwise_source(dtype: str, out: str) -> str:
    """The kernel lines of the elementwise program of ``dtype`` -> ``out``: same-dtype
    arithmetic, dtype -> bool predicates, or (other pairs) the conversion ``k_copy``."""
    lines = []
    if out == dtype:
        for op, entry in UNARY.items():
            e = _expr(entry, dtype) if op != "copy" else "x"
            if e is not None:
                lines.append(f"UNARY(k_{op}, {e})")
        for op, entry in BINARY.items():
            e = _expr(entry, dtype)
            if e is not None:
                lines.append(f"BINARY(k_{op}, {e})")
        if dtype == "bool":
            lines += ["BINARY(k_maximum, x || y)", "BINARY(k_minimum, x && y)",
                      "BINARY(k_add, x || y)", "BINARY(k_multiply, x && y)"]
    if out == "bool":
        for op, (f, i) in UNARY_BOOL.items():
            lines.append(f"UNARY(k_{op}, {f if dtype in FLOATS else i})")
        for op, e in BINARY_BOOL.items():
            lines.append(f"BINARY(k_{op}, {e})")
        if dtype != "bool":
            lines.append("UNARY(k_copy, x)")
    elif out != dtype:
        lines.append("UNARY(k_copy, x)")
    return "\n".join(lines)


class KernelFamily:
    """Base of the kernel-family mixins that make up
    :class:`~mpcore_opencl.backend.OpenCLBackend`: the programs they launch, built and cached
    per dtype and float16 variant, and the array helpers their host code shares."""

    # provided by the backend (backend.py) and by the other families
    _ew: dict[Key, Any]  # program cache
    _flat: dict[Key, Any]  # (op, dtype, out) -> the same-shape binary kernel
    _rt: Any
    runtime: Any
    device: Any
    half_choice: Any
    asarray: Any
    full: Any
    cast: Any
    reshape: Any
    multiply: Any
    greater: Any
    _random: Any

    def _native(self, dtypes: Any, native: bool | None, elementwise: bool = False) -> bool:
        """Whether programs over ``dtypes`` use native half: ``native`` when given (the
        measurement builds both variants), else the device's decision for the kernel family
        where float16 is in."""
        if native is not None:
            return native
        if "float16" not in dtypes:
            return False
        choice = self.half_choice()
        return choice.native_elementwise if elementwise else choice.native

    def _elementwise(self, dtype: str, out: str, native: bool | None = None) -> Any:
        """The elementwise program of ``dtype`` -> ``out`` (:func:`elementwise_source`, with
        the strided copies and ``where``); ``native``: the float16 variant (default: the
        device's)."""
        key = ("ew", dtype, out) if native is None else ("ew", dtype, out, native)
        prog = self._ew.get(key)
        if prog is None:
            prog = self.runtime.program("elementwise.cl", (("A", dtype), ("O", out)),
                                        elementwise_source(dtype, out),
                                        ("-DWITH_COPY", "-DWITH_WHERE"),
                                        self._native((dtype, out), native, elementwise=True))
            self._ew[key] = prog
        return prog

    def _prog(self, template: str, *slots: tuple[str, str], options: tuple[str, ...] = (),
              native: bool | None = None) -> Any:
        """The program of ``template`` for the dtypes in ``slots``, built with ``options``."""
        key = (template, slots, options) if native is None else (template, slots, options,
                                                                 native)
        prog = self._ew.get(key)
        if prog is None:
            prog = self._ew[key] = self.runtime.program(
                template, slots, "", options, self._native([dt for _, dt in slots], native))
        return prog

    # --- array helpers ------------------------------------------------------------------
    def _dt(self, x: CLArray) -> str:
        return NAMES[x.dtype]

    def _empty(self, shape: tuple[int, ...], dtype: str) -> CLArray:
        return self.runtime.empty(tuple(int(d) for d in shape), dtype)

    def _scalar(self, value: Any, dtype: str) -> Any:
        # Round the scalar to the array's dtype first, as NumPy does for a Python scalar.
        with np.errstate(over="ignore", invalid="ignore"):
            return SCALAR[dtype](np.asarray(value).astype(NP_DTYPES[dtype]))

    def _index_array(self, indices: Any) -> CLArray:
        """``indices`` as a device array of integers (TypeError for any other dtype)."""
        if not isinstance(indices, CLArray):
            indices = self.asarray(np.asarray(indices), str(np.asarray(indices).dtype))
        if self._dt(indices) not in SIGNED + UNSIGNED:
            raise TypeError(f"indices must be integers, got {self._dt(indices)}")
        return indices
