"""Matrix products: ``matmul`` and ``dense`` (the Dense layer's forward pass as one op), both
*allow* ops: 16-bit operands are multiplied with float32 accumulation. Their gradients."""

from __future__ import annotations

import builtins

from mpcore import ops as _ops
from mpcore.core.tape import Node
from mpcore.core.tensor import Tensor
from mpcore.ops.dispatch import Grads, TensorLike, common, finish, gradient
from mpcore.ops.elementwise import relu
from mpcore.ops.shapes import broadcast_to, reshape

#: The activations ``dense`` fuses (others run as their own op after it).
DENSE_ACTIVATIONS = (None, "relu")


def _vector_matmul(a: Tensor, b: Tensor, transpose_a: bool, transpose_b: bool) -> Tensor:
    """NumPy's (and Keras') matmul of a vector: a 1-D ``a`` is a row (a 1 put before its axis),
    a 1-D ``b`` a column (a 1 after), and the axis added is removed from the product; two
    vectors give their dot product, of shape (). Through reshapes, so the gradient is the
    matrices'."""
    sa, sb = a.shape, b.shape
    if (transpose_a and len(sa) == 1) or (transpose_b and len(sb) == 1):
        raise ValueError(f"matmul: a 1-D operand has no axes to transpose (shapes {sa} and "
                         f"{sb}); leave transpose_a/transpose_b False for it")
    row = len(sa) == 1
    column = len(sb) == 1
    # (checked here, to be named by the shapes given, not the reshaped ones)
    _check_inner(sa, sb, transpose_a, transpose_b, sa[0] if row else None,
                 sb[0] if column else None)
    out = matmul(reshape(a, (1, sa[0])) if row else a, reshape(b, (sb[0], 1)) if column else b,
                 transpose_a, transpose_b)
    # the batch axes, then the rows unless ``a`` is a vector, the columns unless ``b`` is
    rows, columns = out.shape[-2:-1], out.shape[-1:]
    return reshape(out, (*out.shape[:-2], *(() if row else rows), *(() if column else columns)))


def _check_inner(sa: tuple[int, ...], sb: tuple[int, ...], transpose_a: bool,
                 transpose_b: bool, ka: int | None = None, kb: int | None = None) -> None:
    """That ``a``'s columns (``ka`` where given: a vector's length) are ``b``'s rows."""
    ka = (sa[-2] if transpose_a else sa[-1]) if ka is None else ka
    kb = (sb[-1] if transpose_b else sb[-2]) if kb is None else kb
    if ka != kb:
        raise ValueError(f"matmul: inner dimensions differ: {sa}{'^T' if transpose_a else ''} "
                         f"@ {sb}{'^T' if transpose_b else ''} ({ka} != {kb})")


def matmul(a: TensorLike, b: TensorLike, transpose_a: bool = False,
           transpose_b: bool = False) -> Tensor:
    """Matrix product over the last two axes (an *allow* op: 16-bit operands are multiplied
    with float32 accumulation). ``transpose_a``/``transpose_b`` transpose an operand's last two
    axes without a copy. A batched ``a`` times a 2-D ``b`` is one 2-D GEMM. A 1-D operand is
    a vector, as NumPy's and Keras' (:func:`_vector_matmul`)."""
    (a, b), be, dt = common("matmul", [a, b])
    sa, sb = a.shape, b.shape
    if not sa or not sb:
        raise ValueError(f"matmul needs operands of rank >= 1 (a scalar's product is "
                         f"multiply), got shapes {sa} and {sb}")
    if len(sa) == 1 or len(sb) == 1:
        return _vector_matmul(a, b, transpose_a, transpose_b)
    _check_inner(sa, sb, transpose_a, transpose_b)
    if len(sa) > 2 and len(sb) == 2 and not transpose_a:
        flat = reshape(a, (-1, sa[-1]))
        out = matmul(flat, b, False, transpose_b)
        return reshape(out, (*sa[:-1], out.shape[-1]))
    if sa[:-2] != sb[:-2]:
        # batch axes broadcast as NumPy's (and TF's) matmul; the kernels see equal batch shapes
        # and broadcast_to's gradient sums the broadcast axes back
        batch = _broadcast_batch(sa[:-2], sb[:-2])
        if batch is None:
            raise ValueError(f"matmul: the batch dimensions of {sa} and {sb} do not broadcast "
                             "(each batch axis must be equal or 1)")
        a = broadcast_to(a, (*batch, *sa[-2:]))
        b = broadcast_to(b, (*batch, *sb[-2:]))
    data = be.kernels()["matmul"](a._data, b._data, transpose_a, transpose_b)
    return finish("matmul", (a, b), data, be, dt,
                  {"transpose_a": transpose_a, "transpose_b": transpose_b})


def _broadcast_batch(sa: tuple[int, ...], sb: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast of two batch shapes (right-aligned; each axis equal or 1), or None."""
    n = builtins.max(len(sa), len(sb))
    pa, pb = (1,) * (n - len(sa)) + sa, (1,) * (n - len(sb)) + sb
    if any(x != y and 1 not in (x, y) for x, y in zip(pa, pb)):
        return None
    return tuple(builtins.max(x, y) if 0 not in (x, y) else 0 for x, y in zip(pa, pb))


def dense(x: TensorLike, kernel: TensorLike, bias: TensorLike | None = None,
          activation: str | None = None) -> Tensor:
    """``activation(x @ kernel + bias)`` over the last axis of ``x``: the Dense layer's
    forward pass as one op (an *allow* op, like matmul). A backend's fused ``dense`` kernel
    adds the bias and applies the activation to the float32 GEMM result, so a 16-bit result is
    rounded once instead of after each step; without one it is matmul, bias_add and relu.
    ``activation`` is None or ``"relu"``."""
    if activation not in DENSE_ACTIVATIONS:
        raise ValueError(f"dense: activation must be one of {DENSE_ACTIVATIONS}, got "
                         f"{activation!r}")
    tensors, be, dt = common("dense", [x, kernel] if bias is None else [x, kernel, bias])
    x, w = tensors[0], tensors[1]
    b = tensors[2] if bias is not None else None
    if x.ndim < 2 or w.ndim != 2 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"dense: inputs of shape {x.shape} (rank >= 2) do not match a kernel "
                         f"of shape {w.shape} (in, out)")
    if b is not None and b.shape != w.shape[1:]:
        raise ValueError(f"dense: bias of shape {b.shape} does not match a kernel of shape "
                         f"{w.shape}")
    fused = be.kernels().get("dense")
    if fused is None:
        y = matmul(x, w)
        if b is not None:
            y = _ops.nn.bias_add(y, b)
        return relu(y) if activation == "relu" else y
    data = fused(x._data, w._data, None if b is None else b._data, activation)
    return finish("dense", (x, w) if b is None else (x, w, b), data, be, dt,
                  {"activation": activation})


# --- gradients ---------------------------------------------------------------------------
@gradient("matmul")
def _matmul(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    a, b = node.inputs
    ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
    ga = gb = None
    if needs[0]:
        if not ta:
            ga = matmul(g, b, False, not tb)           # g b^T   (or g b)
        else:
            ga = matmul(b, g, tb, True)                # b g^T   (or b^T g^T)
    if needs[1]:
        if not tb:
            gb = matmul(a, g, not ta, False)           # a^T g   (or a g)
        else:
            gb = matmul(g, a, True, ta)                # g^T a   (or g^T a^T)
    return ga, gb


@gradient("dense")
def _dense(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    nn = _ops.nn
    x, w = node.inputs[0], node.inputs[1]
    with_bias = len(node.inputs) == 3 and needs[2]
    gb = None
    if node.attrs["activation"] == "relu":
        if with_bias:  # the bias gradient summed in relu_grad's pass where the backend can
            g, gb = nn.relu_grad_bias(g, node.output)
        else:
            g = nn.relu_grad(g, node.output)
    gx = matmul(g, w, False, True) if needs[0] else None
    # one 2-D view of g for the weight and bias gradients: a backend that keeps the float32
    # copy of a 16-bit GEMM operand (by identity) then converts it once, not once per view
    g2 = reshape(g, (-1, g.shape[-1])) if g.ndim > 2 else g
    gw = None
    if needs[1]:
        x2 = reshape(x, (-1, x.shape[-1])) if x.ndim > 2 else x
        gw = matmul(x2, g2, True, False)
    if len(node.inputs) == 2:
        return gx, gw
    if with_bias and gb is None:
        gb = nn.bias_grad(g2)
    return gx, gw, gb
