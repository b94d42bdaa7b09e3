"""Ops: device-agnostic functions on tensors (``mp.ops.matmul``, ``mp.ops.softmax`` ...).

One module per op family, each holding its ops and, next to them, their gradients:

- :mod:`~mpcore.ops.dispatch`: what every op does around its kernel, written once (backend,
  promotion, the mixed precision category rule, the recorded ``cast``, tape recording, the
  gradient registry);
- :mod:`~mpcore.ops.creation`: constants, filled and random tensors, one-hot rows;
- :mod:`~mpcore.ops.elementwise`, :mod:`~mpcore.ops.reduction`, :mod:`~mpcore.ops.shapes`,
  :mod:`~mpcore.ops.linalg` (matmul, dense), :mod:`~mpcore.ops.nn` (softmax, cross-entropy,
  relu's backward pass, dropout), :mod:`~mpcore.ops.image` (conv2d, max_pool2d);
- :mod:`~mpcore.ops.loss_scaling` (unscale and check, one device flag) and
  :mod:`~mpcore.ops.optim` (the optimizer updates);
- :mod:`~mpcore.ops.backprop`: the backward walk GradientTape runs.

Composite ops use a backend's fused kernel when it has one and are built from primitive ops
otherwise. Every name below is the public ``mp.ops`` API.
"""

from mpcore.ops.creation import (
    constant,
    convert_to_tensor,
    full,
    one_hot,
    ones,
    ones_like,
    random_normal,
    random_permutation,
    random_uniform,
    stop_gradient,
    zeros,
    zeros_like,
)
from mpcore.ops.dispatch import TensorLike, cast
from mpcore.ops.elementwise import (
    abs,  # noqa: A004 - the ops keep their names
    add,
    clip_by_value,
    cos,
    divide,
    equal,
    erf,
    exp,
    gelu,
    greater,
    greater_equal,
    isfinite,
    less,
    less_equal,
    log,
    logical_and,
    logical_not,
    logical_or,
    maximum,
    minimum,
    multiply,
    negative,
    not_equal,
    power,
    reciprocal,
    relu,
    rsqrt,
    sigmoid,
    sign,
    sin,
    sqrt,
    square,
    subtract,
    tanh,
    where,
)
from mpcore.ops.float8 import (
    dequantize_fp8,
    float8_dot,
    fp8_matmul,
    fp8_scale,
    quantize_fp8,
)
from mpcore.ops.image import avg_pool2d, conv2d, max_pool2d
from mpcore.ops.linalg import DENSE_ACTIVATIONS, dense, matmul
from mpcore.ops.loss_scaling import all_finite, loss_scale_update, unscale_and_check
from mpcore.ops.nn import (
    bias_add,
    bias_grad,
    dropout,
    dropout_mask,
    log_softmax,
    relu_grad,
    relu_grad_bias,
    softmax,
    sparse_softmax_cross_entropy,
)
from mpcore.ops.normalization import batch_norm, layer_norm
from mpcore.ops.optim import adam_rates, adam_update, rmsprop_update, sgd_update
from mpcore.ops.reduction import argmax, max, mean, min, sum  # noqa: A004
from mpcore.ops.shapes import (
    broadcast_to,
    concat,
    expand_dims,
    getitem,
    reshape,
    shape,
    squeeze,
    stack,
    take,
    transpose,
)

__all__ = [
    "DENSE_ACTIVATIONS", "TensorLike", "abs", "adam_rates", "adam_update", "add", "all_finite",
    "argmax",
    "avg_pool2d", "batch_norm", "bias_add", "bias_grad", "broadcast_to", "cast", "clip_by_value",
    "concat", "constant", "conv2d", "convert_to_tensor", "cos", "dense", "dequantize_fp8", "divide",
    "dropout", "dropout_mask", "equal", "erf", "exp", "expand_dims", "float8_dot", "fp8_matmul",
    "fp8_scale", "full", "gelu", "getitem", "greater", "greater_equal", "isfinite", "layer_norm",
    "less", "less_equal", "log", "log_softmax", "logical_and", "logical_not", "logical_or",
    "loss_scale_update", "matmul", "max", "max_pool2d", "maximum", "mean", "min", "minimum",
    "multiply", "negative",
    "not_equal", "one_hot", "ones", "ones_like", "power", "quantize_fp8", "random_normal",
    "random_permutation", "random_uniform", "reciprocal", "relu", "relu_grad", "relu_grad_bias",
    "reshape", "rmsprop_update", "rsqrt", "sgd_update", "shape", "sigmoid", "sign", "sin",
    "softmax",
    "sparse_softmax_cross_entropy", "sqrt", "square", "squeeze", "stack", "stop_gradient",
    "subtract", "sum", "take", "tanh", "transpose", "unscale_and_check", "where", "zeros",
    "zeros_like",
]
