"""The symbolic graph of the functional API: :class:`KerasTensor` (a shape with the batch
axis None, and a dtype), the :class:`Node` a layer call makes, and the structure helpers both
graph and layers use (``flatten``, ``map_structure``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from mpcore.core import dtypes as _dtypes

if TYPE_CHECKING:
    from mpcore.layers.base import Layer

Shape = tuple[int | None, ...]


# --- the symbolic graph -------------------------------------------------------------------
class KerasTensor:
    """A placeholder of the functional API: a shape (batch axis None) and a dtype."""

    #: The functional graph is made where a model is defined; a step, on tensors, never changes
    #: it: not looked into for a traced step's Python state (mpcore.tracing.python_state).
    _trace_opaque = True

    def __init__(self, shape: Shape, dtype: str, name: str | None = None,
                 node: Node | None = None) -> None:
        self.shape: Shape = tuple(shape)
        self.dtype = _dtypes.named(dtype)
        self.name = name
        self._node = node

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        name = f", name={self.name}" if self.name else ""
        return f"<KerasTensor shape={self.shape}, dtype={self.dtype}{name}>"

    # Operators make graph nodes. The layer that applies an op is defined above this module
    # (mpcore.layers.operators, which needs Layer), so it installs itself here when imported:
    # the package order stays acyclic. NumPy defers to these operators.
    __array_ufunc__ = None
    operator: ClassVar[Callable[..., Any] | None] = None

    def _op(self, op: str, other: Any = None, reverse: bool = False, key: Any = None) -> Any:
        if KerasTensor.operator is None:
            raise RuntimeError("operators on KerasTensors need mpcore.layers imported")
        return KerasTensor.operator(op, self, other, reverse, key)

    def __add__(self, other: Any) -> Any:
        return self._op("add", other)

    def __radd__(self, other: Any) -> Any:
        return self._op("add", other, True)

    def __sub__(self, other: Any) -> Any:
        return self._op("subtract", other)

    def __rsub__(self, other: Any) -> Any:
        return self._op("subtract", other, True)

    def __mul__(self, other: Any) -> Any:
        return self._op("multiply", other)

    def __rmul__(self, other: Any) -> Any:
        return self._op("multiply", other, True)

    def __truediv__(self, other: Any) -> Any:
        return self._op("divide", other)

    def __rtruediv__(self, other: Any) -> Any:
        return self._op("divide", other, True)

    def __matmul__(self, other: Any) -> Any:
        return self._op("matmul", other)

    def __rmatmul__(self, other: Any) -> Any:
        return self._op("matmul", other, True)

    def __pow__(self, other: Any) -> Any:
        return self._op("power", other)

    def __neg__(self) -> Any:
        return self._op("negative")

    def __getitem__(self, key: Any) -> Any:
        return self._op("getitem", key=key)


class Node:
    """One call of a layer in the functional graph: its first argument (``inputs``), the
    other positional and keyword arguments of the call (``args``, ``kwargs``: KerasTensors
    among them are inputs too, as the value of ``mha(query, value)``), and the outputs."""

    _trace_opaque = True        # (as KerasTensor's: the graph, which no step changes)

    def __init__(self, layer: Layer, inputs: Any, outputs: Any, args: tuple[Any, ...] = (),
                 kwargs: dict[str, Any] | None = None) -> None:
        self.layer = layer
        self.inputs = inputs
        self.args = args
        self.kwargs = dict(kwargs or {})
        self.outputs = outputs
        self.flat_inputs: list[KerasTensor] = [
            x for x in flatten([inputs, list(args), self.kwargs]) if isinstance(x, KerasTensor)]
        self.flat_outputs: list[KerasTensor] = flatten(outputs)

    def call(self, values: Callable[[KerasTensor], Any], training: bool | None) -> Any:
        """The layer called as in the graph, each KerasTensor replaced by ``values(kt)``."""
        def swap(x: Any) -> Any:
            return values(x) if isinstance(x, KerasTensor) else x

        return self.layer(map_structure(swap, self.inputs),
                          *map_structure(swap, list(self.args)), training=training,
                          **map_structure(swap, self.kwargs))


def flatten(structure: Any) -> list[Any]:
    if isinstance(structure, (list, tuple)):
        return [v for item in structure for v in flatten(item)]
    if isinstance(structure, dict):
        return [v for key in structure for v in flatten(structure[key])]
    return [structure]


def map_structure(fn: Callable[[Any], Any], structure: Any) -> Any:
    if isinstance(structure, (list, tuple)):
        return type(structure)(map_structure(fn, v) for v in structure)
    if isinstance(structure, dict):
        return {k: map_structure(fn, v) for k, v in structure.items()}
    return fn(structure)


def is_symbolic(structure: Any) -> bool:
    return any(isinstance(x, KerasTensor) for x in flatten(structure))
