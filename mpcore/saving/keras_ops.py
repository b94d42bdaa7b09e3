"""Operators on symbolic tensors (``x + y``, ``x * 0.5``, ``-x``, ``x[:, -1]``) in a
functional config, as Keras 3 writes them: an operation of ``keras.src.ops.numpy`` (``Add``,
``TrueDivide``, ``GetItem`` ...) whose node's arguments are the operands in order, a constant
among them where one operand is a Python number. mpcore makes a ``TensorOperator`` layer of
each; it holds no weights, and Keras' ``model.layers`` (so the weights file) leaves operations
out."""

from __future__ import annotations

from typing import Any

from mpcore.layers.base import KerasTensor, Layer
from mpcore.layers.operators import TensorOperator

MODULE = "keras.src.ops.numpy"
#: mpcore's operator -> Keras 3's operation class
KERAS_OPS = {"add": "Add", "subtract": "Subtract", "multiply": "Multiply",
             "divide": "TrueDivide", "matmul": "Matmul", "power": "Power",
             "negative": "Negative", "getitem": "GetItem"}
_BY_KERAS = {v: k for k, v in KERAS_OPS.items()} | {"Divide": "divide"}


def is_operator(layer: Layer) -> bool:
    return isinstance(layer, TensorOperator)


def is_keras_operation(entry: dict[str, Any]) -> bool:
    module = entry.get("module") or ""
    return module.startswith("keras.src.ops") or module == "keras.ops"


def entry(layer: TensorOperator) -> dict[str, Any]:
    """The config entry of an operator's layer (without name and inbound nodes)."""
    return {"module": MODULE, "class_name": KERAS_OPS[layer.op],
            "config": {"name": layer.name}, "registered_name": None}


def node_args(layer: TensorOperator, inputs: Any, tensor: Any, value: Any) -> list[Any]:
    """A call's operands in Keras' order: each KerasTensor through ``tensor``, a constant or
    a key through ``value`` (serialization)."""
    if isinstance(inputs, (list, tuple)):
        return [tensor(x) for x in inputs]
    if layer.op == "negative":
        return [tensor(inputs)]
    if layer.op == "getitem":
        key = layer.key
        return [tensor(inputs), value(list(key) if isinstance(key, tuple) else key)]
    operands = [tensor(inputs), value(layer.constant)]
    return operands[::-1] if layer.reverse else operands


def call(class_name: str, name: str, args: list[Any]) -> Any:
    """Apply Keras' operation ``class_name`` to resolved ``args`` as mpcore's operator."""
    op = _BY_KERAS.get(class_name)
    if op is None:
        raise TypeError(f"Keras operation {class_name!r} is not supported by mpcore; "
                        f"supported: {', '.join(sorted(_BY_KERAS))}")
    if op == "negative":
        return TensorOperator(op, name=name)(args[0])
    if op == "getitem":
        key = args[1]
        return TensorOperator(op, key=tuple(key) if isinstance(key, list) else key,
                              name=name)(args[0])
    first, second = args
    if isinstance(first, KerasTensor) and isinstance(second, KerasTensor):
        return TensorOperator(op, name=name)([first, second])
    if isinstance(first, KerasTensor):
        return TensorOperator(op, constant=second, name=name)(first)
    return TensorOperator(op, constant=first, reverse=True, name=name)(second)
