"""The mixed precision category of every op, in one table (after TF's auto mixed precision lists).

- ALLOW: worth running in 16 bits and numerically safe there with float32 accumulation
  (matmul, conv). Inputs are promoted to a common dtype; when that is 16-bit the backend
  computes in it and accumulates in float32.
- DENY: numerically unsafe in 16 bits (exp, log, pow, softmax, cross-entropy, sums and means).
  16-bit inputs are cast to float32 first, and the result is float32.
- INFER: arithmetic whose safety depends on its inputs (add, mul, tanh, ...): computed in the
  promoted dtype of its inputs.
- CLEAR: moves or selects values without arithmetic (reshape, transpose, relu, max): follows
  its inputs.

A backend may declare exceptions for its hardware in ``Backend.category_overrides``
(say, DENY for an op whose 16-bit kernel is inaccurate on that device).
"""

from __future__ import annotations

from enum import Enum


class Category(str, Enum):
    ALLOW = "allow"
    DENY = "deny"
    INFER = "infer"
    CLEAR = "clear"


ALLOW, DENY, INFER, CLEAR = Category.ALLOW, Category.DENY, Category.INFER, Category.CLEAR

CATEGORIES: dict[str, Category] = {
    # allow: 16-bit compute, float32 accumulation
    "matmul": ALLOW, "dense": ALLOW, "conv2d": ALLOW, "conv2d_backprop_input": ALLOW,
    "conv2d_backprop_filter": ALLOW,
    # deny: always float32
    "exp": DENY, "log": DENY, "power": DENY, "softmax": DENY, "log_softmax": DENY,
    "sparse_softmax_cross_entropy": DENY, "softmax_cross_entropy": DENY,
    "sum": DENY, "mean": DENY, "erf": DENY, "batch_norm": DENY, "layer_norm": DENY,
    # cos and sin: on no list of TF's (an op of no list stays float32 under its rewrite); a
    # 16-bit argument of a few periods has lost the digits a periodic function needs
    "cos": DENY, "sin": DENY,
    # infer: arithmetic that follows its inputs
    "add": INFER, "subtract": INFER, "multiply": INFER, "divide": INFER,
    "negative": INFER, "abs": INFER, "square": INFER, "sqrt": INFER, "rsqrt": INFER,
    "reciprocal": INFER, "sigmoid": INFER, "tanh": INFER, "gelu": INFER,
    "relu_grad": INFER, "relu_grad_bias": INFER, "bias_add": INFER, "where": INFER,
    "one_hot": INFER,
    # clear: data movement and selection
    "relu": CLEAR, "maximum": CLEAR, "minimum": CLEAR, "max": CLEAR, "min": CLEAR,
    "reshape": CLEAR, "transpose": CLEAR, "broadcast_to": CLEAR, "concat": CLEAR,
    "take": CLEAR, "take_grad": CLEAR, "getitem": CLEAR, "getitem_grad": CLEAR,
    "sign": CLEAR, "cast": CLEAR, "argmax": CLEAR, "max_pool2d": CLEAR,
    "max_pool2d_grad": CLEAR, "extract_patches": CLEAR, "extract_patches_grad": CLEAR,
    "equal": CLEAR, "not_equal": CLEAR, "less": CLEAR, "less_equal": CLEAR,
    "greater": CLEAR, "greater_equal": CLEAR, "logical_and": CLEAR, "logical_or": CLEAR,
    "logical_not": CLEAR, "isfinite": CLEAR,
}


def category(op: str, overrides: dict[str, Category] | None = None) -> Category:
    """The category of ``op``, with a backend's overrides applied. Unknown ops are CLEAR."""
    if overrides and op in overrides:
        return overrides[op]
    return CATEGORIES.get(op, CLEAR)
