"""oneDNN's convolution primitives on NumPy arrays: :class:`ConvCache` runs a 2-D convolution
(channels last) forward, its gradient with respect to the image (backward data) and to the
kernel (backward weights), with primitives cached by problem.

The images keep mpcore's layout, described to oneDNN by strides, so no activation is copied or
reordered: NHWC (oneDNN's logical N, C, H, W with strides (H*W*C, 1, W*C, C), its ``acdb``).
The kernel, (kh, kw, C_in, filters) (HWIO: logical O, I, H, W with strides (1, O, KW*I*O, I*O),
its ``cdba``), is handed to oneDNN in the layout it asks for (``format_tag_any``) and reordered
to and from HWIO around each call (a few microseconds: kernels are small). With a plain HWIO
kernel, oneDNN 3.2 on avx512_core_bf16 takes its im2col GEMM for both backward passes and for
a bfloat16 forward pass, 2-7x slower than the brgemm/JIT kernels it picks for its own layout
(the ResNet's 3x3 layers, batch 64, one thread: backward weights 9.6 ms -> 2.0 ms at 28x28x16,
bfloat16 forward 6.3 -> 1.1 ms).

16-bit operands (bfloat16) accumulate in float32 inside the primitive and each result is
rounded once, as the GEMMs do. ``pads`` are (top, bottom, left, right), as ``mpcore.ops.image``
computes them (TensorFlow's "same" puts the odd row and column at the bottom and right, which
oneDNN takes as ``padding_r``).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .dnnl import (
    _ARG_DIFF_DST,
    _ARG_DIFF_SRC,
    _ARG_DIFF_WEIGHTS,
    _ARG_DST,
    _ARG_SCRATCHPAD,
    _ARG_SRC,
    _ARG_WEIGHTS,
    _QUERY_IMPL_INFO_STR,
    _QUERY_SCRATCHPAD_MD,
    _SCRATCH_ALIGN,
    _SCRATCHPAD_MODE_USER,
    ALG_CONVOLUTION_DIRECT,
    DATA_TYPES,
    FORMAT_TAG_ANY,
    PROP_FORWARD_TRAINING,
    QUERY_DIFF_WEIGHTS_MD,
    QUERY_WEIGHTS_MD,
    DnnlError,
    Entry,
    Library,
    PrimitiveCache,
    _check,
    _Dims,
    _ExecArg,
    _vp,
)

Pads = tuple[int, int, int, int]
Alloc = Callable[[tuple[int, ...], Any], np.ndarray]

_ARG_FROM, _ARG_TO = 1, 17   # a reorder's DNNL_ARG_FROM and DNNL_ARG_TO
FORWARD, BACKWARD_DATA, BACKWARD_WEIGHTS = "forward", "backward_data", "backward_weights"
#: per problem kind, the execution arguments of the (image, kernel, output) memory objects
_ARGS = {FORWARD: (_ARG_SRC, _ARG_WEIGHTS, _ARG_DST),
         BACKWARD_DATA: (_ARG_DIFF_SRC, _ARG_WEIGHTS, _ARG_DIFF_DST),
         BACKWARD_WEIGHTS: (_ARG_SRC, _ARG_DIFF_WEIGHTS, _ARG_DIFF_DST)}


def output_shape(x_shape: tuple[int, ...], w_shape: tuple[int, ...], sh: int, sw: int,
                 pads: Pads) -> tuple[int, int, int, int]:
    """(N, OH, OW, filters) of an NHWC image ``x_shape`` and an HWIO kernel ``w_shape``."""
    n, h, w, _ = x_shape
    kh, kw, _, filters = w_shape
    top, bottom, left, right = pads
    return (n, (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1, filters)


def _image_strides(shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(oneDNN dims N, C, H, W; element strides) of a C-contiguous NHWC array."""
    n, h, w, c = shape
    return (n, c, h, w), (h * w * c, 1, w * c, c)


def _kernel_strides(shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(oneDNN dims O, I, KH, KW; element strides) of a C-contiguous HWIO array."""
    kh, kw, c, o = shape
    return (o, c, kh, kw), (1, o, kw * c * o, c * o)


@dataclass
class ConvEntry(Entry):
    """A convolution primitive whose kernel operand is in a layout of oneDNN's choosing:
    ``reorder`` converts between it and HWIO through ``staging`` (before the primitive for the
    forward and backward-data passes, after it for backward weights); None where oneDNN chose
    HWIO itself."""

    reorder: Entry | None = None
    staging: np.ndarray | None = None
    staged: Any = field(default_factory=threading.Lock)


class ConvCache(PrimitiveCache):
    """Convolution primitives (forward, backward data, backward weights) cached (LRU) by
    problem: kind, shapes, strides, pads and dtype. A cached call is one
    ``dnnl_primitive_execute`` on the arrays, as :class:`~.matmul.MatmulCache`'s, with the
    scratchpad this cache owns (one per thread, grown to the largest need and kept)."""

    def __init__(self, library: Library, max_entries: int = 128) -> None:
        super().__init__(library, max_entries)

    def forward(self, x: np.ndarray, w: np.ndarray, sh: int, sw: int, pads: Pads,
                alloc: Alloc | None = None) -> np.ndarray:
        """The convolution of NHWC ``x`` with the HWIO kernel ``w`` (one dtype)."""
        y_shape = output_shape(x.shape, w.shape, sh, sw, pads)
        return self._run(FORWARD, x, w, None, x.shape, w.shape, y_shape, sh, sw, pads, alloc)

    def backward_data(self, dy: np.ndarray, w: np.ndarray, x_shape: tuple[int, ...], sh: int,
                      sw: int, pads: Pads, alloc: Alloc | None = None) -> np.ndarray:
        """The gradient with respect to the image of shape ``x_shape``."""
        return self._run(BACKWARD_DATA, None, w, dy, tuple(x_shape), w.shape, dy.shape, sh, sw,
                         pads, alloc)

    def backward_weights(self, x: np.ndarray, dy: np.ndarray, w_shape: tuple[int, ...],
                         sh: int, sw: int, pads: Pads, alloc: Alloc | None = None
                         ) -> np.ndarray:
        """The gradient with respect to the kernel of shape ``w_shape``."""
        return self._run(BACKWARD_WEIGHTS, x, None, dy, x.shape, tuple(w_shape), dy.shape, sh,
                         sw, pads, alloc)

    def implementation(self, kind: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...],
                       sh: int, sw: int, pads: Pads, dtype: str) -> str:
        """The oneDNN implementation chosen for a problem (creating its primitive), as its
        verbose mode names it."""
        y_shape = output_shape(x_shape, w_shape, sh, sw, pads)
        key = (kind, tuple(x_shape), tuple(w_shape), y_shape, sh, sw, tuple(pads), dtype)
        return self._get(key, lambda: self._create(key)).impl

    def _run(self, kind: str, x: np.ndarray | None, w: np.ndarray | None,
             dy: np.ndarray | None, x_shape: tuple[int, ...], w_shape: tuple[int, ...],
             y_shape: tuple[int, ...], sh: int, sw: int, pads: Pads,
             alloc: Alloc | None) -> np.ndarray:
        given = [a for a in (x, w, dy) if a is not None]
        dtype = given[0].dtype
        if any(a.dtype != dtype for a in given):
            raise ValueError(f"convolution operands differ in dtype: "
                             f"{', '.join(str(a.dtype) for a in given)}")
        name = dtype.name
        if name not in DATA_TYPES:
            raise ValueError(f"oneDNN convolution here takes {', '.join(DATA_TYPES)}; got {name}")
        key = (kind, x_shape, w_shape, y_shape, sh, sw, pads, name)
        entry = self._get(key, lambda: self._create(key))
        out_shape = {FORWARD: y_shape, BACKWARD_DATA: x_shape, BACKWARD_WEIGHTS: w_shape}[kind]
        out = (alloc or np.empty)(out_shape, dtype)
        if out.shape != out_shape or out.dtype != dtype or not out.flags.c_contiguous:
            raise ValueError(f"alloc returned {out.dtype} {out.shape}, not a C-contiguous "
                             f"{dtype} {out_shape}")
        # the memory objects are (image, kernel, output of the forward pass), whatever is read
        # or written: the result takes the place of the operand it is the gradient of
        ins = [np.ascontiguousarray(a) if a is not None else out for a in (x, w, dy)]
        if kind == FORWARD:
            ins[2] = out
        scratch = (self._scratch_address(entry.scratch_bytes)
                   if entry.scratch_mem is not None else None)
        staging = entry.staging
        if staging is None:
            self._execute(entry, tuple(ins), scratch)
            return out
        plain = ins[1]
        ins[1] = staging
        with entry.staged:   # (one staging buffer per primitive: calls on it take turns)
            if kind == BACKWARD_WEIGHTS:
                self._execute(entry, tuple(ins), scratch)
                self._execute(entry.reorder, (staging, plain))
            else:
                self._execute(entry.reorder, (plain, staging))
                self._execute(entry, tuple(ins), scratch)
        return out

    def _md(self, dims: tuple[int, ...], strides: tuple[int, ...] | None, dtype: str) -> Any:
        """A memory descriptor (its entry destroys it): dense with these element strides, or
        of oneDNN's choosing (``format_tag_any``) where ``strides`` is None."""
        md = _vp()
        lib = self.library.lib
        if strides is None:
            _check(lib.dnnl_memory_desc_create_with_tag(ctypes.byref(md), len(dims),
                                                        _Dims(*dims), DATA_TYPES[dtype],
                                                        FORMAT_TAG_ANY),
                   "dnnl_memory_desc_create_with_tag")
        else:
            _check(lib.dnnl_memory_desc_create_with_strides(
                ctypes.byref(md), len(dims), _Dims(*dims), DATA_TYPES[dtype], _Dims(*strides)),
                "dnnl_memory_desc_create_with_strides")
        return md

    def _create(self, key: tuple[Any, ...]) -> ConvEntry:
        kind, x_shape, w_shape, y_shape, sh, sw, pads, dtype = key
        lib = self.library.lib
        engine = self.library.engine
        descs: list[Any] = []
        mems: list[Any] = []
        scratch_mem = _vp()
        scratch_bytes = 0
        pd, hint, primitive, attr = _vp(), _vp(), _vp(), _vp()
        reorder: Entry | None = None
        top, bottom, left, right = pads
        geometry = (_Dims(sh, sw), _Dims(0, 0), _Dims(top, left), _Dims(bottom, right))
        w_dims, w_strides = _kernel_strides(w_shape)
        try:
            descs.append(self._md(*_image_strides(x_shape), dtype))
            # the kernel in a layout of oneDNN's choosing: with the plain HWIO one, oneDNN 3.2
            # falls back to its im2col GEMM for both backward passes (and for a bfloat16
            # forward), 2-5x slower than the blocked brgemm/jit kernels
            descs.append(self._md(w_dims, None, dtype))
            descs.append(self._md(*_image_strides(y_shape), dtype))
            descs.append(self._md(w_dims, w_strides, dtype))
            _check(lib.dnnl_primitive_attr_create(ctypes.byref(attr)),
                   "dnnl_primitive_attr_create")
            _check(lib.dnnl_primitive_attr_set_scratchpad_mode(attr, _SCRATCHPAD_MODE_USER),
                   "dnnl_primitive_attr_set_scratchpad_mode")
            what = f"oneDNN convolution {kind} for {key[1:]}"
            # the backward primitives are created with a forward one as their hint (oneDNN
            # picks the matching implementation from it)
            _check(lib.dnnl_convolution_forward_primitive_desc_create(
                ctypes.byref(hint if kind != FORWARD else pd), engine, PROP_FORWARD_TRAINING,
                ALG_CONVOLUTION_DIRECT, descs[0], descs[1], None, descs[2], *geometry, attr),
                f"dnnl_convolution_forward_primitive_desc_create: {what}")
            if kind == BACKWARD_DATA:
                _check(lib.dnnl_convolution_backward_data_primitive_desc_create(
                    ctypes.byref(pd), engine, ALG_CONVOLUTION_DIRECT, descs[0], descs[1],
                    descs[2], *geometry, hint, attr),
                    f"dnnl_convolution_backward_data_primitive_desc_create: {what}")
            elif kind == BACKWARD_WEIGHTS:
                _check(lib.dnnl_convolution_backward_weights_primitive_desc_create(
                    ctypes.byref(pd), engine, ALG_CONVOLUTION_DIRECT, descs[0], descs[1], None,
                    descs[2], *geometry, hint, attr),
                    f"dnnl_convolution_backward_weights_primitive_desc_create: {what}")
            _check(lib.dnnl_primitive_create(ctypes.byref(primitive), pd),
                   "dnnl_primitive_create")
            # the layout chosen for the kernel (owned by the primitive descriptor)
            chosen = lib.dnnl_primitive_desc_query_md(
                pd, QUERY_DIFF_WEIGHTS_MD if kind == BACKWARD_WEIGHTS else QUERY_WEIGHTS_MD, 0)
            if not chosen:
                raise DnnlError(f"{what}: no weights memory descriptor")
            plain = descs[3]
            for md in (descs[0], chosen, descs[2]):
                mems.append(self._memory(md))
            if not lib.dnnl_memory_desc_equal(chosen, plain):
                reorder = (self._reorder(chosen, plain) if kind == BACKWARD_WEIGHTS
                           else self._reorder(plain, chosen))
            # owned by the primitive descriptor: not destroyed here
            scratch_md = lib.dnnl_primitive_desc_query_md(pd, _QUERY_SCRATCHPAD_MD, 0)
            scratch_bytes = lib.dnnl_memory_desc_get_size(scratch_md) if scratch_md else 0
            if scratch_bytes:
                scratch_mem = self._memory(scratch_md)
            staging_bytes = lib.dnnl_memory_desc_get_size(chosen) if reorder else 0
        except DnnlError:
            self._destroy(ConvEntry(primitive, pd, descs, mems, None, "", threading.Lock(),
                                    scratch_mem or None, reorder=reorder))
            raise
        finally:
            # a primitive descriptor keeps its own copies of the attributes and of the hint
            if attr:
                lib.dnnl_primitive_attr_destroy(attr)
            if hint:
                lib.dnnl_primitive_desc_destroy(hint)
        info = ctypes.c_char_p()
        impl = ""
        if lib.dnnl_primitive_desc_query(pd, _QUERY_IMPL_INFO_STR, 0, ctypes.byref(info)) == 0:
            impl = (info.value or b"").decode(errors="replace")
        pairs = list(zip(_ARGS[kind], mems))
        if scratch_bytes:
            pairs.append((_ARG_SCRATCHPAD, scratch_mem))
        args = (_ExecArg * len(pairs))(*(_ExecArg(r, m) for r, m in pairs))
        staging = None
        if reorder is not None:
            raw = np.empty(staging_bytes + _SCRATCH_ALIGN, np.uint8)
            at = (-raw.ctypes.data) % _SCRATCH_ALIGN
            staging = raw[at:at + staging_bytes]
        return ConvEntry(primitive, pd, descs, mems, args, impl, threading.Lock(),
                         scratch_mem if scratch_bytes else None, scratch_bytes,
                         reorder=reorder, staging=staging)

    def _reorder(self, src_md: Any, dst_md: Any) -> Entry:
        """A reorder primitive between two layouts of the kernel (the descriptors stay with
        their owners: the primitive and its memory objects keep copies)."""
        lib = self.library.lib
        engine = self.library.engine
        pd, primitive = _vp(), _vp()
        mems: list[Any] = []
        try:
            _check(lib.dnnl_reorder_primitive_desc_create(ctypes.byref(pd), src_md, engine,
                                                          dst_md, engine, None),
                   "dnnl_reorder_primitive_desc_create for a convolution kernel")
            _check(lib.dnnl_primitive_create(ctypes.byref(primitive), pd),
                   "dnnl_primitive_create")
            for md in (src_md, dst_md):
                mems.append(self._memory(md))
        except DnnlError:
            PrimitiveCache._destroy(self, Entry(primitive, pd, [], mems, None, "",
                                                threading.Lock()))
            raise
        args = (_ExecArg * 2)(_ExecArg(_ARG_FROM, mems[0]), _ExecArg(_ARG_TO, mems[1]))
        return Entry(primitive, pd, [], mems, args, "", threading.Lock())

    def _destroy(self, entry: Entry) -> None:
        reorder = getattr(entry, "reorder", None)
        if reorder is not None:
            super()._destroy(reorder)
        super()._destroy(entry)
