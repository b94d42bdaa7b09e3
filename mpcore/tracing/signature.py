"""The arguments of a traced call (:mod:`mpcore.function`): the signature that decides between
a replay and a new trace, the tensors among the arguments (a replay's inputs), and the input
tensors a trace runs on.

Numbers (NaN and signed zeros told apart as a kernel tells them), strings, None and lists,
tuples, namedtuples, dicts and sets of them are keyed by value; tensors by backend, dtype and
shape (a variable by identity: it is read, not passed); any other object by identity, through
a weak reference where it can (a cached program must not keep it alive, and a method's ``self``
whose ``__eq__`` says two instances are equal must not share a program).
"""

from __future__ import annotations

import math
import numbers
import weakref
from collections.abc import Callable
from typing import Any

from mpcore.core.tensor import Tensor, Variable
from mpcore.mixed_precision import policy as _policy
from mpcore.mixed_precision import trace_hooks as _hooks
from mpcore.plugins import registry as _registry

_BY_VALUE = (bool, int, float, complex, str, bytes, type(None))


def value_key(value: Any) -> Any:
    """``value`` as a key that tells apart what ``==`` does not and a kernel does: the signed
    zeros of a float (or of a complex's parts). ``0.0 == -0.0``, but ``x * -0.0`` is -0 where
    ``x * 0.0`` is +0, so a step traced with one must not replay for the other."""
    kind = type(value)
    if kind is float:                    # (the common case first: a guard reads a few a step)
        if value != value:               # NaN: equal to no value, not even itself
            return ("nan", math.copysign(1.0, value))
        return (value, math.copysign(1.0, value))
    if kind is int or kind is bool or kind is str or isinstance(value, int):
        return value
    if isinstance(value, numbers.Real):  # a float of any kind (NumPy's register as Real)
        if value != value:
            return ("nan", math.copysign(1.0, value))
        return (value, math.copysign(1.0, value))
    if isinstance(value, complex):
        return ("complex", value_key(value.real), value_key(value.imag))
    return value


class Identity:
    """An object in a signature, compared by identity (a method's ``self`` whose ``__eq__``
    says two instances are equal must not share a program) through a weak reference where it
    can (a cached program does not keep the object alive)."""

    __slots__ = ("_hash", "_ref")

    def __init__(self, value: Any) -> None:
        try:
            self._ref: Callable[[], Any] = weakref.ref(value)
        except TypeError:
            self._ref = lambda: value
        self._hash = id(value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Identity):
            return False
        mine = self._ref()
        return mine is not None and mine is other._ref()

    def __hash__(self) -> int:
        return self._hash

    def weak(self) -> Any:
        """The object, where the signature holds it weakly (None where it cannot)."""
        return self._ref() if isinstance(self._ref, weakref.ref) else None


def tensor_key(t: Tensor) -> tuple[Any, ...]:
    return ("tensor", t._backend.name, t._dtype, t.shape,
            isinstance(t, Variable) and Identity(t))


def weak_objects(key: Any) -> list[Any]:
    """The objects a signature holds weakly (arguments keyed by identity: an optimizer, a
    variable, a model), which the program must not keep alive either."""
    if isinstance(key, Identity):
        found = key.weak()
        return [] if found is None else [found]
    if isinstance(key, (tuple, frozenset)):
        return [obj for item in key for obj in weak_objects(item)]
    return []


def signature(args: tuple[Any, ...], kwargs: dict[str, Any], tensors: list[Tensor],
               plain: bool = False) -> tuple[Any, ...]:
    """The signature of a call; ``plain``: ``args`` are plain tensors and there are no
    ``kwargs`` (a model's step), whose key is then built flat: the same tuple as the walk."""
    def key(value: Any) -> Any:
        if isinstance(value, Tensor):
            return tensor_key(value)
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            return ("array", str(value.dtype), tuple(value.shape))
        if isinstance(value, (list, tuple)):
            kind = type(value)          # a namedtuple is its type: its fields are read by name
            return (kind.__name__ if kind in (list, tuple) else kind,
                    tuple(key(v) for v in value))
        if isinstance(value, dict):
            return ("dict", tuple((member_key(k), key(v)) for k, v in value.items()))
        if isinstance(value, _BY_VALUE):
            return ("value", type(value).__name__, value_key(value))
        if isinstance(value, (set, frozenset)):
            return (type(value).__name__, frozenset(member_key(v) for v in value))
        return ("object", Identity(value))

    described = (("tuple", tuple(map(tensor_key, tensors))), ("dict", ())) if plain else (
        key(args), key(kwargs))
    # which inputs are one array passed twice: a program traced with f(a, a) reads one slot
    # for both, so f(b, a) must trace again
    first: dict[int, int] = {}
    aliases = tuple(first.setdefault(id(t._data), n)
                    for n, t in enumerate(tensors))
    extra = None if _hooks.signature_hook is None else _hooks.signature_hook()
    # the current backend: what a step's own tensors (mp.ops.ones, constants) are made on
    return (_policy.global_policy().name, _registry.get_backend().name, *described, aliases,
            extra)


def member_key(value: Any) -> Any:
    """A dict key's or a set member's key. Neither is a replay's input (a tensor or a NumPy
    scalar there is read by the step as it is), so only plain values and tuples of them are
    keyed by value (a NumPy scalar by its value too); anything else by identity."""
    if isinstance(value, _BY_VALUE) or (isinstance(value, numbers.Number)
                                        and not hasattr(value, "_backend")):
        return ("value", type(value).__name__, value_key(value))
    if type(value) is tuple:
        return ("tuple", tuple(member_key(v) for v in value))
    return ("object", Identity(value))


def as_tensors(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value
    if hasattr(value, "shape") and hasattr(value, "dtype"):   # a host array
        from mpcore.ops import constant

        return constant(value)
    if isinstance(value, (list, tuple, dict)):
        return _rebuilt(value, as_tensors)
    return value


def _rebuilt(value: list[Any] | tuple[Any, ...] | dict[Any, Any], fn: Callable[[Any], Any]
             ) -> Any:
    """``value`` with ``fn`` applied to each item, of the same type (a namedtuple stays one)."""
    if isinstance(value, dict):
        return {k: fn(v) for k, v in value.items()}
    items = [fn(v) for v in value]
    if isinstance(value, list):
        return items
    # a namedtuple through _make: a subclass may give __new__ other arguments
    return type(value)._make(items) if hasattr(type(value), "_fields") else tuple(items)


def private_inputs(value: Any, aliases: dict[int, Any]) -> Any:
    """``value`` with every input tensor (not a variable) around a new array object over the
    same memory (one per input array): while tracing, a read of the input is then told apart
    from a read of the same array through a variable or a captured tensor, which a replay
    must not take from the next call's input."""
    if isinstance(value, Variable):
        return value
    if isinstance(value, Tensor):
        array = value._data
        alias = aliases.get(id(array))
        if alias is None:
            alias = aliases[id(array)] = _alias(value._backend, array)
        return Tensor(alias, value._backend, value._dtype)
    if isinstance(value, (list, tuple, dict)):
        return _rebuilt(value, lambda v: private_inputs(v, aliases))
    return value


def _alias(backend: Any, array: Any) -> Any:
    """A new array object over ``array``'s memory: the backend's reshape to the same shape (a
    view on every built-in backend). A plugin whose reshape returns the array itself, or
    raises, leaves the input its own array (and the read of it through a variable or a
    captured tensor recorded as the input's)."""
    try:
        return backend.kernels()["reshape"](array, tuple(array.shape))
    except Exception:   # a plugin's reshape that cannot
        return array


def tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Variable):
        return []                            # read through the variable, not as an input
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors(v)]
    return []
