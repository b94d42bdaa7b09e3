"""Sequential: a plain stack of layers, built as a functional graph as soon as its input shape
is known (from an ``mp.Input``/``InputLayer`` first, a first layer's ``input_shape=``, or the
first batch it is called on)."""

from __future__ import annotations

from typing import Any

from mpcore.core import dtypes as _dtypes
from mpcore.layers.base import Input, InputLayer, KerasTensor, Layer, unique_name
from mpcore.models.model import Model


class Sequential(Model):
    def __init__(self, layers: list[Any] | None = None, name: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(name=name or unique_name("sequential"), **kwargs)
        self._stack: list[Layer] = []
        self._input_tensor: KerasTensor | None = None
        self._last: KerasTensor | None = None
        for layer in layers or []:
            self.add(layer)

    @property
    def layers(self) -> list[Layer]:
        return list(self._stack)

    def add(self, layer: Any) -> None:
        """Append a layer (an ``mp.Input(...)`` or InputLayer first fixes the input)."""
        if isinstance(layer, KerasTensor) and isinstance(getattr(layer._node, "layer", None),
                                                         InputLayer):
            layer = layer._node.layer  # type: ignore[union-attr]
        if isinstance(layer, InputLayer):
            if self._stack or self._input_tensor is not None:
                raise ValueError(f"Sequential {self.name!r}: an input can only come first")
            self._input_tensor = self._last = layer.tensor
            return
        if not isinstance(layer, Layer):
            raise TypeError(f"Sequential {self.name!r} takes layers, got {type(layer).__name__}")
        if self._input_tensor is None and not self._stack and layer._input_shape_arg is not None:
            self._input_tensor = self._last = Input(layer._input_shape_arg)
        self._stack.append(layer)
        if self._last is not None:
            self._last = layer(self._last)
            self._init_graph(self._input_tensor, self._last)
            self._graph_layers_only_stack()

    def _graph_layers_only_stack(self) -> None:
        # Weights are collected from the stack (the InputLayer has none).
        self._layers = list(self._stack)

    def pop(self) -> Layer:
        if not self._stack:
            raise IndexError(f"Sequential {self.name!r} has no layers to pop")
        layer = self._stack.pop()
        self._last = self._input_tensor
        if self._input_tensor is not None:
            for lyr in self._stack:
                self._last = lyr(self._last)
            self._init_graph(self._input_tensor, self._last)
            self._graph_layers_only_stack()
        return layer

    def build(self, input_shape: Any) -> None:
        if self._is_graph or not self._stack:
            if not self._stack:
                raise ValueError(f"Sequential {self.name!r} has no layers")
            return
        self._input_tensor = self._last = Input(tuple(input_shape[1:]),
                                                dtype=self._build_dtype)
        for layer in self._stack:
            self._last = layer(self._last)
        self._init_graph(self._input_tensor, self._last)
        self._graph_layers_only_stack()

    _build_dtype = "float32"

    def __call__(self, inputs: Any, *args: Any, training: bool | None = None,
                 **kwargs: Any) -> Any:
        if not self._is_graph and not isinstance(inputs, KerasTensor):
            first = inputs if hasattr(inputs, "dtype") else None
            dtype = getattr(first, "dtype", "float32")
            name = dtype if isinstance(dtype, str) else getattr(dtype, "name", "float32")
            self._build_dtype = name if name in _dtypes.FLOATING_SET else "float32"
        return super().__call__(inputs, *args, training=training, **kwargs)
