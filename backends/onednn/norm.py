"""oneDNN's batch and layer normalization primitives on NumPy arrays: :class:`NormCache` runs
the training forward pass (statistics and normalization) and the backward pass (the gradients
with respect to the input, the scale and the shift), with primitives cached by problem.

Both work on a (rows, channels) view of a C-contiguous channels-last array, so nothing is
copied or reordered. Batch normalization describes it to oneDNN as a 4-D NHWC image of
``rows`` images of 1x1 pixels (logical N, C, H, W with strides (C, 1, C, C): its ``nhwc``,
which its jit kernels take); layer normalization, which normalizes the last logical axis, as
the 2-D (rows, channels) matrix itself, with one statistic per row.

The statistics are float32 (oneDNN's only statistics type); the data float32 or bfloat16 (a
bfloat16 primitive accumulates in float32 and rounds each result once). Scale and shift are
always used (``use_scale | use_shift``): a missing gamma is ones, a missing beta zeros, so one
primitive serves every call and the backward pass always yields both parameter gradients, as
the kernels' contract asks.

oneDNN takes the variance, not ``inv_std``, and computes ``1 / sqrt(variance + epsilon)``
itself. The backward kernels are given ``inv_std`` alone (no epsilon), so they hand oneDNN
``variance' = 1 / inv_std**2`` (computed in float64, rounded once) with epsilon 0:
``1 / sqrt(variance')`` is ``inv_std`` to within an ulp.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

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
)

Alloc = Callable[[tuple[int, ...], Any], np.ndarray]

# DNNL_ARG_MEAN, _VARIANCE, _SCALE, _SHIFT, DIFF_SCALE, DIFF_SHIFT (dnnl_types.h: the diffs
# are numbered apart, not DNNL_ARG_DIFF_FLAG | arg), dnnl_prop_kind_t's dnnl_backward,
# dnnl_normalization_flags_t
_ARG_MEAN, _ARG_VARIANCE, _ARG_SCALE, _ARG_SHIFT = 49, 50, 51, 52
_ARG_DIFF_SCALE, _ARG_DIFF_SHIFT = 255, 256
PROP_BACKWARD = 128
USE_SCALE, USE_SHIFT = 0x2, 0x4
BATCH, LAYER = "batch", "layer"
FORWARD, BACKWARD = "forward", "backward"

#: per direction and kind, the arguments in the order :meth:`NormCache._run` passes arrays
#: (oneDNN 3.2's layer normalization backward counts the shift among its inputs, unread; its
#: batch normalization backward refuses it)
_ARGS = {
    (FORWARD, BATCH): (_ARG_SRC, _ARG_DST, _ARG_MEAN, _ARG_VARIANCE, _ARG_SCALE, _ARG_SHIFT),
    (BACKWARD, BATCH): (_ARG_SRC, _ARG_DIFF_DST, _ARG_MEAN, _ARG_VARIANCE, _ARG_SCALE,
                        _ARG_DIFF_SRC, _ARG_DIFF_SCALE, _ARG_DIFF_SHIFT),
    (BACKWARD, LAYER): (_ARG_SRC, _ARG_DIFF_DST, _ARG_MEAN, _ARG_VARIANCE, _ARG_SCALE,
                        _ARG_SHIFT, _ARG_DIFF_SRC, _ARG_DIFF_SCALE, _ARG_DIFF_SHIFT),
}
_ARGS[FORWARD, LAYER] = _ARGS[FORWARD, BATCH]


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32)


class NormCache(PrimitiveCache):
    """Batch and layer normalization primitives, LRU-cached by (kind, direction, rows,
    channels, dtype, epsilon). Arrays are C-contiguous; statistics and parameters float32."""

    def __init__(self, library: Library, max_entries: int = 64) -> None:
        super().__init__(library, max_entries)
        self._ones: dict[int, np.ndarray] = {}
        self._zeros: dict[int, np.ndarray] = {}

    def params(self, channels: int, gamma: np.ndarray | None,
               beta: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """float32 scale and shift: ``gamma`` or ones, ``beta`` or zeros (kept per width)."""
        scale = (self._ones.setdefault(channels, np.ones(channels, np.float32))
                 if gamma is None else _f32(gamma))
        shift = (self._zeros.setdefault(channels, np.zeros(channels, np.float32))
                 if beta is None else _f32(beta))
        return scale, shift

    def forward(self, kind: str, x: np.ndarray, gamma: np.ndarray | None,
                beta: np.ndarray | None, epsilon: float, alloc: Alloc | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(y of ``x``'s shape and dtype, mean, biased variance): over every row for
        :data:`BATCH` (statistics per channel), over each row for :data:`LAYER`."""
        x2 = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
        rows, channels = x2.shape
        stats = channels if kind == BATCH else rows
        y = (alloc or np.empty)(x.shape, x.dtype)
        mean = np.empty(stats, np.float32)
        var = np.empty(stats, np.float32)
        scale, shift = self.params(channels, gamma, beta)
        self._run((kind, FORWARD, rows, channels, x.dtype.name, float(epsilon)),
                  (x2, y, mean, var, scale, shift))
        return y, mean, var

    def backward(self, kind: str, dy: np.ndarray, x: np.ndarray, mean: np.ndarray,
                 inv_std: np.ndarray, gamma: np.ndarray | None, alloc: Alloc | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(dx, dgamma, dbeta) given the forward pass's ``mean`` and ``inv_std``."""
        if dy.dtype != x.dtype or dy.shape != x.shape:
            raise ValueError(f"normalization gradient: dy {dy.dtype} {dy.shape} against x "
                             f"{x.dtype} {x.shape}")
        x2 = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
        dy2 = np.ascontiguousarray(dy).reshape(x2.shape)
        rows, channels = x2.shape
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            var = (1.0 / np.square(inv_std.astype(np.float64))).astype(np.float32)
        dx = (alloc or np.empty)(x.shape, x.dtype)
        dgamma = np.empty(channels, np.float32)
        dbeta = np.empty(channels, np.float32)
        scale, shift = self.params(channels, gamma, None)
        given = (shift,) if kind == LAYER else ()
        self._run((kind, BACKWARD, rows, channels, x.dtype.name, 0.0),
                  (x2, dy2, _f32(mean), var, scale, *given, dx, dgamma, dbeta))
        return dx, dgamma, dbeta

    def implementation(self, kind: str, direction: str, rows: int, channels: int,
                       dtype: str = "float32", epsilon: float = 1e-3) -> str:
        """The oneDNN implementation chosen for a problem (creating its primitive)."""
        key = (kind, direction, rows, channels, dtype, float(epsilon))
        return self._get(key, lambda: self._create(key)).impl

    def _run(self, key: tuple[Any, ...], arrays: tuple[np.ndarray, ...]) -> None:
        if key[4] not in DATA_TYPES:
            raise ValueError(f"oneDNN normalization here takes {', '.join(DATA_TYPES)}; got "
                             f"{key[4]}")
        entry = self._get(key, lambda: self._create(key))
        self._execute(entry, arrays)

    def _md(self, dims: tuple[int, ...], strides: tuple[int, ...], dtype: str) -> Any:
        md = _vp()
        _check(self.library.lib.dnnl_memory_desc_create_with_strides(
            ctypes.byref(md), len(dims), _Dims(*dims), DATA_TYPES[dtype], _Dims(*strides)),
            "dnnl_memory_desc_create_with_strides")
        return md

    def _create(self, key: tuple[Any, ...]) -> Entry:
        kind, direction, rows, channels, dtype, epsilon = key
        lib = self.library.lib
        engine = self.library.engine
        descs: list[Any] = []
        mems: list[Any] = []
        pd, hint, primitive = _vp(), _vp(), _vp()
        flags = USE_SCALE | USE_SHIFT
        what = f"oneDNN {kind} normalization {direction} for {key[2:]}"
        try:
            if kind == BATCH:
                data = self._md((rows, channels, 1, 1), (channels, 1, channels, channels),
                                dtype)
                stat = self._md((channels,), (1,), "float32")
            else:
                data = self._md((rows, channels), (channels, 1), dtype)
                stat = self._md((rows,), (1,), "float32")
            param = self._md((channels,), (1,), "float32")
            descs += [data, stat, param]
            if kind == BATCH:
                create_fwd: Callable[[Any], int] = lambda out: (  # noqa: E731
                    lib.dnnl_batch_normalization_forward_primitive_desc_create(
                        out, engine, PROP_FORWARD_TRAINING, data, data, ctypes.c_float(epsilon),
                        flags, None))
            else:
                create_fwd = lambda out: (  # noqa: E731
                    lib.dnnl_layer_normalization_forward_primitive_desc_create(
                        out, engine, PROP_FORWARD_TRAINING, data, data, stat,
                        ctypes.c_float(epsilon), flags, None))
            # the backward primitive is created with a forward one as its hint
            _check(create_fwd(ctypes.byref(pd if direction == FORWARD else hint)),
                   f"{kind}_normalization_forward_primitive_desc_create: {what}")
            if direction == BACKWARD:
                if kind == BATCH:
                    status = lib.dnnl_batch_normalization_backward_primitive_desc_create(
                        ctypes.byref(pd), engine, PROP_BACKWARD, data, data, data,
                        ctypes.c_float(epsilon), flags, hint, None)
                else:
                    status = lib.dnnl_layer_normalization_backward_primitive_desc_create(
                        ctypes.byref(pd), engine, PROP_BACKWARD, data, data, data, stat,
                        ctypes.c_float(epsilon), flags, hint, None)
                _check(status, f"{kind}_normalization_backward_primitive_desc_create: {what}")
            _check(lib.dnnl_primitive_create(ctypes.byref(primitive), pd),
                   "dnnl_primitive_create")
            roles = {_ARG_SRC: data, _ARG_DST: data, _ARG_DIFF_SRC: data, _ARG_DIFF_DST: data,
                     _ARG_MEAN: stat, _ARG_VARIANCE: stat}
            layout = [roles.get(arg, param) for arg in _ARGS[direction, kind]]
            for md in layout:
                mems.append(self._memory(md))
        except DnnlError:
            self._destroy(Entry(primitive, pd, descs, mems, None, "", threading.Lock()))
            raise
        finally:
            if hint:
                lib.dnnl_primitive_desc_destroy(hint)
        info = ctypes.c_char_p()
        impl = ""
        if lib.dnnl_primitive_desc_query(pd, 8, 0, ctypes.byref(info)) == 0:   # impl_info_str
            impl = (info.value or b"").decode(errors="replace")
        pairs = list(zip(_ARGS[direction, kind], mems))
        args = (_ExecArg * len(pairs))(*(_ExecArg(r, m) for r, m in pairs))
        return Entry(primitive, pd, descs, mems, args, impl, threading.Lock())
