"""Weight initializers (Keras' names and formulas), drawn from ``mp.random``'s seeds so that
``mp.random.set_seed`` makes a model's initial weights repeatable on any backend.

An initializer is called as ``init(shape, dtype) -> Tensor``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from mpcore import ops
from mpcore.core.naming import by_name
from mpcore.core.tensor import Tensor

Initializer = Callable[[tuple[int, ...], str], Tensor]


def _fans(shape: tuple[int, ...]) -> tuple[float, float]:
    """(fan_in, fan_out) as Keras computes them (a conv kernel's receptive field counts)."""
    if len(shape) < 1:
        return 1.0, 1.0
    if len(shape) == 1:
        return float(shape[0]), float(shape[0])
    if len(shape) == 2:
        return float(shape[0]), float(shape[1])
    receptive = math.prod(shape[:-2])
    return float(shape[-2] * receptive), float(shape[-1] * receptive)


class Constant:
    def __init__(self, value: float = 0.0) -> None:
        self.value = float(value)

    def __call__(self, shape: tuple[int, ...], dtype: str = "float32") -> Tensor:
        return ops.full(shape, self.value, dtype)


class Zeros(Constant):
    def __init__(self) -> None:
        super().__init__(0.0)


class Ones(Constant):
    def __init__(self) -> None:
        super().__init__(1.0)


class RandomUniform:
    def __init__(self, minval: float = -0.05, maxval: float = 0.05, seed: int | None = None):
        self.minval, self.maxval, self.seed = minval, maxval, seed

    def __call__(self, shape: tuple[int, ...], dtype: str = "float32") -> Tensor:
        return ops.random_uniform(shape, self.minval, self.maxval, dtype, seed=self.seed)


class RandomNormal:
    def __init__(self, mean: float = 0.0, stddev: float = 0.05, seed: int | None = None):
        self.mean, self.stddev, self.seed = mean, stddev, seed

    def __call__(self, shape: tuple[int, ...], dtype: str = "float32") -> Tensor:
        return ops.random_normal(shape, self.mean, self.stddev, dtype, seed=self.seed)


class VarianceScaling:
    """Keras' VarianceScaling; "normal" draws from an untruncated normal (mpcore has no
    truncated-normal kernel), with the same variance."""

    def __init__(self, scale: float = 1.0, mode: str = "fan_in", distribution: str = "normal",
                 seed: int | None = None) -> None:
        if mode not in ("fan_in", "fan_out", "fan_avg"):
            raise ValueError(f"mode must be fan_in, fan_out or fan_avg, got {mode!r}")
        if distribution not in ("normal", "uniform"):
            raise ValueError(f"distribution must be normal or uniform, got {distribution!r}")
        self.scale, self.mode, self.distribution, self.seed = scale, mode, distribution, seed

    def __call__(self, shape: tuple[int, ...], dtype: str = "float32") -> Tensor:
        fan_in, fan_out = _fans(shape)
        fan = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[self.mode]
        variance = self.scale / max(1.0, fan)
        if self.distribution == "uniform":
            limit = math.sqrt(3.0 * variance)
            return ops.random_uniform(shape, -limit, limit, dtype, seed=self.seed)
        return ops.random_normal(shape, 0.0, math.sqrt(variance), dtype, seed=self.seed)


def GlorotUniform(seed: int | None = None) -> VarianceScaling:  # noqa: N802 - Keras' name
    return VarianceScaling(1.0, "fan_avg", "uniform", seed)


def GlorotNormal(seed: int | None = None) -> VarianceScaling:  # noqa: N802
    return VarianceScaling(1.0, "fan_avg", "normal", seed)


def HeUniform(seed: int | None = None) -> VarianceScaling:  # noqa: N802
    return VarianceScaling(2.0, "fan_in", "uniform", seed)


def HeNormal(seed: int | None = None) -> VarianceScaling:  # noqa: N802
    return VarianceScaling(2.0, "fan_in", "normal", seed)


_BY_NAME: dict[str, Callable[[], Any]] = {
    "zeros": Zeros, "ones": Ones, "glorot_uniform": GlorotUniform,
    "glorot_normal": GlorotNormal, "he_uniform": HeUniform, "he_normal": HeNormal,
    "random_uniform": RandomUniform, "random_normal": RandomNormal,
    # Keras' short aliases (Embedding's default is "uniform": RandomUniform(-0.05, 0.05))
    "uniform": RandomUniform, "normal": RandomNormal,
}


def get(identifier: Any) -> Initializer:
    """An initializer from a name (``"glorot_uniform"``, ``"zeros"`` ...) or a callable."""
    if isinstance(identifier, str):
        return by_name("initializer", _BY_NAME, identifier)()  # type: ignore[no-any-return]
    if callable(identifier):
        return identifier  # type: ignore[no-any-return]
    raise TypeError(f"an initializer is a name or a callable(shape, dtype), got {identifier!r}")
