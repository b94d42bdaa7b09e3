"""Elementwise kernels shared by the array-library backends: one library function each, with
the backend's operand rule and error state (see :class:`~mpcore_xp.XpBackend`)."""

from __future__ import annotations

from typing import Any


def binary(name: str, quiet: bool = False) -> Any:
    """The kernel ``xp.<name>(a, b)``; ``quiet`` ones (divide, power) never warn."""

    def kernel(self: Any, a: Any, b: Any) -> Any:
        a, b = self.operands(a, b)
        fn = getattr(self.xp, name)
        if quiet or getattr(a, "dtype", None) in self.quiet_dtypes:
            with self.errstate():
                return fn(a, b)
        return fn(a, b)

    kernel.__name__ = name
    return kernel


def unary(name: str, quiet: bool = False) -> Any:
    """The kernel ``xp.<name>(x)``; ``quiet`` ones (exp, log, sqrt) never warn."""

    def kernel(self: Any, x: Any) -> Any:
        fn = getattr(self.xp, name)
        if quiet or x.dtype in self.quiet_dtypes:
            with self.errstate():
                return fn(x)
        return fn(x)

    kernel.__name__ = name
    return kernel


class ElementwiseKernels:
    """Mixed into XpBackend."""

    xp: Any

    add = binary("add")
    subtract = binary("subtract")
    multiply = binary("multiply")
    divide = binary("divide", quiet=True)
    power = binary("power", quiet=True)
    maximum = binary("maximum")
    minimum = binary("minimum")
    equal = binary("equal")
    not_equal = binary("not_equal")
    less = binary("less")
    less_equal = binary("less_equal")
    greater = binary("greater")
    greater_equal = binary("greater_equal")
    logical_and = binary("logical_and")
    logical_or = binary("logical_or")
    logical_not = unary("logical_not")
    isfinite = unary("isfinite")
    negative = unary("negative")
    abs = unary("abs")
    sign = unary("sign")
    exp = unary("exp", quiet=True)
    log = unary("log", quiet=True)
    sqrt = unary("sqrt", quiet=True)
    square = unary("square")
    tanh = unary("tanh")
    # quiet: cos(inf) is NaN, as a kernel on a skipped step's gradients may meet (no warning)
    cos = unary("cos", quiet=True)
    sin = unary("sin", quiet=True)

    def sigmoid(self, x: Any) -> Any:
        # 0.5 * (1 + tanh(x / 2)): one transcendental, no overflow for large |x|
        xp = self.xp
        half = xp.asarray(0.5, dtype=x.dtype)
        out = xp.tanh(x * half)
        out += xp.asarray(1, dtype=x.dtype)
        out *= half
        return out

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        return self.xp.where(cond, a, b)
