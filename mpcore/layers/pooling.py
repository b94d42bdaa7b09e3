"""Pooling layers, Keras 3's: ``MaxPooling2D``, ``AveragePooling2D`` and the global poolings
``GlobalAveragePooling1D/2D``, ``GlobalMaxPooling1D/2D``.

``data_format`` is ``"channels_last"`` (the default, NHWC / NWC) or ``"channels_first"``; the
2-D windowed poolings run channels last (a channels-first input is transposed around them).
Means are summed in float32 and returned in the compute dtype, as TF's AvgPool and PyTorch's
avg_pool2d give them under mixed precision.
"""

from __future__ import annotations

from typing import Any

from mpcore import ops
from mpcore.core.tensor import Tensor
from mpcore.layers.base import Layer
from mpcore.ops.image import pair

_FORMATS = ("channels_last", "channels_first")


def data_format_of(value: Any, where: str) -> str:
    fmt = "channels_last" if value is None else str(value).lower()
    if fmt not in _FORMATS:
        raise ValueError(f"{where}: data_format must be one of {', '.join(_FORMATS)}, got "
                         f"{value!r}")
    return fmt


class _Pooling2D(Layer):
    _op = staticmethod(ops.max_pool2d)

    def __init__(self, pool_size: Any = (2, 2), strides: Any = None, padding: str = "valid",
                 data_format: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        where = f"{type(self).__name__} {self.name!r}"
        self.pool_size = pair(pool_size, f"{where}: pool_size")
        self.strides = (self.pool_size if strides is None
                        else pair(strides, f"{where}: strides"))
        self.padding = str(padding).lower()
        if self.padding not in ("valid", "same"):
            raise ValueError(f"{where}: padding must be 'valid' or 'same', got {padding!r}")
        self.data_format = data_format_of(data_format, where)

    def build(self, input_shape: Any) -> None:
        self._expect_input(4, 4)

    def call(self, inputs: Tensor) -> Tensor:
        if self.data_format == "channels_first":
            nhwc = ops.transpose(inputs, (0, 2, 3, 1))
            y = self._op(nhwc, self.pool_size, self.strides, self.padding)
            return ops.transpose(y, (0, 3, 1, 2))
        return self._op(inputs, self.pool_size, self.strides, self.padding)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "pool_size": self.pool_size, "strides": self.strides,
                "padding": self.padding, "data_format": self.data_format}


class MaxPooling2D(_Pooling2D):
    """Max over ``pool_size`` windows (``strides`` default to ``pool_size``)."""

    _op = staticmethod(ops.max_pool2d)


class AveragePooling2D(_Pooling2D):
    """Mean over ``pool_size`` windows (``strides`` default to ``pool_size``); with
    ``"same"`` padding the padded positions are not counted (TF's rule)."""

    _op = staticmethod(ops.avg_pool2d)


class _GlobalPooling(Layer):
    _rank = 3

    def __init__(self, data_format: str | None = None, keepdims: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data_format = data_format_of(data_format, f"{type(self).__name__} {self.name!r}")
        self.keepdims = bool(keepdims)

    def build(self, input_shape: Any) -> None:
        self._expect_input(self._rank, self._rank)

    def _axes(self) -> tuple[int, ...]:
        spatial = self._rank - 2
        first = 2 if self.data_format == "channels_first" else 1
        return tuple(range(first, first + spatial))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "data_format": self.data_format,
                "keepdims": self.keepdims}


class _GlobalAverage(_GlobalPooling):
    def call(self, inputs: Tensor) -> Tensor:
        # mean is a deny op (float32); the layer's output is in its input's dtype, as Keras'
        return ops.cast(ops.mean(inputs, self._axes(), keepdims=self.keepdims), inputs.dtype)


class _GlobalMax(_GlobalPooling):
    def call(self, inputs: Tensor) -> Tensor:
        return ops.max(inputs, self._axes(), keepdims=self.keepdims)


class GlobalAveragePooling1D(_GlobalAverage):
    """The mean over the steps axis of (batch, steps, features) inputs."""

    _rank = 3


class GlobalAveragePooling2D(_GlobalAverage):
    """The mean over the spatial axes of (batch, rows, cols, channels) inputs."""

    _rank = 4


class GlobalMaxPooling1D(_GlobalMax):
    """The max over the steps axis of (batch, steps, features) inputs."""

    _rank = 3


class GlobalMaxPooling2D(_GlobalMax):
    """The max over the spatial axes of (batch, rows, cols, channels) inputs."""

    _rank = 4
