"""FP8 ops: quantise to 8-bit codes, dequantise, the emulated FP8 GEMM, the scale update, and
``float8_dot``, the differentiable product a layer computes from quantised operands.

Codes are ``uint8`` tensors holding the bits of an OCP FP8 number, in one of two formats:
``"e4m3"`` (float8_e4m3fn: no infinities, max 448) or ``"e5m2"`` (float8_e5m2, max 57344).
The core never needs an FP8 dtype: the backends encode and decode the bits (NumPy through
ml_dtypes, OpenCL and CUDA by hand, bit-exact to ml_dtypes). Scales are multipliers, as in
Transformer Engine: ``codes = saturate(x * scale)`` and ``x ~ decode(codes) * (1 / scale)``.
A scale is a float32 tensor of shape ``()`` so that it can live on the device as a variable:
a traced step then records the whole scaling recipe, with no host read.

Saturation: ``x * scale`` is clipped to the format's largest finite value before the cast (an
infinity becomes the largest value, NaN stays NaN), because ml_dtypes' casts do not saturate.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from mpcore.core.tape import Node
from mpcore.core.tensor import Tensor
from mpcore.ops.creation import constant
from mpcore.ops.dispatch import Grads, TensorLike, cast, finish, gradient, unrecorded
from mpcore.ops.shapes import reshape


@dataclass(frozen=True)
class Float8Format:
    """One FP8 format: its short name, the ml_dtypes name of its NumPy type, its bit layout
    and its largest finite value."""

    name: str
    dtype: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float


FORMATS: dict[str, Float8Format] = {
    "e4m3": Float8Format("e4m3", "float8_e4m3fn", 4, 3, 7, 448.0),
    "e5m2": Float8Format("e5m2", "float8_e5m2", 5, 2, 15, 57344.0),
}
#: Keras' spellings of the same formats.
_ALIASES = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
#: Dtypes an FP8 GEMM may write.
GEMM_OUTPUTS = ("float32", "bfloat16")
_QUANTIZABLE = ("float16", "bfloat16", "float32")


def float8_format(name: Any) -> Float8Format:
    """The format named ``name`` ("e4m3", "e5m2", or Keras' "float8_e4m3fn", "float8_e5m2")."""
    if isinstance(name, Float8Format):
        return name
    key = _ALIASES.get(name, name) if isinstance(name, str) else None
    if key not in FORMATS:
        raise ValueError(f"unknown FP8 format {name!r}; valid formats: "
                         f"{', '.join([*FORMATS, *_ALIASES])}")
    return FORMATS[key]


class Quantized(NamedTuple):
    """A tensor quantised to FP8: its codes (uint8), the scale they were made with (float32,
    shape ()) and their format."""

    codes: Tensor
    scale: Tensor
    format: Float8Format


def _kernel(be: Any, name: str) -> Callable[..., Any]:
    kernel = be.kernels().get(name)
    if kernel is None:
        raise NotImplementedError(
            f"backend {be.name!r} has no {name!r} kernel, so it cannot run FP8 ops; the "
            "built-in backends cpu, opencl and cuda have it")
    return kernel


def scale_tensor(scale: TensorLike, be: Any, what: str) -> Tensor:
    # a number is checked here, on the host (a tensor's value would need a read): a zero,
    # negative or NaN multiplier gives codes of zeros, flipped signs or NaNs, never an error
    if isinstance(scale, numbers.Real) and not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"{what}: scale must be a finite number > 0 (a multiplier: codes = "
                         f"saturate(x * scale)), got {scale!r}")
    s = scale if isinstance(scale, Tensor) else constant(scale, dtype="float32", backend=be)
    if s.shape != () or s._dtype != "float32":
        raise ValueError(f"{what}: a scale is a float32 tensor of shape (), got dtype {s.dtype} "
                         f"and shape {s.shape}")
    if s._backend is not be:
        raise ValueError(f"{what}: the scale lives on backend {s._backend.name!r}, the data "
                         f"on {be.name!r}")
    return s


def quantize_fp8(x: TensorLike, scale: TensorLike, format: Any) -> tuple[Tensor, Tensor]:  # noqa: A002
    """``(codes, amax)``: the FP8 codes (uint8) of ``x * scale``, saturated to the format's
    range and rounded to nearest even, and ``max(|x|)`` of the unscaled input (float32, shape
    (); NaN when ``x`` holds a NaN), in one pass where the backend can. Not differentiable."""
    fmt = float8_format(format)
    x = x if isinstance(x, Tensor) else constant(x, dtype="float32")
    if x._dtype not in _QUANTIZABLE:
        raise TypeError(f"quantize_fp8: x must be one of {', '.join(_QUANTIZABLE)}, got "
                        f"{x.dtype}")
    be = x._backend
    s = scale_tensor(scale, be, "quantize_fp8")
    codes, amax = _kernel(be, "quantize_fp8")(x._data, s._data, fmt.name)
    return (unrecorded("quantize_fp8", (x, s), codes, be, "uint8"),
            unrecorded("fp8_amax", (x,), amax, be, "float32"))


def dequantize_fp8(codes: Tensor, scale: TensorLike, format: Any,  # noqa: A002
                   dtype: str = "float32") -> Tensor:
    """``decode(codes) * (1 / scale)`` in ``dtype`` (computed in float32, rounded once)."""
    fmt = float8_format(format)
    _check_codes(codes, "dequantize_fp8")
    if dtype not in _QUANTIZABLE:
        raise ValueError(f"dequantize_fp8: dtype must be one of {', '.join(_QUANTIZABLE)}, got "
                         f"{dtype!r}")
    be = codes._backend
    s = scale_tensor(scale, be, "dequantize_fp8")
    data = _kernel(be, "dequantize_fp8")(codes._data, s._data, fmt.name, dtype)
    return unrecorded("dequantize_fp8", (codes, s), data, be, dtype)


def _check_codes(codes: Any, what: str) -> None:
    if not isinstance(codes, Tensor) or codes._dtype != "uint8":
        raise TypeError(f"{what}: codes must be a uint8 tensor (from quantize_fp8), got "
                        f"{getattr(codes, 'dtype', type(codes).__name__)}")


def fp8_matmul(a: Quantized, b: Quantized, transpose_a: bool = False,
               transpose_b: bool = False, dtype: str = "float32") -> Tensor:
    """The emulated FP8 GEMM of two quantised 2-D operands: their codes decoded exactly,
    multiplied with float32 accumulation, the product scaled by ``(1/scale_a) * (1/scale_b)``
    (float32) and rounded once to ``dtype`` (float32 or bfloat16). Not recorded: gradients of
    FP8 products come from :func:`float8_dot`'s."""
    _check_codes(a.codes, "fp8_matmul")
    _check_codes(b.codes, "fp8_matmul")
    if dtype not in GEMM_OUTPUTS:
        raise ValueError(f"fp8_matmul: dtype must be one of {', '.join(GEMM_OUTPUTS)}, got "
                         f"{dtype!r}")
    sa, sb = a.codes.shape, b.codes.shape
    if len(sa) != 2 or len(sb) != 2:
        raise ValueError(f"fp8_matmul needs 2-D operands, got shapes {sa} and {sb}")
    ka = sa[0] if transpose_a else sa[1]
    kb = sb[1] if transpose_b else sb[0]
    if ka != kb:
        raise ValueError(f"fp8_matmul: inner dimensions differ: {sa}{'^T' if transpose_a else ''}"
                         f" @ {sb}{'^T' if transpose_b else ''} ({ka} != {kb})")
    be = a.codes._backend
    data = _kernel(be, "fp8_matmul")(a.codes._data, b.codes._data, a.scale._data,
                                     b.scale._data, a.format.name, b.format.name,
                                     bool(transpose_a), bool(transpose_b), dtype)
    return unrecorded("fp8_matmul", (a.codes, b.codes), data, be, dtype)


def fp8_scale(amax: Tensor, scale: Tensor, format: Any, margin: int = 0,  # noqa: A002
              power_of_two: bool = False) -> Tensor:
    """The scale that maps ``amax`` to the format's largest value, Transformer Engine's rule:
    ``fp8_max / amax / 2**margin``; the previous ``scale`` where ``amax`` is zero or not
    finite; float32's largest value where the quotient overflows. ``power_of_two`` rounds it
    down to a power of two (``2**floor(log2(...))`` of the exact quotient, so that
    ``amax * scale <= fp8_max`` always holds and scaling is exact)."""
    fmt = float8_format(format)
    if isinstance(margin, bool) or not isinstance(margin, int) or margin < 0:
        raise ValueError(f"fp8_scale: margin must be an int >= 0, got {margin!r}")
    be = amax._backend
    for t, what in ((amax, "amax"), (scale, "scale")):
        scale_tensor(t, be, f"fp8_scale ({what})")
    data = _kernel(be, "fp8_scale")(amax._data, scale._data, fmt.max, margin,
                                    bool(power_of_two))
    return unrecorded("fp8_scale", (amax, scale), data, be, "float32")


GradQuantizer = Callable[[Tensor], Quantized]


def float8_dot(x: Tensor, w: Tensor, qx: Quantized, qw: Quantized,
               grad_quantizer: GradQuantizer) -> Tensor:
    """``x @ w`` over the last axis of ``x``, computed from their quantised forms ``qx`` and
    ``qw`` by the FP8 GEMM, in float32. Differentiable in ``x`` and ``w``: the backward pass
    quantises the output gradient with ``grad_quantizer`` (which also keeps its scaling
    state) and computes both input gradients with FP8 GEMMs (Transformer Engine's dgrad and
    wgrad), in float32 and then the inputs' dtypes."""
    if w.ndim != 2 or x.ndim < 2 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"float8_dot: inputs of shape {x.shape} (rank >= 2) do not match a "
                         f"kernel of shape {w.shape} (in, out)")
    y = fp8_matmul(qx, qw)
    be, data = y._backend, y._data
    if x.ndim > 2:   # qx holds x's rows as one matrix
        data = be.kernels()["reshape"](data, (*x.shape[:-1], w.shape[1]))
    return finish("float8_dot", (x, w), data, be, "float32",
                  {"qx": qx, "qw": qw, "grad": grad_quantizer})


@gradient("float8_dot")
def _float8_dot(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    x, w = node.inputs
    qx, qw = node.attrs["qx"], node.attrs["qw"]
    g2 = reshape(g, (-1, g.shape[-1])) if g.ndim > 2 else g
    qg = node.attrs["grad"](cast(g2, "float32"))
    gx = gw = None
    if needs[0]:
        gx = fp8_matmul(qg, qw, transpose_b=True)            # dgrad: g w^T
        gx = cast(reshape(gx, x.shape) if x.ndim > 2 else gx, x.dtype)
    if needs[1]:
        gw = cast(fp8_matmul(qx, qg, transpose_a=True), w.dtype)   # wgrad: x^T g
    return gx, gw
