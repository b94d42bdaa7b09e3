"""What a traced step may return, and how a replay gives it back in the same shape.

A replay builds its result from the program's output spec: tensors around the replay's arrays,
in lists, tuples and dicts that the generated source writes as literals. That covers what steps
return almost always. Anything else is described here as a flat tuple of its leaves and a
template that rebuilds the structure around them at each replay: a namedtuple (its type, so
``result.loss`` works on every call, not only the first), a dict whose keys are not literals
the source can spell (an enum, ``float("inf")``), an OrderedDict. A leaf must be a tensor or a
plain Python value; any other object (a dataclass holding tensors, another subclass of a list,
tuple or dict, whose constructor a replay cannot know) would come back as the first call's
object with the first call's tensors, or not at all, so it is refused while tracing.
"""

from __future__ import annotations

import collections
import numbers
from collections.abc import Callable
from typing import Any

from mpcore.core.tensor import Tensor
from mpcore.tracing.program import Node, TupleOf

#: dict keys the generated source writes as literals (``repr`` spells them back)
_LITERAL_KEYS = (str, int, bool, type(None))
#: the leaves a template holds
_VALUES = (numbers.Number, str, bytes, type(None))


class UnsupportedOutputError(Exception):
    """A step returned something a replay could not give back."""


def spec(recorder: Any, out: Any, name: str) -> tuple[Node, Callable[[Any], Any] | None]:
    """The program's output spec for ``out``, and None or the function that rebuilds its
    structure from the flat tuple a replay then returns."""
    if _literal(out):
        return recorder.tensor_spec(out), None
    leaves: list[Any] = []
    template = _template(out, leaves, name)
    shape = _rebuild_from(template)
    return TupleOf(tuple(recorder.tensor_spec(v) for v in leaves)), shape


def rebuilding(runner: Callable[[list[Any]], Any], rebuild: Callable[[Any], Any]
               ) -> Callable[[list[Any]], Any]:
    def run(inputs: list[Any]) -> Any:
        return rebuild(runner(inputs))

    return run


def _literal(value: Any) -> bool:
    """Whether the generated source can return ``value`` as it is: tensors and plain values
    in lists, tuples and dicts with literal keys (their exact types)."""
    kind = type(value)
    if isinstance(value, (Tensor, *_VALUES)):
        return True
    if kind is list or kind is tuple:
        return all(_literal(v) for v in value)
    if kind is dict:
        return all(type(k) in _LITERAL_KEYS and _literal(v) for k, v in value.items())
    return False


def _template(value: Any, leaves: list[Any], name: str) -> Any:
    """The structure of ``value`` with its leaves (appended to ``leaves``) as None."""
    if isinstance(value, (Tensor, *_VALUES)):
        leaves.append(value)
        return None
    kind = type(value)
    if kind is dict or kind is collections.OrderedDict:
        return (kind, list(value), [_template(v, leaves, name) for v in value.values()])
    if kind is list or kind is tuple or hasattr(kind, "_fields"):    # (a namedtuple)
        return (kind, [_template(v, leaves, name) for v in value])
    raise UnsupportedOutputError(
        f"{name} returned a {type(value).__name__}: a traced step returns tensors and plain "
        "Python values (numbers, strings, None), in lists, tuples, namedtuples, dicts and "
        "OrderedDicts; a "
        f"replay would give back the first call's {type(value).__name__} with the first "
        "call's tensors. Return its fields (a tuple or dict of tensors) instead, or call the "
        "function without mp.function.")


def _rebuild_from(template: Any) -> Callable[[Any], Any]:
    def fill(node: Any, leaves: Any) -> Any:
        if node is None:
            return next(leaves)
        if len(node) == 3:
            return node[0]((k, fill(child, leaves)) for k, child in zip(node[1], node[2]))
        kind, children = node
        items = [fill(child, leaves) for child in children]
        if kind is list or kind is tuple:
            return items if kind is list else tuple(items)
        return kind._make(items)            # a namedtuple (its __new__ may differ)

    def rebuild(flat: Any) -> Any:
        return fill(template, iter(flat))

    return rebuild
