"""oneDNN's eltwise GELU primitives (``eltwise_gelu_erf`` and ``eltwise_gelu_tanh``, forward
and backward from the input) on NumPy arrays, for the CPU backend's optional ``gelu`` and
``gelu_grad`` kernels: one vectorised pass each way, where NumPy's erf is a dozen passes (a
GELU layer's erf was an eighth of a small transformer's step on one thread).

Arrays are seen as flat (n,) vectors, so any C-contiguous shape is one problem per size. The
data is float32 or bfloat16 (a bfloat16 primitive computes in float32 and rounds once, the
kernels' contract; float16, which has no primitive on CPUs without avx512_fp16, runs as
float32 between the backend's vectorised casts, rounded once as the NumPy kernel rounds); the
primitives' results are oneDNN's, within a few float32 ulps of the
NumPy kernels' (both approximate erf and exp). Non-finite inputs: a NaN stays a NaN, and so do
the infinities here (oneDNN's gelu(+inf) is NaN, the NumPy kernel's +inf; gelu(-inf) is NaN in
both): a non-finite activation is non-finite either way, so the loss-scaling check skips the
step all the same.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from mpcore_xp import DTYPES

from .dnnl import (
    _ARG_DIFF_DST,
    _ARG_DIFF_SRC,
    _ARG_DST,
    _ARG_SRC,
    DATA_TYPES,
    PROP_FORWARD_TRAINING,
    DnnlError,
    Entry,
    Library,
    PrimitiveCache,
    _check,
    _Dims,
    _ExecArg,
    _vp,
    float16_as_float32,
    kernel_table,
    run_or_remember,
)

# dnnl_alg_kind_t of oneDNN v3 (dnnl_types.h: the eltwise kinds count up from relu = 0x20;
# v2's 0xcf and 0x30 are other kinds there)
ALG_GELU_TANH, ALG_GELU_ERF = 0x20 + 11, 0x20 + 17
FORWARD, BACKWARD = "forward", "backward"
Kernel = Callable[..., Any]
NAMES = ("gelu", "gelu_grad")


class EltwiseCache(PrimitiveCache):
    """GELU primitives, LRU-cached by (direction, approximate, size, dtype)."""

    def __init__(self, library: Library, max_entries: int = 64) -> None:
        super().__init__(library, max_entries)

    def forward(self, x: np.ndarray, approximate: bool) -> np.ndarray:
        flat = np.ascontiguousarray(x).reshape(-1)
        y = np.empty_like(flat)
        entry = self._get((FORWARD, approximate, flat.size, x.dtype.name),
                          lambda: self._create(FORWARD, approximate, flat.size, x.dtype.name))
        self._execute(entry, (flat, y))
        return y.reshape(x.shape)

    def backward(self, g: np.ndarray, x: np.ndarray, approximate: bool) -> np.ndarray:
        flat = np.ascontiguousarray(x).reshape(-1)
        gf = np.ascontiguousarray(g, x.dtype).reshape(-1)
        dx = np.empty_like(flat)
        entry = self._get((BACKWARD, approximate, flat.size, x.dtype.name),
                          lambda: self._create(BACKWARD, approximate, flat.size, x.dtype.name))
        self._execute(entry, (flat, gf, dx))
        return dx.reshape(x.shape)

    def _create(self, direction: str, approximate: bool, n: int, dtype: str) -> Entry:
        lib, engine = self.library.lib, self.library.engine
        alg = ALG_GELU_TANH if approximate else ALG_GELU_ERF
        md, pd, hint, primitive = _vp(), _vp(), _vp(), _vp()
        mems: list[Any] = []
        what = f"oneDNN gelu {direction} for {n} {dtype}"
        try:
            _check(lib.dnnl_memory_desc_create_with_strides(
                ctypes.byref(md), 1, _Dims(n), DATA_TYPES[dtype], _Dims(1)),
                "dnnl_memory_desc_create_with_strides")
            zero = ctypes.c_float(0.0)
            target = pd if direction == FORWARD else hint
            _check(lib.dnnl_eltwise_forward_primitive_desc_create(
                ctypes.byref(target), engine, PROP_FORWARD_TRAINING, alg, md, md, zero, zero,
                None), f"dnnl_eltwise_forward_primitive_desc_create: {what}")
            if direction == BACKWARD:
                _check(lib.dnnl_eltwise_backward_primitive_desc_create(
                    ctypes.byref(pd), engine, alg, md, md, md, zero, zero, hint, None),
                    f"dnnl_eltwise_backward_primitive_desc_create: {what}")
            _check(lib.dnnl_primitive_create(ctypes.byref(primitive), pd),
                   "dnnl_primitive_create")
            roles = ((_ARG_SRC, _ARG_DST) if direction == FORWARD
                     else (_ARG_SRC, _ARG_DIFF_DST, _ARG_DIFF_SRC))
            mems = [self._memory(md) for _ in roles]
        except DnnlError:
            self._destroy(Entry(primitive, pd, [md], mems, None, "", threading.Lock()))
            raise
        finally:
            if hint:
                lib.dnnl_primitive_desc_destroy(hint)
        args = (_ExecArg * len(roles))(*(_ExecArg(r, m) for r, m in zip(roles, mems)))
        return Entry(primitive, pd, [md], mems, args, "", threading.Lock())


class GeluKernels:
    """``gelu`` and ``gelu_grad`` on oneDNN for ``dtypes``, the CPU's kernels otherwise (and
    for a problem oneDNN fails on, logged once and not retried)."""

    def __init__(self, cache: EltwiseCache, dtypes: frozenset[str],
                 fallback: dict[str, Kernel], cast: Kernel | None = None) -> None:
        self.cache = cache
        self.dtypes = {DTYPES[d] for d in dtypes}
        #: the backend's cast (its float16 conversions are vectorised where NumPy's are not)
        self.cast = cast or (lambda x, dtype: x.astype(dtype))
        self.fallback = fallback
        self.failures: dict[tuple[Any, ...], str] = {}

    def table(self) -> dict[str, Kernel]:
        """The kernels by name, each carrying ``cache`` and ``eltwise`` (this object)."""
        return kernel_table(self, NAMES, "eltwise")

    def _onednn(self, name: str, x: np.ndarray, approximate: bool,
                run: Callable[[], np.ndarray]) -> np.ndarray | None:
        if x.dtype not in self.dtypes or x.size == 0:
            return None
        return run_or_remember(self.failures, (name, approximate, x.size, x.dtype.name), run,
                               name, "NumPy kernel")  # type: ignore[no-any-return]

    def gelu(self, x: np.ndarray, approximate: bool) -> tuple[np.ndarray, Any]:
        """(gelu(x), x): oneDNN's backward pass reads the input, so that is what is kept."""
        if float16_as_float32(self.dtypes, x) and x.size:
            y, _ = self.gelu(self.cast(x, "float32"), approximate)
            return self.cast(y, "float16"), None
        y = self._onednn("gelu", x, approximate, lambda: self.cache.forward(x, approximate))
        if y is None:
            return self.fallback["gelu"](x, approximate)  # type: ignore[no-any-return]
        return y, None

    def gelu_grad(self, g: np.ndarray, x: np.ndarray, saved: Any,
                  approximate: bool) -> np.ndarray:
        """g * gelu'(x), from the input (``saved`` is used only by the NumPy kernel: None
        where oneDNN ran the forward pass, then recomputed if the NumPy kernel must run)."""
        if float16_as_float32(self.dtypes, g, x) and x.size:
            dx = self.gelu_grad(self.cast(g, "float32"), self.cast(x, "float32"), None,
                                approximate)
            return self.cast(dx, "float16")  # type: ignore[no-any-return]
        if g.dtype == x.dtype:
            dx = self._onednn("gelu_grad", x, approximate,
                              lambda: self.cache.backward(g, x, approximate))
            if dx is not None:
                return dx
        if saved is None:
            saved = self.fallback["gelu"](x, approximate)[1]
        return self.fallback["gelu_grad"](g, x, saved, approximate)  # type: ignore[no-any-return]
