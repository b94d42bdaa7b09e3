"""Dense, Activation, Dropout and Flatten. (LayerNormalization lives in
:mod:`mpcore.layers.normalization`; it is importable from here too, its first home.)"""

from __future__ import annotations

from typing import Any

from mpcore import ops
from mpcore.core.tensor import Tensor
from mpcore.layers import activations
from mpcore.layers.base import Layer
from mpcore.layers.normalization import LayerNormalization  # noqa: F401 - its first home


class Dense(Layer):
    """``activation(inputs @ kernel + bias)`` over the last axis of the inputs: one matmul (an
    *allow* op, so 16-bit under a mixed policy), a fused bias add where the backend has one,
    and the activation in the compute dtype."""

    def __init__(self, units: int, activation: Any = None, use_bias: bool = True,
                 kernel_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise ValueError(f"Dense {self.name!r}: units must be a positive int, got {units!r}")
        self.units = units
        self.activation = activations.get(activation)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = kernel_initializer
        self.bias_initializer = bias_initializer
        self._float8: Any = None   # mixed_float8: the FP8 GEMMs' state, made in build

    def build(self, input_shape: Any) -> None:
        if len(input_shape) < 2:  # checked before any weight exists, so the layer stays usable
            raise ValueError(f"layer {self.name!r} (Dense) expects inputs of rank >= 2, got "
                             f"shape {tuple(input_shape)}")
        in_dim = input_shape[-1]
        if in_dim is None:
            raise ValueError(f"Dense {self.name!r} needs a known last axis, got input shape "
                             f"{input_shape}")
        self.kernel = self.add_weight("kernel", (in_dim, self.units), self.kernel_initializer)
        self.bias = (self.add_weight("bias", (self.units,), self.bias_initializer)
                     if self.use_bias else None)
        self._expect_input(2, axes={-1: in_dim})
        if self.dtype_policy.name == "mixed_float8":   # FP8 GEMMs, and their scaling state
            from mpcore.mixed_precision.float8 import Float8Dense

            self._float8 = Float8Dense(self, self.dtype_policy.float8_recipe)
        # Hardware advice from the backend (CUDA: the guide's multiple-of-8 tensor-core tip).
        self.kernel.backend.layer_hint(self.name, {"input units": in_dim, "units": self.units},
                                       self.dtype_policy)

    def call(self, inputs: Tensor, training: bool | None = None) -> Tensor:
        dt = self.compute_dtype
        bias = self.bias.read_as(dt) if self.bias is not None else None
        if self._float8 is not None and self.dtype_policy.name == "mixed_float8":
            # quantise -> FP8 GEMM -> float32, then the bias and activation in bfloat16 (a
            # tool that pins the layer's policy to float32, the inspector, skips this)
            y = ops.cast(self._float8.dot(inputs, self.kernel, training), dt)
            return self.activation(y if bias is None else ops.bias_add(y, bias))
        # one fused op (matmul, bias and relu in one kernel where the backend has it)
        if self.activation is activations.relu:
            return ops.dense(inputs, self.kernel.read_as(dt), bias, "relu")
        return self.activation(ops.dense(inputs, self.kernel.read_as(dt), bias))

    def quantize(self, mode: str, float8_recipe: Any = None) -> None:
        """Keras 3's ``layer.quantize("float8")``: from now on this built mixed_bfloat16
        layer's GEMM runs in FP8 (its policy becomes mixed_float8 with ``float8_recipe``, and
        it gains the scaling variables)."""
        if mode != "float8":
            raise ValueError(f"Dense {self.name!r}: quantize mode must be 'float8' (the only "
                             f"one mpcore has), got {mode!r}")
        if not self.built:
            raise ValueError(f"Dense {self.name!r} must be built before quantize('float8')")
        if self._float8 is not None:
            raise ValueError(f"Dense {self.name!r} already computes in float8")
        if self.dtype_policy.name != "mixed_bfloat16":
            raise ValueError(f"Dense {self.name!r}: quantize('float8') turns a mixed_bfloat16 "
                             f"layer into mixed_float8; this one is {self.dtype_policy.name!r} "
                             "(Keras' float8_from_float32 is not supported: use "
                             "mixed_bfloat16 layers)")
        from mpcore.mixed_precision.float8 import Float8Dense
        from mpcore.mixed_precision.policy import Policy

        self._dtype_policy = Policy("mixed_float8", float8_recipe=float8_recipe)
        self._float8 = Float8Dense(self, self._dtype_policy.float8_recipe)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "units": self.units,
                "activation": activations.name_of(self.activation), "use_bias": self.use_bias}


class Activation(Layer):
    """An activation as a layer. ``Activation("softmax", dtype="float32")`` casts its (16-bit)
    input to float32 and outputs float32: the guide's way of keeping the model's outputs in
    float32 under a mixed policy."""

    def __init__(self, activation: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.activation = activations.get(activation)

    def call(self, inputs: Tensor, training: bool | None = None) -> Tensor:
        return self.activation(inputs)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "activation": activations.name_of(self.activation)}


class Dropout(Layer):
    """Inverted dropout: in training, zero each value with probability ``rate`` and scale the
    rest by ``1/(1-rate)``; the identity otherwise. Masks draw seeds from ``mp.random`` (or
    ``seed``), so a restored random state repeats them exactly."""

    def __init__(self, rate: float, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not 0.0 <= float(rate) < 1.0:
            raise ValueError(f"Dropout {self.name!r}: rate must be in [0, 1), got {rate!r}")
        self.rate = float(rate)
        self.seed = seed

    def call(self, inputs: Tensor, training: bool | None = None) -> Tensor:
        if not training or self.rate == 0.0:
            return inputs
        return ops.dropout(inputs, self.rate, self.seed)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}


class Flatten(Layer):
    """(N, d1, d2, ...) -> (N, d1*d2*...)."""

    def build(self, input_shape: Any) -> None:
        self._expect_input(1)

    def call(self, inputs: Tensor, training: bool | None = None) -> Tensor:
        if inputs.ndim == 1:
            return ops.reshape(inputs, (inputs.shape[0], 1))
        return ops.reshape(inputs, (inputs.shape[0], -1))
