"""Custom objects, Keras 3's ``object_registration``: ``@register_keras_serializable``, the
``custom_object_scope`` and ``get_custom_objects``. A config names a custom class by its
registered name ``"<package>>" + "<name>"`` (``"Custom>MyLayer"``); loading finds it here, in a
scope, or in the ``custom_objects=`` of the call."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

#: The process-wide registry (Keras' ``GLOBAL_CUSTOM_OBJECTS``): registered name -> object.
GLOBAL_CUSTOM_OBJECTS: dict[str, Any] = {}
#: object -> its registered name (Keras' ``GLOBAL_CUSTOM_NAMES``).
_NAMES: dict[Any, str] = {}
# the innermost custom_object_scope's objects; a contextvar, so threads and tasks keep their own
_SCOPED: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "mpcore_custom_objects", default=None)


def register_keras_serializable(package: str = "Custom", name: str | None = None
                                ) -> Callable[[T], T]:
    """Register a class or function under ``"<package>>" + "<name>"`` (``name`` defaults to its
    ``__name__``), so a saved config that names it loads without ``custom_objects``. A class
    must define ``get_config`` (Keras 3's rule)."""
    if not isinstance(package, str) or not package or ">" in package:
        raise ValueError(f"package must be a non-empty string without '>', got {package!r}")

    def decorator(obj: T) -> T:
        serializable = name if name is not None else getattr(obj, "__name__", None)
        if not isinstance(serializable, str) or not serializable:
            raise ValueError(f"cannot register {obj!r}: give it a name=")
        registered = f"{package}>{serializable}"
        if isinstance(obj, type) and not hasattr(obj, "get_config"):
            raise ValueError(f"cannot register class {obj.__name__}: it needs a get_config() "
                             "method to be serialized")
        GLOBAL_CUSTOM_OBJECTS[registered] = obj
        _NAMES[obj] = registered
        return obj

    return decorator


def get_registered_name(obj: Any) -> str:
    """The name ``obj`` is registered under, else its ``__name__`` (Keras 3's rule)."""
    if obj in _NAMES:
        return _NAMES[obj]
    return str(getattr(obj, "__name__", type(obj).__name__))


def registered_name_or_none(obj: Any) -> str | None:
    """The name ``obj`` was registered under, or None when it never was."""
    try:
        return _NAMES.get(obj)
    except TypeError:     # an unhashable object was never registered
        return None


def get_registered_object(name: str | None, custom_objects: dict[str, Any] | None = None
                          ) -> Any:
    """The object called ``name`` in ``custom_objects``, the innermost scope, or the registry
    (that order of precedence), or None."""
    if name is None:
        return None
    for table in (custom_objects or {}, _SCOPED.get() or {}, GLOBAL_CUSTOM_OBJECTS):
        if name in table:
            return table[name]
    return None


def get_custom_objects() -> dict[str, Any]:
    """The registry itself (a mutable dict, as Keras': ``get_custom_objects()["X"] = X``
    registers ``X``)."""
    return GLOBAL_CUSTOM_OBJECTS


def scoped_objects() -> dict[str, Any]:
    """The objects of the custom_object_scopes in force here."""
    return dict(_SCOPED.get() or {})


@contextlib.contextmanager
def custom_object_scope(*objects: dict[str, Any] | None) -> Iterator[None]:
    """Inside the block, deserialization also finds the objects of the dicts given (a class
    by its name, as ``custom_objects=`` does); scopes nest."""
    merged = dict(_SCOPED.get() or {})
    for table in objects:
        if table is None:
            continue
        if not isinstance(table, dict):
            raise TypeError(f"custom_object_scope takes dicts of name -> object, got {table!r}")
        merged.update(table)
    token = _SCOPED.set(merged)
    try:
        yield
    finally:
        _SCOPED.reset(token)


CustomObjectScope = custom_object_scope
