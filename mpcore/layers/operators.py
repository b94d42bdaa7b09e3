"""Operators on symbolic tensors: ``x + y``, ``x * 0.5``, ``-x``, ``a @ b``, ``x[:, -1]`` on
KerasTensors make a node of the functional graph, so a residual block reads as in Keras 3
(``outputs = x + block(x)``).

Each node is a :class:`TensorOperator` layer that applies one ``mp.ops`` function. Unlike a
layer it does not cast its inputs to a policy's compute dtype: the op promotes them as it does
eagerly (Keras 3's operators are ops, not layers), and a Python number stays a weak scalar, so
``bfloat16 * 0.5`` stays bfloat16.
"""

from __future__ import annotations

from typing import Any

from mpcore import ops
from mpcore.core.tensor import Tensor
from mpcore.layers.base import KerasTensor, Layer, unique_name

#: The binary operators, by op name.
BINARY = {"add": ops.add, "subtract": ops.subtract, "multiply": ops.multiply,
          "divide": ops.divide, "matmul": ops.matmul, "power": ops.power}


class TensorOperator(Layer):
    """One op on KerasTensors (and a constant operand, kept as given)."""

    _autocast = False

    def __init__(self, op: str, constant: Any = None, reverse: bool = False,
                 key: Any = None, **kwargs: Any) -> None:
        if op not in (*BINARY, "negative", "getitem"):
            raise ValueError(f"unknown tensor operator {op!r}; valid: "
                             f"{', '.join((*BINARY, 'negative', 'getitem'))}")
        if kwargs.get("name") is None:   # named after the op, as Keras 3 names its op nodes
            kwargs["name"] = unique_name(op)
        super().__init__(**kwargs)
        self.op, self.constant, self.reverse, self.key = op, constant, reverse, key

    def call(self, inputs: Any) -> Tensor:
        if self.op == "negative":
            return ops.negative(inputs)
        if self.op == "getitem":
            return ops.getitem(inputs, self.key)
        fn = BINARY[self.op]
        if isinstance(inputs, (list, tuple)):
            return fn(inputs[0], inputs[1])
        return fn(self.constant, inputs) if self.reverse else fn(inputs, self.constant)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "op": self.op}


def apply(op: str, x: KerasTensor, other: Any = None, reverse: bool = False,
          key: Any = None) -> Any:
    """``op(x, other)`` (``op(other, x)`` when ``reverse``; ``x[key]`` for getitem; ``-x``
    for negative) as a graph node."""
    if op in ("negative", "getitem"):
        return TensorOperator(op, key=key)(x)
    if isinstance(other, KerasTensor):
        pair = [other, x] if reverse else [x, other]
        return TensorOperator(op)(pair)
    if isinstance(other, Tensor):
        raise TypeError(f"cannot {op} a KerasTensor and a concrete Tensor: make the tensor a "
                        "layer's weight, or a Python number or NumPy array (a constant)")
    return TensorOperator(op, constant=other, reverse=reverse)(x)


KerasTensor.operator = apply
