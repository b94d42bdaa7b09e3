"""Conv2D, channels last (NHWC), over :mod:`mpcore.ops.image` (the pooling layers are in
:mod:`mpcore.layers.pooling`)."""

from __future__ import annotations

from typing import Any

from mpcore import ops
from mpcore.core.tensor import Tensor
from mpcore.layers import activations
from mpcore.layers.base import Layer
from mpcore.ops.image import pair


class Conv2D(Layer):
    """2-D convolution with a ``(kh, kw, in_channels, filters)`` kernel: im2col and one matmul,
    an *allow* op (16-bit under a mixed policy, float32 accumulation)."""

    def __init__(self, filters: int, kernel_size: Any, strides: Any = 1, padding: str = "valid",
                 activation: Any = None, use_bias: bool = True,
                 kernel_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(filters, bool) or not isinstance(filters, int) or filters < 1:
            raise ValueError(f"Conv2D {self.name!r}: filters must be a positive int, "
                             f"got {filters!r}")
        self.filters = filters
        self.kernel_size = pair(kernel_size, f"Conv2D {self.name!r}: kernel_size")
        self.strides = pair(strides, f"Conv2D {self.name!r}: strides")
        self.padding = str(padding).lower()
        if self.padding not in ("valid", "same"):
            raise ValueError(f"Conv2D {self.name!r}: padding must be 'valid' or 'same', "
                             f"got {padding!r}")
        self.activation = activations.get(activation)
        self.use_bias = bool(use_bias)
        self.kernel_initializer, self.bias_initializer = kernel_initializer, bias_initializer

    def build(self, input_shape: Any) -> None:
        if len(input_shape) != 4 or input_shape[-1] is None:
            raise ValueError(f"Conv2D {self.name!r} expects NHWC inputs of rank 4 with known "
                             f"channels, got shape {input_shape}")
        channels = input_shape[-1]
        self.kernel = self.add_weight("kernel", (*self.kernel_size, channels, self.filters),
                                      self.kernel_initializer)
        self.bias = (self.add_weight("bias", (self.filters,), self.bias_initializer)
                     if self.use_bias else None)
        self._expect_input(4, 4, {-1: channels})
        self.kernel.backend.layer_hint(self.name, {"channels": channels, "filters": self.filters},
                                       self.dtype_policy)

    def call(self, inputs: Tensor, training: bool | None = None) -> Tensor:
        dt = self.compute_dtype
        y = ops.conv2d(inputs, self.kernel.read_as(dt), self.strides, self.padding)
        if self.bias is not None:
            y = ops.bias_add(y, self.bias.read_as(dt))
        return self.activation(y)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "filters": self.filters,
                "kernel_size": self.kernel_size, "strides": self.strides,
                "padding": self.padding, "activation": activations.name_of(self.activation),
                "use_bias": self.use_bias}
