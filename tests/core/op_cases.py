"""What the op tests share: the dtypes, deterministic data, and the ops with their NumPy
references and mixed precision categories (test_ops.py checks the ops, test_ops_rules.py that
the category table covers them)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

import mpcore as mp

FLOATS = ["float32", "float16", "bfloat16"]


def data(shape: tuple[int, ...], low: float = -2.0, high: float = 2.0,
         away_from_zero: float = 0.0) -> np.ndarray:
    x = np.random.default_rng(abs(hash((shape, low, high))) % 2**32).uniform(low, high, shape)
    if away_from_zero:
        x = np.where(np.abs(x) < away_from_zero, np.copysign(away_from_zero, x), x)
    return x


def host(t: mp.Tensor) -> np.ndarray:
    return np.asarray(t).astype(np.float64)


def low_or(dtype: str, category: str) -> str:
    """The result dtype of a unary op of ``category`` on a ``dtype`` input."""
    return "float32" if category == "deny" and dtype in ("float16", "bfloat16") else dtype


_erf = np.vectorize(math.erf, otypes=[np.float64])

# op -> (reference on float64, input range, the op's category)
UNARY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], tuple[float, float], str]] = {
    "negative": (np.negative, (-3, 3), "infer"),
    "abs": (np.abs, (-3, 3), "infer"),
    "sign": (np.sign, (-3, 3), "clear"),
    "exp": (np.exp, (-3, 3), "deny"),
    "log": (np.log, (0.1, 5), "deny"),
    "sqrt": (np.sqrt, (0.1, 5), "infer"),
    "square": (np.square, (-3, 3), "infer"),
    "relu": (lambda x: np.maximum(x, 0), (-3, 3), "clear"),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), (-6, 6), "infer"),
    "tanh": (np.tanh, (-3, 3), "infer"),
    "erf": (_erf, (-3, 3), "deny"),
    "cos": (np.cos, (-7, 7), "deny"),
    "sin": (np.sin, (-7, 7), "deny"),
    "reciprocal": (lambda x: 1 / x, (0.2, 4), "infer"),
    "rsqrt": (lambda x: 1 / np.sqrt(x), (0.2, 4), "infer"),
}


BINARY: dict[str, tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], str]] = {
    "add": (np.add, "infer"), "subtract": (np.subtract, "infer"),
    "multiply": (np.multiply, "infer"), "divide": (np.divide, "infer"),
    "power": (np.power, "deny"), "maximum": (np.maximum, "clear"),
    "minimum": (np.minimum, "clear"),
}


COMPARISONS = {"equal": np.equal, "not_equal": np.not_equal, "less": np.less,
               "less_equal": np.less_equal, "greater": np.greater,
               "greater_equal": np.greater_equal}
