"""The CPU backend: NumPy kernels, bfloat16 from ml_dtypes.

16-bit matmuls are computed through float32 GEMM (NumPy's own float16 matmul is ~300x slower;
it is never called). 16-bit elementwise kernels run NumPy's loops on the 16-bit arrays, under
an error state that keeps overflow quiet: under loss scaling an overflow to inf is expected and
handled (the step is skipped), not a bug to warn about.

NumPy converts float16 one element at a time (float32 -> float16 ~2.9 ms per million elements
here, the reverse ~1.3 ms, while a float32 add takes 0.4 ms), so float16 training is bound by
conversions, not by GEMMs. Four things keep their cost down: :func:`convert` takes the faster
route through ml_dtypes' complex32 (pairs of float16), identical to ``astype`` except for NaN
payloads; the float32 copy of a 16-bit GEMM operand is remembered (:class:`_Upcasts`) so the
forward and backward GEMMs that share an operand convert it once; the fused ``dense`` kernel
adds the bias and applies the activation in float32, rounding once; and every conversion the
backend makes goes through :meth:`CpuBackend.convert`, which a kernel provider can replace by
registering a ``convert`` kernel (``mpcore[onnxruntime]`` does: vectorised F16C conversions,
about 10x faster) without any special case here.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections import OrderedDict
from typing import Any

import ml_dtypes
import numpy as np

from mpcore.backend import Backend, Device, Support
from mpcore.dtypes import ALL as ALL_DTYPES
from mpcore.extras import install_command

from .cpuinfo import cpu_device
from .image_kernels import ImageKernels
from .pool import BufferPool, aligned_empty
from .relu_kernels import ReluKernels
from .rules import cpu_policy_support
from .train_kernels import TrainKernels

# NumPy's dtype for every mpcore dtype name (bfloat16 comes from ml_dtypes).
DTYPES: dict[str, Any] = {
    name: np.dtype(ml_dtypes.bfloat16 if name == "bfloat16" else name) for name in ALL_DTYPES}
LOW = frozenset({DTYPES["float16"], DTYPES["bfloat16"]})
F32 = DTYPES["float32"]
_quiet = functools.partial(np.errstate, over="ignore", invalid="ignore", divide="ignore",
                           under="ignore")


# A ufunc on 0-d arrays returns a NumPy scalar, so 0-d tensors hold np.generic values.
_ARRAYS = (np.ndarray, np.generic)

F16 = DTYPES["float16"]
_C64 = np.dtype(np.complex64)
_C32 = np.dtype(ml_dtypes.complex32) if hasattr(ml_dtypes, "complex32") else None
_ZERO32 = np.zeros((), F32)



#: Recycled buffers for the large outputs of this backend's kernels (one per process: it is
#: process memory that it recycles).
POOL = BufferPool()
#: Copies at least this large are cache-line aligned.
_ALIGNED_COPY_BYTES = 4096


def convert(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``x.astype(dtype)`` (a new array: a recycled buffer of :data:`POOL` where large), faster
    between float32 and float16: ml_dtypes converts complex64 -> complex32 with a vectorised
    loop, so a contiguous array of even size is converted as pairs. The result equals
    ``astype`` bit for bit except that a NaN's payload is not kept (it stays a NaN of the same
    sign)."""
    src = x.dtype
    pairs = None
    if (_C32 is not None and src != dtype and x.ndim and x.size % 2 == 0
            and x.flags.c_contiguous):
        if src == F32 and dtype == F16:
            pairs = (_C64, _C32)
        elif src == F16 and dtype == F32:
            pairs = (_C32, _C64)
    if not x.ndim:
        with _quiet():
            return x.astype(dtype)
    out = POOL.empty(x.shape, dtype)
    with _quiet():
        if pairs is not None:
            np.copyto(out.reshape(-1).view(pairs[1]), x.reshape(-1).view(pairs[0]),
                      casting="unsafe")
        else:
            np.copyto(out, x, casting="unsafe")
    return out


class _Upcasts:
    """The float32 copies of the last few 16-bit arrays that a GEMM converted, by identity.

    A training step multiplies each 16-bit activation, weight and gradient by two GEMMs (the
    forward and one backward, or the two backward ones), and each would convert it again. The
    copies are internal (never handed out as a kernel's result, so nothing writes into them);
    the 16-bit arrays are immutable by the kernel contract, and a weak reference proves that an
    entry's array is still the one that was converted (ids are reused after collection)."""

    def __init__(self, converter: Any, size: int = 16) -> None:
        self.size = size
        self.converter = converter
        self._entries: OrderedDict[int, tuple[Any, np.ndarray]] = OrderedDict()

    def get(self, x: np.ndarray) -> np.ndarray:
        if x.dtype == F32:
            return x
        key = id(x)
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is x:
            self._entries.move_to_end(key)
            return entry[1]
        up = self.converter(x, F32)
        try:
            ref = weakref.ref(x)
        except TypeError:  # NumPy scalars cannot be weakly referenced: nothing to reuse
            return up
        entries = self._entries
        for dead in [k for k, (r, _) in entries.items() if r() is None]:
            del entries[dead]   # free the copies of arrays that are gone
        entries[key] = (ref, up)
        if len(entries) > self.size:
            entries.popitem(last=False)
        return up

    def clear(self) -> None:
        self._entries.clear()


def _operands(a: Any, b: Any) -> tuple[Any, Any]:
    """Python scalars take the array's dtype (ml_dtypes' bfloat16 would widen to float32)."""
    if isinstance(a, _ARRAYS):
        if not isinstance(b, _ARRAYS):
            b = np.asarray(b, dtype=a.dtype)
    elif isinstance(b, _ARRAYS):
        a = np.asarray(a, dtype=b.dtype)
    return a, b


def _binary(ufunc: Any) -> Any:
    def kernel(self: Any, a: Any, b: Any) -> Any:
        a, b = _operands(a, b)
        if a.dtype in LOW:
            with _quiet():
                return ufunc(a, b)
        return ufunc(a, b)

    kernel.__name__ = ufunc.__name__
    return kernel


def is_all_finite(x: np.ndarray) -> bool:
    """Whether every value of ``x`` is finite, in one pass over it in the common case.

    Inf and NaN propagate through a sum of squares, so a finite ``x . x`` proves a finite
    tensor; only a non-finite one needs the exact check (large finite values can overflow the
    sum on their own). For float32/float64 the sum of squares is a BLAS dot, about twice as
    fast as ``x.sum()`` (NumPy's pairwise sum); 16-bit values are summed in float32."""
    if x.dtype in LOW:
        total = float(x.sum(dtype=F32))
    elif x.dtype.kind == "f" and x.flags.c_contiguous and x.dtype.itemsize >= 4:
        flat = x.reshape(-1)
        total = float(np.dot(flat, flat))
    else:
        total = float(x.sum())
    return math.isfinite(total) or bool(np.isfinite(x).all())


def _quiet_binary(ufunc: Any) -> Any:
    def kernel(self: Any, a: Any, b: Any) -> Any:
        a, b = _operands(a, b)
        with _quiet():
            return ufunc(a, b)

    kernel.__name__ = ufunc.__name__
    return kernel


def _unary(fn: Any, quiet: bool = False) -> Any:
    def kernel(self: Any, x: Any) -> Any:
        if quiet or x.dtype in LOW:
            with _quiet():
                return fn(x)
        return fn(x)

    kernel.__name__ = getattr(fn, "__name__", "kernel")
    return kernel


def _erf(x: np.ndarray) -> np.ndarray:
    """erf: exact (math.erf) in float64; in lower precision Abramowitz & Stegun 7.1.26
    (|error| < 1.5e-7, below float32's resolution of erf's range)."""
    if x.dtype == np.float64:
        return np.vectorize(math.erf, otypes=[np.float64])(x)
    x32 = x.astype(np.float32, copy=False)
    s = np.sign(x32)
    a = np.abs(x32)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                          + t * 1.061405429))))
    return (s * (1.0 - poly * np.exp(-a * a))).astype(x.dtype, copy=False)


class CpuBackend(ImageKernels, TrainKernels, ReluKernels, Backend):
    """NumPy on the host CPU; always available."""

    name = "cpu"
    priority = 100
    install_hint = install_command()

    def devices(self) -> list[Device]:
        return [cpu_device()]

    def policy_support(self, policy: str, device: Device) -> Support:
        return cpu_policy_support(policy, device.features, self.fast_dtypes_from_plugins())

    # --- host interop and creation ------------------------------------------------------
    def asarray(self, value: Any, dtype: str) -> np.ndarray:
        # No copy when the value already is a NumPy array of that dtype: tensors are
        # immutable and Variables copy what they are given.
        if hasattr(value, "get") and not isinstance(value, np.ndarray):
            value = value.get()  # a device array (CuPy, PyOpenCL) moving to the host
        return np.asarray(value, dtype=DTYPES[dtype])

    def to_host(self, x: np.ndarray) -> np.ndarray:
        view = x.view() if isinstance(x, np.ndarray) else np.asarray(x)
        view.flags.writeable = False  # t.numpy() must not let a caller edit the tensor
        return view

    def full(self, shape: tuple[int, ...], value: float, dtype: str) -> np.ndarray:
        return np.full(shape, value, dtype=DTYPES[dtype])

    def cast(self, x: np.ndarray, dtype: str) -> np.ndarray:
        # float32 -> float16 overflow is inf, by design (convert keeps it quiet)
        return self.convert(np.asarray(x), DTYPES[dtype])

    def convert(self, x: np.ndarray, dtype: Any) -> np.ndarray:
        """``x.astype(dtype)`` for every conversion this backend makes (casts, 16-bit GEMM
        operands and results, the fused kernels): a ``convert`` kernel from a kernel provider
        where one is installed, else :func:`convert`. A provider's ``convert(x, dtype)`` takes
        any array and a NumPy dtype and must return a new array equal to ``astype`` bit for
        bit (NaN payloads aside), falling back to :func:`convert` for what it does not
        handle."""
        table = self._kernel_table
        fast = table.get("convert") if table is not None else None
        return (fast or convert)(x, dtype)

    def copy(self, x: np.ndarray) -> np.ndarray:
        # Variables copy their values: large ones start on a cache line (see pool.py), as
        # weights are read by every GEMM and rewritten by every optimizer step
        x = np.asarray(x)
        if x.nbytes < _ALIGNED_COPY_BYTES:
            return np.array(x, copy=True)
        out = aligned_empty(x.shape, x.dtype)
        np.copyto(out, x)
        return out

    def random_uniform(self, shape: tuple[int, ...], dtype: str, seed: int, minval: float,
                       maxval: float) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64(seed))
        base = np.float64 if dtype == "float64" else np.float32
        out = rng.random(shape, dtype=base)
        if minval != 0.0 or maxval != 1.0:
            out *= maxval - minval
            out += minval
        return out.astype(DTYPES[dtype], copy=False)

    def random_normal(self, shape: tuple[int, ...], dtype: str, seed: int, mean: float,
                      stddev: float) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64(seed))
        base = np.float64 if dtype == "float64" else np.float32
        out = rng.standard_normal(shape, dtype=base)
        if stddev != 1.0:
            out *= stddev
        if mean != 0.0:
            out += mean
        return out.astype(DTYPES[dtype], copy=False)

    # --- elementwise --------------------------------------------------------------------
    add = _binary(np.add)
    subtract = _binary(np.subtract)
    multiply = _binary(np.multiply)
    divide = _quiet_binary(np.divide)
    power = _quiet_binary(np.power)
    maximum = _binary(np.maximum)
    minimum = _binary(np.minimum)
    equal = _binary(np.equal)
    not_equal = _binary(np.not_equal)
    less = _binary(np.less)
    less_equal = _binary(np.less_equal)
    greater = _binary(np.greater)
    greater_equal = _binary(np.greater_equal)
    logical_and = _binary(np.logical_and)
    logical_or = _binary(np.logical_or)
    logical_not = _unary(np.logical_not)
    isfinite = _unary(np.isfinite)
    negative = _unary(np.negative)
    abs = _unary(np.abs)
    sign = _unary(np.sign)
    exp = _unary(np.exp, quiet=True)
    log = _unary(np.log, quiet=True)
    sqrt = _unary(np.sqrt, quiet=True)
    square = _unary(np.square)
    tanh = _unary(np.tanh)
    erf = _unary(_erf, quiet=True)

    def relu(self, x: np.ndarray) -> np.ndarray:
        zero = np.zeros((), dtype=x.dtype)
        if not x.ndim:
            return np.maximum(x, zero)
        return np.maximum(x, zero, out=self.buffer(x.shape, x.dtype))

    def sigmoid(self, x: np.ndarray) -> np.ndarray:
        # 0.5 * (1 + tanh(x / 2)): one transcendental, no overflow for large |x|
        half = np.asarray(0.5, dtype=x.dtype)
        out = np.tanh(x * half)
        out += np.asarray(1, dtype=x.dtype)
        out *= half
        return out

    def where(self, cond: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.where(cond, a, b)

    # --- reductions ---------------------------------------------------------------------
    def sum(self, x: np.ndarray, axis: Any, keepdims: bool) -> np.ndarray:
        with _quiet():
            return np.asarray(np.sum(x, axis=axis, keepdims=keepdims, dtype=x.dtype))

    def mean(self, x: np.ndarray, axis: Any, keepdims: bool) -> np.ndarray:
        with _quiet():
            return np.asarray(np.mean(x, axis=axis, keepdims=keepdims, dtype=x.dtype))

    def max(self, x: np.ndarray, axis: Any, keepdims: bool) -> np.ndarray:
        return np.asarray(np.max(x, axis=axis, keepdims=keepdims))

    def min(self, x: np.ndarray, axis: Any, keepdims: bool) -> np.ndarray:
        return np.asarray(np.min(x, axis=axis, keepdims=keepdims))

    def argmax(self, x: np.ndarray, axis: int) -> np.ndarray:
        return np.asarray(np.argmax(x, axis=axis), dtype=np.int64)

    # --- matmul -------------------------------------------------------------------------
    def matmul(self, a: np.ndarray, b: np.ndarray, transpose_a: bool,
               transpose_b: bool) -> np.ndarray:
        dtype = a.dtype
        if dtype in LOW:
            # float32 GEMM, float32 accumulation; round once at the end
            a, b = self.upcast(a), self.upcast(b)
        # BLAS reads a transposed view in place (no copy)
        if transpose_a:
            a = np.swapaxes(a, -1, -2)
        if transpose_b:
            b = np.swapaxes(b, -1, -2)
        out = self._gemm(a, b)
        return self.convert(out, dtype) if dtype in LOW else out

    def _gemm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a @ b``; a 2-D float32 result goes into a recycled buffer."""
        if a.ndim == 2 and b.ndim == 2 and a.dtype == F32 and b.dtype == F32:
            return np.matmul(a, b, out=self.buffer((a.shape[0], b.shape[1]), F32))
        return np.matmul(a, b)

    def buffer(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised array for a kernel's output: large ones are recycled by
        :data:`POOL` (a training step reuses the memory of the previous one instead of
        faulting in fresh pages)."""
        return POOL.empty(shape, dtype)

    def upcast(self, x: np.ndarray) -> np.ndarray:
        """``x`` in float32 for a GEMM (read only: it may be shared with later calls)."""
        cache = self.__dict__.get("_upcasts")
        if cache is None:
            cache = self.__dict__["_upcasts"] = _Upcasts(self.convert)
        return cache.get(x)

    def dense(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
              activation: str | None) -> np.ndarray:
        """``activation(x @ w + b)``: the bias and the activation are applied in place on the
        float32 GEMM result, and 16-bit results are rounded once, at the end."""
        dtype = x.dtype
        low = dtype in LOW
        xs, ws = (self.upcast(x), self.upcast(w)) if low else (x, w)
        flat = xs.reshape(-1, xs.shape[-1]) if xs.ndim > 2 else xs
        z = self._gemm(flat, ws)
        if xs.ndim > 2:
            z = z.reshape(*xs.shape[:-1], -1)
        if b is not None:
            z += self.convert(b, F32) if low else b
        if activation == "relu":
            np.maximum(z, _ZERO32 if z.dtype == F32 else np.zeros((), z.dtype), out=z)
        elif activation is not None:
            raise ValueError(f"dense: unknown activation {activation!r}; the kernel fuses "
                             "'relu' or None")
        return self.convert(z, dtype) if low else z

    # --- shapes and indexing ------------------------------------------------------------
    def reshape(self, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return np.reshape(x, shape)

    def transpose(self, x: np.ndarray, perm: tuple[int, ...]) -> np.ndarray:
        return np.transpose(x, perm)

    def broadcast_to(self, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return np.broadcast_to(x, shape)

    def concat(self, xs: list[np.ndarray], axis: int) -> np.ndarray:
        return np.concatenate(xs, axis=axis)

    def take(self, x: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
        return np.take(x, indices, axis=axis)

    def take_grad(self, g: np.ndarray, indices: np.ndarray, axis: int,
                  shape: tuple[int, ...]) -> np.ndarray:
        out = np.zeros(shape, dtype=g.dtype)
        np.add.at(out, (slice(None),) * axis + (indices,), g)
        return out

    def getitem(self, x: np.ndarray, key: tuple[Any, ...]) -> np.ndarray:
        return np.asarray(x[key])

    def getitem_grad(self, g: np.ndarray, key: tuple[Any, ...],
                     shape: tuple[int, ...]) -> np.ndarray:
        out = np.zeros(shape, dtype=g.dtype)
        out[key] = g
        return out

    def one_hot(self, indices: np.ndarray, depth: int, dtype: str) -> np.ndarray:
        return (indices[..., None] == np.arange(depth)).astype(DTYPES[dtype])

    # --- loss scaling -------------------------------------------------------------------
    def unscale_and_check(self, grads: list[np.ndarray],
                          inv_scale: float) -> tuple[list[np.ndarray], np.ndarray]:
        scale = np.float32(inv_scale)
        outs = []
        finite = True
        with _quiet():
            for g in grads:
                if g.dtype == F32:
                    u = np.multiply(g, scale, out=self.buffer(g.shape, F32) if g.ndim else None)
                else:
                    u = self.convert(g, F32)  # always a fresh array: scaled in place below
                    u *= scale
                outs.append(u)
                if finite:
                    finite = is_all_finite(u)
        return outs, np.asarray(finite)

    def all_finite(self, xs: list[np.ndarray]) -> np.ndarray:
        with _quiet():
            return np.asarray(all(is_all_finite(x) for x in xs))

    # --- fused versions of composite ops ------------------------------------------------
    def softmax(self, x: np.ndarray, axis: int) -> np.ndarray:
        z = x - x.max(axis=axis, keepdims=True)
        with _quiet():
            np.exp(z, out=z)
        z /= z.sum(axis=axis, keepdims=True)
        return z

    def log_softmax(self, x: np.ndarray, axis: int) -> np.ndarray:
        z = x - x.max(axis=axis, keepdims=True)
        with _quiet():
            z -= np.log(np.exp(z).sum(axis=axis, keepdims=True))
        return z

    def sparse_softmax_cross_entropy(self, logits: np.ndarray,
                                     labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n, classes = logits.shape
        if n and (labels.min() < 0 or labels.max() >= classes):
            bad = labels[(labels < 0) | (labels >= classes)][0]
            raise ValueError(f"label {int(bad)} is out of range: labels must be in "
                             f"[0, {classes}) for logits with {classes} classes")
        z = logits - logits.max(axis=1, keepdims=True)
        probs = np.exp(z)
        total = probs.sum(axis=1, keepdims=True)
        rows = np.arange(n)
        loss = np.log(total[:, 0]) - z[rows, labels]
        probs /= total
        return loss, probs

    def bias_add(self, x: np.ndarray, bias: np.ndarray) -> np.ndarray:
        if x.dtype == F16 and x.ndim:
            # NumPy's float16 add computes in float32 and rounds: the same, with faster
            # conversions than its per-element ones
            out = self.convert(x, F32)
            out += bias.astype(F32)
            return self.convert(out, F16)
        return x + bias

    def dropout_mask(self, shape: tuple[int, ...], rate: float, dtype: str,
                     seed: int) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64(seed))
        keep = rng.random(shape, dtype=np.float32) >= rate
        return np.where(keep, np.asarray(1.0 / (1.0 - rate), dtype=DTYPES[dtype]),
                        np.zeros((), dtype=DTYPES[dtype]))
