"""Gradients of every differentiable op, written with ops so they run on any backend.

A gradient function takes the recorded node, the gradient of its output and, per input, whether
that input needs a gradient (so, e.g., the first layer's input gradient is never computed). It
returns one gradient (or None) per input. ``backprop`` walks the tape backwards, casts each
gradient to its input's dtype (a float32 variable read in float16 gets a float32 gradient
through the cast's gradient) and sums gradients of inputs used more than once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mpcore import ops
from mpcore.tape import Node
from mpcore.tensor import Tensor

Grads = Sequence[Tensor | None]
GradFn = Callable[[Node, Tensor, tuple[bool, ...]], Grads]

GRADIENTS: dict[str, GradFn] = {}


def register(*names: str) -> Callable[[GradFn], GradFn]:
    def deco(fn: GradFn) -> GradFn:
        for name in names:
            GRADIENTS[name] = fn
        return fn
    return deco


def unbroadcast(g: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum ``g`` down to ``shape``: the gradient of broadcasting."""
    gs = g.shape
    if gs == shape:
        return g
    lead = len(gs) - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, d in enumerate(shape)
                                      if d == 1 and gs[i + lead] != 1)
    out = ops.sum(g, axis=axes) if axes else g
    return ops.reshape(out, shape)


def _shape(x: Any) -> tuple[int, ...]:
    return x.shape if isinstance(x, Tensor) else ()


# --- elementwise ------------------------------------------------------------------------
@register("add")
def _add(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    a, b = node.inputs
    return (unbroadcast(g, _shape(a)) if needs[0] else None,
            unbroadcast(g, _shape(b)) if needs[1] else None)


@register("subtract")
def _subtract(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    a, b = node.inputs
    return (unbroadcast(g, _shape(a)) if needs[0] else None,
            unbroadcast(ops.negative(g), _shape(b)) if needs[1] else None)


@register("multiply")
def _multiply(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    a, b = node.inputs
    return (unbroadcast(ops.multiply(g, b), _shape(a)) if needs[0] else None,
            unbroadcast(ops.multiply(g, a), _shape(b)) if needs[1] else None)


@register("divide")
def _divide(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    a, b = node.inputs
    ga = unbroadcast(ops.divide(g, b), _shape(a)) if needs[0] else None
    gb = None
    if needs[1]:
        gb = unbroadcast(ops.negative(ops.divide(ops.multiply(g, node.output), b)), _shape(b))
    return ga, gb


@register("power")
def _power(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    a, b = node.inputs
    ga = gb = None
    if needs[0]:
        ga = unbroadcast(ops.multiply(ops.multiply(g, b), ops.power(a, ops.subtract(b, 1.0))
                                      if isinstance(b, Tensor) else ops.power(a, b - 1.0)),
                         _shape(a))
    if needs[1]:
        # d(a^b)/db = a^b log a, defined for a > 0 (0 elsewhere, as TF)
        a_t = a if isinstance(a, Tensor) else ops.constant(a, dtype=node.output.dtype,
                                                           backend=node.output.backend)
        positive = ops.greater(a_t, 0)
        safe_log = ops.log(ops.where(positive, a_t, ops.ones_like(a_t)))
        gb = unbroadcast(ops.multiply(ops.multiply(g, node.output), safe_log), _shape(b))
    return ga, gb


def _select_grad(node: Node, g: Tensor, needs: tuple[bool, ...], pick_first: Tensor) -> Grads:
    a, b = node.inputs
    zero = ops.zeros_like(g)
    return (unbroadcast(ops.where(pick_first, g, zero), _shape(a)) if needs[0] else None,
            unbroadcast(ops.where(pick_first, zero, g), _shape(b)) if needs[1] else None)


@register("maximum")
def _maximum(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    a, b = node.inputs
    return _select_grad(node, g, needs, ops.greater_equal(a, b))


@register("minimum")
def _minimum(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    a, b = node.inputs
    return _select_grad(node, g, needs, ops.less_equal(a, b))


@register("negative")
def _negative(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (ops.negative(g),)


@register("abs")
def _abs(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (ops.multiply(g, ops.sign(node.inputs[0])),)


@register("sign")
def _sign(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (ops.zeros_like(g),)


@register("exp")
def _exp(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (ops.multiply(g, node.output),)


@register("log")
def _log(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (ops.divide(g, node.inputs[0]),)


@register("sqrt")
def _sqrt(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (ops.divide(g, ops.multiply(node.output, 2.0)),)


@register("square")
def _square(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (ops.multiply(g, ops.multiply(node.inputs[0], 2.0)),)


@register("relu")
def _relu(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (ops.relu_grad(g, node.output),)


@register("relu_grad")
def _relu_grad(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (ops.relu_grad(g, node.inputs[1]) if needs[0] else None, None)


@register("sigmoid")
def _sigmoid(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    y = node.output
    return (ops.multiply(g, ops.multiply(y, ops.subtract(1.0, y))),)


@register("tanh")
def _tanh(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    y = node.output
    return (ops.multiply(g, ops.subtract(1.0, ops.square(y))),)


@register("erf")
def _erf(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    x = node.inputs[0]
    return (ops.multiply(g, ops.multiply(ops.exp(ops.negative(ops.square(x))),
                                         1.1283791670955126)),)  # 2/sqrt(pi)


@register("where")
def _where(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    cond, a, b = node.inputs
    zero = ops.zeros_like(g)
    return (None,
            unbroadcast(ops.where(cond, g, zero), _shape(a)) if needs[1] else None,
            unbroadcast(ops.where(cond, zero, g), _shape(b)) if needs[2] else None)


@register("cast")
def _cast(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    x = node.inputs[0]
    from mpcore.dtypes import is_floating

    if not (is_floating(x.dtype) and is_floating(node.output.dtype)):
        return (None,)
    return (ops.cast(g, x.dtype),)


@register("bias_add")
def _bias_add(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    x, _ = node.inputs
    return (g if needs[0] else None,
            ops.sum(g, axis=tuple(range(x.ndim - 1))) if needs[1] else None)


# --- reductions -------------------------------------------------------------------------
def _kept_shape(shape: tuple[int, ...], axis: tuple[int, ...] | None) -> tuple[int, ...]:
    if axis is None:
        return (1,) * len(shape)
    return tuple(1 if i in axis else d for i, d in enumerate(shape))


def _expand_reduced(g: Tensor, node: Node) -> Tensor:
    x = node.inputs[0]
    axis, keepdims = node.attrs["axis"], node.attrs["keepdims"]
    if not keepdims:
        g = ops.reshape(g, _kept_shape(x.shape, axis))
    return ops.broadcast_to(g, x.shape)


@register("sum")
def _sum(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (_expand_reduced(g, node),)


@register("mean")
def _mean(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    x = node.inputs[0]
    axis = node.attrs["axis"]
    count = x.size if axis is None else _prod(x.shape[i] for i in axis)
    return (ops.divide(_expand_reduced(g, node), float(count)),)


def _prod(values: Any) -> int:
    out = 1
    for v in values:
        out *= v
    return out


@register("max", "min")
def _max(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    x = node.inputs[0]
    axis = node.attrs["axis"]
    y = node.output
    if not node.attrs["keepdims"]:
        y = ops.reshape(y, _kept_shape(x.shape, axis))
    hit = ops.cast(ops.equal(x, y), g.dtype)
    ties = ops.sum(hit, axis=axis, keepdims=True)  # split the gradient among equal maxima
    return (ops.divide(ops.multiply(_expand_reduced(g, node), hit), ties),)


# --- matmul -----------------------------------------------------------------------------
@register("matmul")
def _matmul(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    a, b = node.inputs
    ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
    ga = gb = None
    if needs[0]:
        if not ta:
            ga = ops.matmul(g, b, False, not tb)           # g b^T   (or g b)
        else:
            ga = ops.matmul(b, g, tb, True)                # b g^T   (or b^T g^T)
    if needs[1]:
        if not tb:
            gb = ops.matmul(a, g, not ta, False)           # a^T g   (or a g)
        else:
            gb = ops.matmul(g, a, True, ta)                # g^T a   (or g^T a^T)
    return ga, gb


@register("dense")
def _dense(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    x, w = node.inputs[0], node.inputs[1]
    with_bias = len(node.inputs) == 3 and needs[2]
    gb = None
    if node.attrs["activation"] == "relu":
        if with_bias:  # the bias gradient summed in relu_grad's pass where the backend can
            g, gb = ops.relu_grad_bias(g, node.output)
        else:
            g = ops.relu_grad(g, node.output)
    gx = ops.matmul(g, w, False, True) if needs[0] else None
    # one 2-D view of g for the weight and bias gradients: a backend that keeps the float32
    # copy of a 16-bit GEMM operand (by identity) then converts it once, not once per view
    g2 = ops.reshape(g, (-1, g.shape[-1])) if g.ndim > 2 else g
    gw = None
    if needs[1]:
        x2 = ops.reshape(x, (-1, x.shape[-1])) if x.ndim > 2 else x
        gw = ops.matmul(x2, g2, True, False)
    if len(node.inputs) == 2:
        return gx, gw
    if with_bias and gb is None:
        gb = ops.bias_grad(g2)
    return gx, gw, gb


# --- shapes -----------------------------------------------------------------------------
@register("reshape")
def _reshape(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (ops.reshape(g, node.inputs[0].shape),)


@register("transpose")
def _transpose(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    perm = node.attrs["perm"]
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return (ops.transpose(g, inverse),)


@register("broadcast_to")
def _broadcast_to(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (unbroadcast(g, node.inputs[0].shape),)


@register("concat")
def _concat(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    axis, sizes = node.attrs["axis"], node.attrs["sizes"]
    out: list[Tensor | None] = []
    start = 0
    lead = (slice(None),) * axis
    for need, size in zip(needs, sizes):
        out.append(ops.getitem(g, (*lead, slice(start, start + size))) if need else None)
        start += size
    return out


@register("take")
def _take(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    _, idx = node.inputs
    return (ops._take_grad(g, idx, node.attrs["axis"], node.attrs["shape"]), None)


@register("take_grad")
def _take_grad(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    _, idx = node.inputs
    return (ops.take(g, idx, node.attrs["axis"]), None)


@register("getitem")
def _getitem(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (ops._getitem_grad(g, node.attrs["key"], node.attrs["shape"]),)


@register("getitem_grad")
def _getitem_grad(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (ops.getitem(g, node.attrs["key"]),)


# --- softmax and losses (used when a backend fuses them) --------------------------------
@register("softmax")
def _softmax(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    y, axis = node.output, node.attrs["axis"]
    inner = ops.sum(ops.multiply(g, y), axis=axis, keepdims=True)
    return (ops.multiply(y, ops.subtract(g, inner)),)


@register("log_softmax")
def _log_softmax(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    y, axis = node.output, node.attrs["axis"]
    return (ops.subtract(g, ops.multiply(ops.exp(y), ops.sum(g, axis=axis, keepdims=True))),)


@register("sparse_softmax_cross_entropy")
def _sparse_xent(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    logits, labels = node.inputs
    fused = logits.backend._kernel_table.get("sparse_softmax_cross_entropy_grad")
    if fused is not None and not ops._state.tapes:  # recording tapes need the composite ops
        data = fused(node.saved, labels._data, g._data)
        return (Tensor(data, logits.backend, logits.dtype), None)
    probs = Tensor(node.saved, logits.backend, logits.dtype)
    delta = ops.subtract(probs, ops.one_hot(labels, logits.shape[1], logits.dtype))
    return (ops.multiply(delta, ops.expand_dims(g, 1)), None)


# --- the walk ---------------------------------------------------------------------------
def backprop(nodes: list[Node], targets: list[Tensor], seeds: list[Tensor | None],
             sources: list[Tensor]) -> list[Tensor | None]:
    source_ids = {id(s) for s in sources}
    # Only nodes downstream of a source matter; only their inputs need gradients.
    relevant = set(source_ids)
    for node in nodes:
        for i in node.input_ids:
            if i in relevant:
                relevant.add(id(node.output))
                break
    grads: dict[int, Tensor] = {}
    for target, seed in zip(targets, seeds):
        if not isinstance(target, Tensor):
            raise TypeError(f"gradient target must be a tensor, got {target!r}")
        g = ops.ones_like(target) if seed is None else ops.constant(seed, dtype=target.dtype,
                                                                    backend=target.backend)
        _accumulate(grads, id(target), g)
    for node in reversed(nodes):
        out_id = id(node.output)
        if out_id not in relevant:
            continue
        g = grads.get(out_id) if out_id in source_ids else grads.pop(out_id, None)
        if g is None:
            continue
        fn = GRADIENTS.get(node.op)
        if fn is None:
            raise NotImplementedError(f"no gradient is defined for op {node.op!r}")
        needs = tuple(i is not None and i in relevant for i in node.input_ids)
        for iid, need, x, gx in zip(node.input_ids, needs, node.inputs, fn(node, g, needs)):
            if not need or gx is None:
                continue
            if gx._dtype != x._dtype:
                gx = ops.cast(gx, x._dtype)
            _accumulate(grads, iid, gx)  # type: ignore[arg-type]
    return [grads.get(id(s)) for s in sources]


def _accumulate(grads: dict[int, Tensor], key: int, g: Tensor) -> None:
    prev = grads.get(key)
    grads[key] = g if prev is None else ops.add(prev, g)
