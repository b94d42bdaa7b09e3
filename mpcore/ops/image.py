"""Image ops, channels last (NHWC): ``conv2d``, ``max_pool2d`` and ``avg_pool2d``, with their
gradients.

``conv2d`` is the backend's fused ``conv2d`` kernel where it has that kernel and both of its
gradients' (``conv2d_backprop_input``, ``conv2d_backprop_filter``: optional kernels), recorded
as one op whose gradient calls them (a gradient of that gradient, under a recording tape, is
built of the composite's ops instead). Otherwise it is im2col plus one 2-D matmul: the
backend's ``extract_patches`` kernel lays every (kh, kw, C) window out as a row, and a single
GEMM against the (kh*kw*C, filters) kernel does the arithmetic. Either way it is an *allow* op:
the image and the kernel are promoted to one dtype and, when that is 16-bit, the arithmetic
runs in 16 bits with float32 accumulation like ``matmul``. The composite's gradient needs no
kernel of its own: matmul's gradient, then ``extract_patches_grad`` (col2im) for the image.

Padding follows TensorFlow: ``"valid"`` takes only whole windows; ``"same"`` gives
``ceil(size / stride)`` outputs and puts the odd pad row/column at the bottom/right.
"""

from __future__ import annotations

from typing import Any

from mpcore.core.tape import Node, recording
from mpcore.core.tensor import Tensor
from mpcore.ops.creation import constant
from mpcore.ops.dispatch import (
    Grads,
    as_tensor,
    cast,
    cast_to,
    common,
    finish,
    gradient,
    unrecorded,
)
from mpcore.ops.elementwise import divide
from mpcore.ops.linalg import matmul
from mpcore.ops.reduction import sum as _sum
from mpcore.ops.shapes import getitem, reshape

Pads = tuple[int, int, int, int]
_PADDINGS = ("valid", "same")


def pair(value: Any, what: str) -> tuple[int, int]:
    """``value`` (an int or two ints, each >= 1) as two ints; ``what`` names it in errors."""
    if isinstance(value, int) and not isinstance(value, bool):
        values = (value, value)
    else:
        try:
            values = tuple(int(v) for v in value)  # type: ignore[assignment]
        except TypeError:
            raise TypeError(f"{what} must be an int or a pair of ints, got {value!r}") from None
    if len(values) != 2 or min(values) < 1:
        raise ValueError(f"{what} must be an int or a pair of ints >= 1, got {value!r}")
    return values[0], values[1]


def _axis_pads(size: int, window: int, stride: int, padding: str) -> tuple[int, int, int]:
    """(output size, pad before, pad after) along one spatial axis."""
    if padding == "valid":
        if size < window:
            raise ValueError(f"window {window} is larger than the input size {size} with "
                             "padding='valid'")
        return (size - window) // stride + 1, 0, 0
    out = -(-size // stride)
    total = max((out - 1) * stride + window - size, 0)
    return out, total // 2, total - total // 2


def output_geometry(shape: tuple[int, ...], window: tuple[int, int], strides: tuple[int, int],
                    padding: str) -> tuple[int, int, Pads]:
    """(OH, OW, pads) for an NHWC ``shape``; pads are (top, bottom, left, right)."""
    padding = padding.lower() if isinstance(padding, str) else padding
    if padding not in _PADDINGS:
        raise ValueError(f"padding must be one of {', '.join(_PADDINGS)}, got {padding!r}")
    oh, top, bottom = _axis_pads(shape[1], window[0], strides[0], padding)
    ow, left, right = _axis_pads(shape[2], window[1], strides[1], padding)
    return oh, ow, (top, bottom, left, right)


def extract_patches(x: Tensor, kh: int, kw: int, strides: tuple[int, int], pads: Pads) -> Tensor:
    """Every (kh, kw) window of the NHWC ``x`` as a row: shape (N, OH, OW, kh*kw*C)."""
    be = x._backend
    data = be.kernels()["extract_patches"](x._data, kh, kw, strides[0], strides[1], pads)
    return finish("extract_patches", (x,), data, be, x._dtype,
                  {"kh": kh, "kw": kw, "strides": strides, "pads": pads,
                        "x_shape": x.shape})


def _extract_patches_grad(g: Tensor, x_shape: tuple[int, ...], kh: int, kw: int,
                          strides: tuple[int, int], pads: Pads) -> Tensor:
    be = g._backend
    data = be.kernels()["extract_patches_grad"](g._data, x_shape, kh, kw, strides[0],
                                                    strides[1], pads)
    return finish("extract_patches_grad", (g,), data, be, g._dtype,
                       {"kh": kh, "kw": kw, "strides": strides, "pads": pads})


def conv2d(x: Any, kernel: Any, strides: Any = 1, padding: str = "valid") -> Tensor:
    """2-D convolution (cross-correlation, as TF) of NHWC ``x`` with a ``(kh, kw, C, filters)``
    ``kernel``; returns (N, OH, OW, filters)."""
    (x, kernel), _, _ = common("conv2d", [x, kernel])
    if x.ndim != 4 or kernel.ndim != 4:
        raise ValueError(f"conv2d expects an NHWC image and a (kh, kw, C, filters) kernel, got "
                         f"shapes {x.shape} and {kernel.shape}")
    kh, kw, c, filters = kernel.shape
    if x.shape[3] != c:
        raise ValueError(f"conv2d: the image has {x.shape[3]} channels but the kernel expects "
                         f"{c} (image {x.shape}, kernel {kernel.shape})")
    sh, sw = pair(strides, "strides")
    _, _, pads = output_geometry(x.shape, (kh, kw), (sh, sw), padding)
    be = x._backend
    fused = _fused(be)
    if fused is not None:
        return finish("conv2d", (x, kernel), fused(x._data, kernel._data, sh, sw, pads), be,
                      x._dtype, {"strides": (sh, sw), "pads": pads})
    patches = extract_patches(x, kh, kw, (sh, sw), pads)
    return matmul(patches, reshape(kernel, (kh * kw * c, filters)))


def _fused(be: Any) -> Any:
    """The backend's ``conv2d`` kernel where it has all three convolution kernels (its
    gradient needs the other two), else None."""
    k = be.kernels()
    fused = k.get("conv2d")
    if fused is None or k.get("conv2d_backprop_input") is None \
            or k.get("conv2d_backprop_filter") is None:
        return None
    return fused


def _backprop_input(g: Tensor, kernel: Tensor, x_shape: tuple[int, ...],
                    strides: tuple[int, int], pads: Pads) -> Tensor:
    """The gradient of ``conv2d`` with respect to its image: the fused kernel, or under a
    recording tape (a gradient of a gradient) the composite's own ops, which have gradients:
    col2im of ``g @ kernel^T``."""
    kh, kw, c, filters = kernel.shape
    if recording():
        cols = matmul(g, reshape(kernel, (kh * kw * c, filters)), transpose_b=True)
        return _extract_patches_grad(cols, x_shape, kh, kw, strides, pads)
    be = g._backend
    data = be.kernels()["conv2d_backprop_input"](g._data, kernel._data, x_shape, *strides,
                                                 pads)
    return unrecorded("conv2d_backprop_input", (g, kernel), data, be, g._dtype)


def _backprop_filter(x: Tensor, g: Tensor, kernel_shape: tuple[int, ...],
                     strides: tuple[int, int], pads: Pads) -> Tensor:
    """The gradient of ``conv2d`` with respect to its kernel: the fused kernel, or under a
    recording tape the composite's ops, ``im2col(x)^T @ g``."""
    kh, kw, c, filters = kernel_shape
    if recording():
        patches = reshape(extract_patches(x, kh, kw, strides, pads), (-1, kh * kw * c))
        grad = matmul(patches, reshape(g, (-1, filters)), transpose_a=True)
        return reshape(grad, kernel_shape)
    be = g._backend
    data = be.kernels()["conv2d_backprop_filter"](x._data, g._data, kernel_shape, *strides,
                                                  pads)
    return unrecorded("conv2d_backprop_filter", (x, g), data, be, g._dtype)


def max_pool2d(x: Any, pool_size: Any = 2, strides: Any = None, padding: str = "valid") -> Tensor:
    """Max over (ph, pw) windows of the NHWC ``x`` (``strides`` default to ``pool_size``);
    padding never wins the max. The gradient goes to the first maximum of each window."""
    x = as_tensor(x)
    if x.ndim != 4:
        raise ValueError(f"max_pool2d expects an NHWC image of rank 4, got shape {x.shape}")
    ph, pw = pair(pool_size, "pool_size")
    sh, sw = pair(pool_size if strides is None else strides, "strides")
    _, _, pads = output_geometry(x.shape, (ph, pw), (sh, sw), padding)
    be = x._backend
    data = be.kernels()["max_pool2d"](x._data, ph, pw, sh, sw, pads)
    return finish("max_pool2d", (x,), data, be, x._dtype,
                       {"window": (ph, pw), "strides": (sh, sw), "pads": pads})


def avg_pool2d(x: Any, pool_size: Any = 2, strides: Any = None, padding: str = "valid") -> Tensor:
    """Mean over (ph, pw) windows of the NHWC ``x`` (``strides`` default to ``pool_size``).
    With ``"same"`` padding a window's mean is over its values inside the image (TF's rule:
    padding is not counted). Summed in float32 (a sum is a *deny* op), returned in ``x``'s
    dtype, as TF's AvgPool (an *infer* op) and PyTorch's avg_pool2d give it. A composite:
    non-overlapping whole windows are a reshape and one sum; others gather the windows with
    ``extract_patches`` (conv2d's im2col), whose gradient is col2im."""
    x = as_tensor(x)
    if x.ndim != 4:
        raise ValueError(f"avg_pool2d expects an NHWC image of rank 4, got shape {x.shape}")
    ph, pw = pair(pool_size, "pool_size")
    sh, sw = pair(pool_size if strides is None else strides, "strides")
    oh, ow, pads = output_geometry(x.shape, (ph, pw), (sh, sw), padding)
    n, h, w, c = x.shape
    if (sh, sw) == (ph, pw) and pads == (0, 0, 0, 0):
        if (oh * ph, ow * pw) != (h, w):   # "valid" drops the last partial windows
            x = getitem(x, (slice(None), slice(0, oh * ph), slice(0, ow * pw)))
        windows = reshape(x, (n, oh, ph, ow, pw, c))
        return cast(divide(_sum(windows, axis=(2, 4)), float(ph * pw)), x.dtype)
    patches = reshape(extract_patches(x, ph, pw, (sh, sw), pads), (n, oh, ow, ph * pw, c))
    total = _sum(patches, axis=3)
    if pads == (0, 0, 0, 0):
        return cast(divide(total, float(ph * pw)), x.dtype)
    return cast(divide(total, constant(_window_counts(h, w, oh, ow, (ph, pw), (sh, sw), pads),
                                       "float32", x._backend)), x.dtype)


def _window_counts(h: int, w: int, oh: int, ow: int, window: tuple[int, int],
                   strides: tuple[int, int], pads: Pads) -> list[list[list[float]]]:
    """How many of each window's values lie inside the image, as an (OH, OW, 1) nested list
    (a constant of the step: the geometry is static)."""
    def inside(size: int, start: int, length: int) -> int:
        return max(0, min(start + length, size) - max(start, 0))

    return [[[float(inside(h, i * strides[0] - pads[0], window[0])
                    * inside(w, j * strides[1] - pads[2], window[1]))]
             for j in range(ow)] for i in range(oh)]


# --- gradients ---------------------------------------------------------------------------
@gradient("conv2d")
def _conv2d_gradient(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    x, kernel = node.inputs
    a = node.attrs
    g = cast_to(g, x._dtype)
    return (_backprop_input(g, kernel, x.shape, a["strides"], a["pads"]) if needs[0] else None,
            _backprop_filter(x, g, kernel.shape, a["strides"], a["pads"]) if needs[1] else None)


@gradient("extract_patches")
def _extract_patches_gradient(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    a = node.attrs
    return (_extract_patches_grad(g, a["x_shape"], a["kh"], a["kw"], a["strides"], a["pads"]),)


@gradient("extract_patches_grad")
def _col2im_gradient(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    # col2im is the adjoint of im2col, so its own gradient is im2col again.
    a = node.attrs
    return (extract_patches(g, a["kh"], a["kw"], a["strides"], a["pads"]),)


@gradient("max_pool2d")
def _max_pool2d_gradient(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    (x,) = node.inputs
    y = node.output
    a = node.attrs
    be = g._backend
    g = cast_to(g, x._dtype)
    data = be.kernels()["max_pool2d_grad"](g._data, x._data, y._data, *a["window"],
                                               *a["strides"], a["pads"])
    return (unrecorded("max_pool2d_grad", (g, x, y), data, be, x._dtype),)
