"""relu for the oneDNN dense kernel: the forward pass after the GEMM (:func:`relu_in_place`),
the backward pass on oneDNN's OpenMP team (``relu_grad_bias``).

The forward relu is not a post-op of the matmul primitive: oneDNN's relu (an eltwise post-op,
or a binary ``max`` with 0) is x86's ``maxps(z, 0)``, which returns 0 for a NaN ``z``, so a NaN
input would vanish (a finite loss, plausible predictions) where the CPU kernel's ``np.maximum``
keeps it. No chain of oneDNN post-ops on the accumulator keeps NaN and sends -inf to 0, so the
relu is a pass of its own over the result.

For the backward pass, the CPU backend's kernel (mpcore_cpu.nn) selects on the bits of
``g`` in NumPy, on one thread; right after the step's GEMM, oneDNN's OpenMP worker spins on the
other core, so that thread cannot have it either. Here the selection is one oneDNN binary
primitive (both cores) and the bias gradient a GEMV, ``ones @ dz``, through the installed
``matmul`` kernel: oneDNN's above :data:`~mpcore_onednn.linalg.SMALL_GEMM` multiply-adds,
NumPy's BLAS below (a 128 x 1024 ``dz``: 9.6 us on NumPy against 26 on oneDNN, measured).

``relu_grad`` keeps ``g`` where ``y > 0`` and writes +0 elsewhere, even for an inf or NaN
``g`` (see mpcore_cpu.nn). A product ``g * (y > 0)`` would give -0 and NaN instead; this chain
(one rounding-free instruction per step, on the running value)::

    m  = max(y, 0) > 0          max(NaN, 0) is 0 here (the probe below checks), -0 compares 0
    dz = (m - 1) * g + g        live: +-0 * g + g = g, signed zeros kept; dead: -g + g = +0

is ``where(y > 0, g, +0)`` bit for bit wherever ``g`` is finite (bfloat16 operands are widened
inside the primitive, and ``g`` or +0 narrows back exactly, except where the CPU converts with
avx512_bf16's ``vcvtneps2bf16``, which flushes subnormals to zero: there the probe below fails
for bfloat16). A non-finite ``g`` makes a
non-finite ``dz`` (inf - inf, 0 * inf), hence a non-finite bias gradient (a column sum holding
inf or NaN is never finite): then the CPU kernel redoes the call exactly. That happens on
overflowed loss-scaled steps only, which are skipped anyway.

The NaN rule rests on oneDNN computing ``max`` as x86's ``maxps`` (the second operand when the
first is NaN); before first use in each dtype, :func:`_probe` runs the chain over every special
case against the CPU kernel and, on any difference (or where this oneDNN has no such primitive
for the CPU), the CPU kernel keeps the job. float16 is not taken: oneDNN 3.2 has no float16
binary primitive without avx512_fp16.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from mpcore_xp import BF16, F32

from mpcore.core.backend import bind_call

from .dnnl import DnnlError
from .elementwise import BinaryCache
from .optim import MIN_ELEMENTS, _mark

#: the dtypes it takes, by name, with the unsigned view that compares their bits
_DTYPES = {F32: ("float32", np.uint32), BF16: ("bfloat16", np.uint16)}
_ZERO = np.zeros(1, F32)
_ONE = np.ones(1, F32)
_CHAIN = (("gt", "scalar"), ("sub", "scalar"), ("mul", "full"), ("add", "full"))

Kernel = Callable[..., Any]


#: Elements per block of the bfloat16 forward relu (its mask stays in L2).
_BLOCK = 1 << 16
#: bfloat16 bits as int16: below this, a negative number (or -0); NaNs of either sign are above
_NEGATIVE_NUMBERS = -127


def relu_in_place(z: np.ndarray) -> None:
    """``z = max(z, 0)`` for a C-contiguous float32 or bfloat16 GEMM result, as the CPU
    backend's dense kernel computes it: NaN stays NaN (its sign too), -0 and -inf give +0.
    bfloat16 is rounded already; on the bits, that is ``round(max(z, 0))`` exactly (rounding
    to nearest keeps the sign and the NaN), without NumPy's element-by-element bfloat16 loop."""
    flat = z.reshape(-1)
    if z.dtype == F32:
        np.maximum(flat, _ZERO[0], out=flat)
        return
    if z.dtype != BF16:
        raise TypeError(f"relu_in_place takes float32 or bfloat16, not {z.dtype}")
    bits = flat.view(np.int16)
    keep = np.empty(min(_BLOCK, bits.size), bool)
    for lo in range(0, bits.size, _BLOCK):
        block = bits[lo:lo + _BLOCK]
        np.greater_equal(block, _NEGATIVE_NUMBERS, out=keep[:block.size])
        np.multiply(block, keep[:block.size], out=block)


def _eligible(g: np.ndarray, y: np.ndarray) -> bool:
    return (g.dtype in _DTYPES and y.dtype == g.dtype and g.shape == y.shape and y.ndim > 0
            and y.size >= MIN_ELEMENTS and g.flags.c_contiguous and y.flags.c_contiguous)


def _select(cache: BinaryCache, g: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:
    gf = g.reshape(-1)
    cache.run("max", y.reshape(-1), _ZERO, out.reshape(-1), _CHAIN, [_ZERO, _ONE, gf, gf],
              _DTYPES[g.dtype][0])


def _probe(cache: BinaryCache, original: Kernel, dtype: np.dtype) -> bool:
    """Whether the chain gives the CPU kernel's bits in ``dtype`` on every special value of
    ``y`` (NaNs, signed zeros and infinities, subnormals) against finite ``g`` of both signs,
    zeros included."""
    specials = np.array([np.nan, -np.nan, 0.0, -0.0, 1e-45, -1e-45, 1e-40, 1.0, -1.0, np.inf,
                         -np.inf, 3e38, -3e38], F32).astype(dtype)
    gs = np.array([-2.5, 0.0, -0.0, 7.0, 1e-45, 1e-40, -3e38], F32).astype(dtype)
    y = np.repeat(specials, len(gs))
    g = np.tile(gs, len(specials))
    got = np.empty_like(y)
    try:
        _select(cache, g, y, got)
    except DnnlError:  # e.g. no bfloat16 binary primitive for this CPU in this oneDNN
        return False
    with np.errstate(over="ignore"):  # the bias gradient of the huge column overflows
        want = original(g.reshape(len(specials), len(gs)), y.reshape(len(specials), len(gs)))[0]
    bits = _DTYPES[dtype][1]
    return bool(np.array_equal(got.view(bits), want.reshape(-1).view(bits)))


def make_relu_grad_bias(original: Kernel, cache: BinaryCache, matmul: Kernel,
                        alloc: Callable[[tuple[int, ...], Any], np.ndarray] | None = None
                        ) -> Kernel:
    """``relu_grad_bias(g, y) -> (dz, db)`` (the CPU kernel's signature and results) for large
    contiguous float32 or bfloat16 operands; everything else, and any call whose ``g`` is not
    finite, goes to ``original``. ``matmul`` is the installed (oneDNN) matmul kernel, which
    sums ``db`` as the CPU kernel's 16-bit path does (a bfloat16 GEMV, or float32 on the copy
    of ``dz`` the layer's GEMMs keep; a small float32 one on NumPy, ``linalg.SMALL_GEMM``);
    ``alloc`` gives ``dz`` (the CPU backend's recycled buffers)."""
    from mpcore_cpu.nn import column_sums

    alloc = alloc or np.empty
    trusted: dict[np.dtype, bool] = {}

    def relu_grad_bias(g: np.ndarray, y: np.ndarray) -> tuple[Any, Any]:
        if not _eligible(g, y):
            return original(g, y)
        if g.dtype not in trusted:
            trusted[g.dtype] = _probe(cache, original, g.dtype)
        if not trusted[g.dtype]:
            return original(g, y)
        dz = alloc(y.shape, g.dtype)
        try:
            _select(cache, g, y, dz)
        except DnnlError:
            trusted[g.dtype] = False
            return original(g, y)
        db = column_sums(matmul, dz)
        if not np.isfinite(db.astype(F32, copy=False)).all():
            return original(g, y)
        return dz, db

    def bind(g: np.ndarray, y: np.ndarray) -> Any:
        # calls it never takes (by dtype and size, which the trace fixes; contiguity it checks
        # at each call): the CPU kernel's binding, if it has one
        if g.dtype in _DTYPES and y.size >= MIN_ELEMENTS:
            return None
        return bind_call(original, g, y)

    relu_grad_bias.trusted = trusted  # type: ignore[attr-defined]
    relu_grad_bias.bind = bind  # type: ignore[attr-defined]
    return _mark(relu_grad_bias, original, cache)
