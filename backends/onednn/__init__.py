"""oneDNN kernel provider for the CPU backend: a real bfloat16 GEMM (``pip install
"mpcore[onednn]"``).

NumPy has no bfloat16 GEMM, so the CPU backend computes bfloat16 matmuls in float32. This plugin
implements the ``mpcore_kernels`` hook for the ``cpu`` backend and replaces its ``matmul`` for
bfloat16 operands with oneDNN's matmul primitive (bfloat16 in, float32 accumulation, bfloat16
out), reading transposed operands in place through strided memory descriptors. Every other dtype
goes to the CPU backend's own matmul.

``MPCORE_ONEDNN`` chooses when:

- ``auto`` (default): only when the CPU has ``avx512_bf16`` or ``amx_bf16`` and the library
  loads; elsewhere oneDNN would emulate bfloat16 and be slower than NumPy's float32 GEMM.
- ``force``: whenever the library loads, whatever the CPU (to test correctness anywhere).
- ``off``: never.

A library that cannot be found or loaded leaves the CPU backend exactly as it was; why is kept in
:func:`status`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

import mpcore
from mpcore.backend import Backend, KernelSet

from .dnnl import DnnlError, Library, MatmulCache, find_library

__all__ = ["BF16_FLAGS", "MODES", "DnnlError", "Library", "MatmulCache", "library", "make_matmul",
           "mode", "status"]

MODES = ("auto", "force", "off")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")

_library: Library | None = None
_load_error: str | None = None
_status = "not asked yet"


def mode() -> str:
    """The ``MPCORE_ONEDNN`` setting; an unknown value is an error naming the valid ones."""
    value = os.environ.get("MPCORE_ONEDNN", "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"MPCORE_ONEDNN={value!r} is not valid; use one of {', '.join(MODES)}")
    return value


def status() -> str:
    """What the last ``mpcore_kernels`` call decided, and why."""
    return _status


def library() -> Library:
    """The loaded library (loaded once per process; a failure is remembered, not retried)."""
    global _library, _load_error
    if _library is None:
        if _load_error is not None:
            raise DnnlError(_load_error)
        try:
            _library = find_library()
        except DnnlError as exc:
            _load_error = str(exc)
            raise
    return _library


def make_matmul(original: Callable[..., Any], cache: MatmulCache) -> Callable[..., Any]:
    """The CPU ``matmul`` kernel with bfloat16 operands sent to oneDNN, everything else to
    ``original``."""
    bf16 = np.dtype(ml_dtypes.bfloat16)

    def matmul(a: np.ndarray, b: np.ndarray, transpose_a: bool, transpose_b: bool) -> Any:
        if a.dtype != bf16 or b.dtype != bf16 or a.ndim != b.ndim or a.size == 0 or b.size == 0:
            return original(a, b, transpose_a, transpose_b)
        if transpose_a:
            a = np.swapaxes(a, -1, -2)
        if transpose_b:
            b = np.swapaxes(b, -1, -2)
        return cache.matmul(a, b, "bfloat16")

    matmul.cache = cache  # type: ignore[attr-defined]
    matmul.original = original  # type: ignore[attr-defined]
    return matmul


@mpcore.hookimpl
def mpcore_kernels(backend: Backend) -> KernelSet | None:
    global _status
    if backend.name != "cpu":
        return None
    chosen = mode()
    if chosen == "off":
        _status = "off (MPCORE_ONEDNN=off)"
        return None
    have = [f for f in BF16_FLAGS if f in backend.device().features]
    if chosen == "auto" and not have:
        # Not even loaded: emulated bfloat16 in oneDNN is slower than NumPy's float32 GEMM.
        _status = (f"not used: this CPU lacks {' and '.join(BF16_FLAGS)} (MPCORE_ONEDNN=force "
                   "uses it anyway)")
        return None
    try:
        lib = library()
    except DnnlError as exc:
        _status = f"not used: {exc}"
        return None
    kernel = make_matmul(backend.matmul, MatmulCache(lib))
    where = "/".join(have) if have else f"no {'/'.join(BF16_FLAGS)}: emulated, forced"
    _status = f"used: {lib.describe()} ({where})"
    return KernelSet(
        provider="mpcore_onednn",
        kernels={"matmul": kernel},
        fast_dtypes=frozenset({"bfloat16"}),
        reason=f"{lib.describe()}, bfloat16 matmul with float32 accumulation",
    )
