"""BatchNormalization and LayerNormalization, with Keras 3's names, defaults and config keys.

Precision rule (Keras 3's, and the mixed precision guide's): the statistics and the
normalization are computed in float32 whatever the policy (16-bit inputs are cast up first,
float64 inputs stay float64, as Keras' ``result_type(x.dtype, "float32")``), and the output is
cast to the compute dtype. Variables are created in the variable dtype (float32 under the mixed
policies) and read in the statistics' dtype, never in 16 bits: a float16 moving variance
overflows above 65504 and a bfloat16 mean keeps 8 bits.

BatchNormalization in training over every axis but the last (channels last, the default) is
one op, ``ops.batch_norm``, fused where the backend has the kernels (the CPU does), with the
closed-form gradient; otherwise, and LayerNormalization, composites of recorded ops (mean,
subtract, square, rsqrt, multiply, add), which GradientTape differentiates and a traced step
replays.
"""

from __future__ import annotations

import warnings
from typing import Any

from mpcore import ops
from mpcore.core.tensor import Tensor, Variable
from mpcore.layers.base import Layer
from mpcore.layers.config import refuse_unsupported


def _stat_dtype(dtype: str) -> str:
    """The dtype statistics are computed in: at least float32 (Keras' result_type rule)."""
    return "float64" if dtype == "float64" else "float32"


def _normalized(centered: Tensor, variance: Tensor, epsilon: float, gamma: Tensor | None,
                beta: Tensor | None) -> Tensor:
    """``centered / sqrt(variance + epsilon) * gamma + beta``. The centred form (not Keras'
    ``x * inv - mean * inv``) keeps float32 accurate where the mean is large against the
    spread: the two products would cancel and lose the spread's low bits."""
    y = ops.multiply(centered, ops.rsqrt(ops.add(variance, epsilon)))
    if gamma is not None:
        y = ops.multiply(y, gamma)
    if beta is not None:
        y = ops.add(y, beta)
    return y


class BatchNormalization(Layer):
    """Normalize over every axis but ``axis`` with the batch's statistics in training, and
    with moving averages of them in inference (``training=False`` or None, or a layer whose
    ``trainable`` is False, as Keras 3 does).

    Training also updates the moving statistics, as Keras 3 does:
    ``moving = moving * momentum + batch_stat * (1 - momentum)``, where the batch variance
    is the biased one (the mean of squared deviations, no Bessel correction). The updates are
    ``Variable.assign`` of values computed by ops, so a traced step (``mp.function``,
    ``jit_compile=True``) replays them on the device, reading nothing back to the host.
    """

    def __init__(self, axis: int = -1, momentum: float = 0.99, epsilon: float = 1e-3,
                 center: bool = True, scale: bool = True, beta_initializer: Any = "zeros",
                 gamma_initializer: Any = "ones", moving_mean_initializer: Any = "zeros",
                 moving_variance_initializer: Any = "ones", beta_regularizer: Any = None,
                 gamma_regularizer: Any = None, beta_constraint: Any = None,
                 gamma_constraint: Any = None, synchronized: bool = False,
                 renorm: bool = False, renorm_clipping: Any = None,
                 renorm_momentum: float = 0.99, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        where = f"BatchNormalization {self.name!r}"
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise TypeError(f"{where}: axis must be one int (Keras 3 normalizes along one "
                            f"axis), got {axis!r}")
        refuse_unsupported(where, beta_regularizer=beta_regularizer,
                           gamma_regularizer=gamma_regularizer,
                           beta_constraint=beta_constraint, gamma_constraint=gamma_constraint,
                           synchronized=synchronized, renorm=renorm)
        self.axis = axis
        self.momentum = float(momentum)
        self.epsilon = float(epsilon)
        self.center, self.scale = bool(center), bool(scale)
        self.beta_initializer, self.gamma_initializer = beta_initializer, gamma_initializer
        self.moving_mean_initializer = moving_mean_initializer
        self.moving_variance_initializer = moving_variance_initializer
        # kept for the config only: they take effect only with renorm=True (refused above)
        self.renorm_clipping, self.renorm_momentum = renorm_clipping, float(renorm_momentum)
        self.gamma: Variable | None = None
        self.beta: Variable | None = None

    def build(self, input_shape: Any) -> None:
        shape = tuple(input_shape)
        rank = len(shape)
        where = f"BatchNormalization {self.name!r}"
        if not -rank <= self.axis < rank:   # checked before any weight exists
            raise ValueError(f"{where}: axis {self.axis} is out of range for inputs of rank "
                             f"{rank} (shape {shape}); valid axes are {-rank}..{rank - 1}")
        axis = self.axis % rank
        channels = shape[axis]
        if channels is None:
            raise ValueError(f"{where}: axis {self.axis} of the input must be known, got input "
                             f"shape {shape}")
        param = (channels,)
        # Keras 3's weights, in its order: gamma, beta (trainable), moving_mean,
        # moving_variance (not trainable: only the forward pass updates them)
        if self.scale:
            self.gamma = self.add_weight("gamma", param, self.gamma_initializer)
        if self.center:
            self.beta = self.add_weight("beta", param, self.beta_initializer)
        # autocast=False (Keras'): an op reading them inside a mixed call gets float32
        self.moving_mean = self.add_weight(param, self.moving_mean_initializer, trainable=False,
                                           autocast=False, name="moving_mean")
        self.moving_variance = self.add_weight(param, self.moving_variance_initializer,
                                               trainable=False, autocast=False,
                                               name="moving_variance")
        self._reduction_axes = tuple(a for a in range(rank) if a != axis)
        # the parameters broadcast against the input as (1, ..., C, ..., 1); along the last
        # axis they broadcast as they are
        self._param_shape = param if axis == rank - 1 else tuple(
            channels if a == axis else 1 for a in range(rank))
        self._expect_input(rank, rank, {axis: channels})

    def _broadcastable(self, v: Tensor) -> Tensor:
        return v if v.shape == self._param_shape else ops.reshape(v, self._param_shape)

    def _read(self, v: Variable | None, dtype: str) -> Tensor | None:
        return None if v is None else self._broadcastable(v.read_as(dtype))

    def call(self, inputs: Tensor, training: bool | None = None) -> Tensor:
        dt = _stat_dtype(inputs.dtype)
        if (training and self.trainable
                and self._reduction_axes == tuple(range(inputs.ndim - 1))):
            # channels last: one op, fused where the backend has the kernels, which take a
            # 16-bit input as it is (float32 inside, the output rounded once)
            y, mean, variance = ops.batch_norm(inputs, None if self.gamma is None else
                                               self.gamma.read_as(dt), None if self.beta is None
                                               else self.beta.read_as(dt), self.epsilon)
            self._update_moving(mean, variance, dt)
            return ops.cast(y, self.compute_dtype)
        x = ops.cast(inputs, dt)
        gamma, beta = self._read(self.gamma, dt), self._read(self.beta, dt)
        if training and self.trainable:
            mean = ops.mean(x, self._reduction_axes, keepdims=True)
            centered = ops.subtract(x, mean)
            variance = ops.mean(ops.square(centered), self._reduction_axes, keepdims=True)
            self._update_moving(mean, variance, dt)
        else:
            centered = ops.subtract(x, self._broadcastable(self.moving_mean.read_as(dt)))
            variance = self._broadcastable(self.moving_variance.read_as(dt))
        y = _normalized(centered, variance, self.epsilon, gamma, beta)
        return ops.cast(y, self.compute_dtype)

    def _update_moving(self, mean: Tensor, variance: Tensor, dt: str) -> None:
        # Keras 3's formula, in its order of operations. The batch statistics are cut from
        # the tape: the moving averages are state, not part of the loss's graph.
        channels = self.moving_mean.shape
        momentum, rest = self.momentum, 1.0 - self.momentum
        for var, stat in ((self.moving_mean, mean), (self.moving_variance, variance)):
            batch = ops.reshape(ops.stop_gradient(stat), channels)
            var.assign(ops.add(ops.multiply(var.read_as(dt), momentum),
                               ops.multiply(batch, rest)))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "axis": self.axis, "momentum": self.momentum,
                "epsilon": self.epsilon, "center": self.center, "scale": self.scale,
                "beta_initializer": self.beta_initializer,
                "gamma_initializer": self.gamma_initializer,
                "moving_mean_initializer": self.moving_mean_initializer,
                "moving_variance_initializer": self.moving_variance_initializer,
                "beta_regularizer": None, "gamma_regularizer": None, "beta_constraint": None,
                "gamma_constraint": None, "synchronized": False, "renorm": False,
                "renorm_clipping": self.renorm_clipping,
                "renorm_momentum": self.renorm_momentum}


_RMS_DEPRECATED = (
    "You passed `rms_scaling=True`, which is deprecated. This argument incorrectly scales the "
    "input by the variance, not the root mean square (Keras 3's warning; mpcore computes what "
    "Keras does).")


class LayerNormalization(Layer):
    """Normalize each example over ``axis`` (the last by default; an int or a list of ints)
    with learned ``gamma``/``beta`` spanning those axes, as Keras 3's LayerNormalization.

    ``rms_scaling=True`` (a keyword Keras 3 deprecates, with its warning) scales by
    ``gamma / sqrt(variance + epsilon)`` without centring, as Keras computes it."""

    def __init__(self, axis: int | list[int] | tuple[int, ...] = -1, epsilon: float = 1e-3,
                 center: bool = True, scale: bool = True, beta_initializer: Any = "zeros",
                 gamma_initializer: Any = "ones", beta_regularizer: Any = None,
                 gamma_regularizer: Any = None, beta_constraint: Any = None,
                 gamma_constraint: Any = None, **kwargs: Any) -> None:
        rms_scaling = bool(kwargs.pop("rms_scaling", False))
        if rms_scaling:
            warnings.warn(_RMS_DEPRECATED, stacklevel=2)
        super().__init__(**kwargs)
        where = f"LayerNormalization {self.name!r}"
        if isinstance(axis, (list, tuple)) and all(
                isinstance(a, int) and not isinstance(a, bool) for a in axis) and axis:
            self.axis: int | list[int] = list(axis)
        elif isinstance(axis, int) and not isinstance(axis, bool):
            self.axis = axis
        else:
            raise TypeError(f"{where}: expected an int or a list/tuple of ints for the argument "
                            f"'axis', but received: {axis!r}")
        refuse_unsupported(where, beta_regularizer=beta_regularizer,
                           gamma_regularizer=gamma_regularizer,
                           beta_constraint=beta_constraint, gamma_constraint=gamma_constraint)
        self.epsilon = float(epsilon)
        self.center, self.scale, self.rms_scaling = bool(center), bool(scale), rms_scaling
        self.beta_initializer, self.gamma_initializer = beta_initializer, gamma_initializer
        self.gamma: Variable | None = None
        self.beta: Variable | None = None

    def build(self, input_shape: Any) -> None:
        shape = tuple(input_shape)
        rank = len(shape)
        where = f"LayerNormalization {self.name!r}"
        axes = [self.axis] if isinstance(self.axis, int) else list(self.axis)
        for a in axes:                      # checked before any weight exists
            if not -rank <= a < rank:
                raise ValueError(f"{where}: axis {a} is out of bounds for input shape {shape} "
                                 f"(valid axes are {-rank}..{rank - 1})")
        canonical = [a % rank for a in axes]
        if len(set(canonical)) != len(canonical):
            raise ValueError(f"{where}: duplicate axes are not allowed, got axis={self.axis!r} "
                             f"for inputs of rank {rank}")
        self._axes = tuple(sorted(canonical))
        if any(shape[a] is None for a in self._axes):
            raise ValueError(f"{where}: the normalized axes {self._axes} of input shape {shape} "
                             "must be known")
        self.axis = list(self._axes)        # Keras 3 keeps the canonical, sorted axes
        core = tuple(shape[a] for a in self._axes)
        # weights hold only the normalized axes; other layouts are reshaped to broadcast
        self._param_shape = core if self._axes == (rank - 1,) else tuple(
            shape[a] if a in self._axes else 1 for a in range(rank))
        if self.scale or self.rms_scaling:
            self.gamma = self.add_weight("gamma", core, self.gamma_initializer)
        if self.center and not self.rms_scaling:
            self.beta = self.add_weight("beta", core, self.beta_initializer)
        self._expect_input(rank, rank, {a: shape[a] for a in self._axes})
        self.built = True

    def _read(self, v: Variable | None, dtype: str) -> Tensor | None:
        if v is None:
            return None
        w = v.read_as(dtype)
        return w if w.shape == self._param_shape else ops.reshape(w, self._param_shape)

    def call(self, inputs: Tensor, training: bool | None = None) -> Tensor:
        dt = _stat_dtype(inputs.dtype)
        if self._axes == (inputs.ndim - 1,) and not self.rms_scaling:
            # the last axis (a transformer's): one op, fused where the backend has the
            # kernels (a 16-bit input as it is, as batch_norm's)
            y = ops.layer_norm(inputs, self._read(self.gamma, dt), self._read(self.beta, dt),
                               self.epsilon)
            return ops.cast(y, self.compute_dtype)
        x = ops.cast(inputs, dt)
        centered = ops.subtract(x, ops.mean(x, self._axes, keepdims=True))
        variance = ops.mean(ops.square(centered), self._axes, keepdims=True)
        if self.rms_scaling:     # Keras' deprecated form: x (not centred) scaled by 1/std
            y = _normalized(x, variance, self.epsilon, self._read(self.gamma, dt), None)
        else:
            y = _normalized(centered, variance, self.epsilon, self._read(self.gamma, dt),
                            self._read(self.beta, dt))
        return ops.cast(y, self.compute_dtype)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "axis": self.axis, "epsilon": self.epsilon,
                "center": self.center, "scale": self.scale, "rms_scaling": self.rms_scaling,
                "beta_initializer": self.beta_initializer,
                "gamma_initializer": self.gamma_initializer,
                "beta_regularizer": None, "gamma_regularizer": None, "beta_constraint": None,
                "gamma_constraint": None}
