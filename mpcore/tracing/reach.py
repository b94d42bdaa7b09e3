"""What a traced step reaches, for :mod:`mpcore.tracing.python_state`: which objects are looked
into and how their entries are read (an object's attributes, a container's items, a function's
globals and closure, a user class's attributes), and how an entry is named in a message.

The walk meets thousands of values in a large model's step, so each is classified by one
look-up of its type (:func:`kind_of`), and the path that names a value (``Counter 'counter'
attribute 'history'``) is spelled only for a message (:class:`At`).
"""

from __future__ import annotations

import functools
import numbers
import os
import sys
import types
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from mpcore.core.backend import Backend
from mpcore.core.tensor import Tensor, Variable
from mpcore.core.trace_seeds import DrawnSeed

__all__ = ["BUILTIN_PLAIN", "MAX_ITEMS", "MISSING", "At", "Owner", "Path", "kind_of",
           "owner_of", "read", "show", "text"]

#: Containers compared by length only above this many items (a dataset held in a global).
MAX_ITEMS = 100_000
MISSING = object()
_CACHED_CLASSES = 4096
_PLAIN = (str, bytes, bool, type(None))
BUILTIN_PLAIN = frozenset((str, bytes, bool, int, float, complex, type(None)))
_NOT_INSPECTED = (type, types.ModuleType, types.BuiltinFunctionType, types.MethodType,
                  types.MethodWrapperType, types.WrapperDescriptorType, property,
                  classmethod, staticmethod, Tensor, Backend)
_SITE = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


# --- which objects are looked into ---------------------------------------------------------
@functools.cache
def _origin(module: str) -> str:
    """``"mpcore"``, ``"package"`` (the standard library or an installed package) or
    ``"user"`` for the module a class or function comes from."""
    top = module.partition(".")[0]
    if top == "mpcore" or top.startswith("mpcore_"):
        return "mpcore"
    if top in sys.stdlib_module_names or top == "builtins":
        return "package"
    path = getattr(sys.modules.get(module), "__file__", None) or ""
    return "package" if any(part in path for part in _SITE) else "user"


def _by_class(compute: Callable[[type], Any]) -> Callable[[type], Any]:
    """``compute(cls)``, cached: a walk asks once per value. The cache holds the classes it
    saw, up to :data:`_CACHED_CLASSES` (then starts again: classes made in a loop are not
    held forever; a weak cache costs a weak reference per look-up)."""
    cache: dict[type, Any] = {}

    def get(cls: type) -> Any:
        value = cache.get(cls, MISSING)
        if value is MISSING:
            if len(cache) >= _CACHED_CLASSES:
                cache.clear()
            value = cache[cls] = compute(cls)
        return value

    return get


@_by_class
def _inspected(cls: type) -> bool:
    """Whether objects of ``cls`` are looked into (see the module docstring)."""
    if issubclass(cls, _NOT_INSPECTED) or getattr(cls, "_trace_opaque", False):
        return False
    # (a layer, metric or optimizer from an installed package is mpcore's kind all the same)
    return any(_origin(getattr(klass, "__module__", "") or "") != "package"
               for klass in cls.__mro__ if klass is not object)


@_by_class
def _ignored(cls: type) -> frozenset[str]:
    return frozenset(name for klass in cls.__mro__
                     for name in klass.__dict__.get("_trace_ignored_attributes", ()))


@_by_class
def _set_once(cls: type) -> frozenset[str]:
    return frozenset(name for klass in cls.__mro__
                     for name in klass.__dict__.get("_trace_set_once_attributes", ()))


@_by_class
def _slots(cls: type) -> tuple[str, ...]:
    names = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__"):
                names.append(name)
    return tuple(names)


def _user_function(value: Any) -> bool:
    return (type(value) is types.FunctionType
            and _origin(getattr(value, "__module__", None) or "") == "user")


def _code_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):       # a lambda, comprehension, nested def
            yield from _code_names(const)


# --- an owner of entries: an object, a container, a function's globals and closure ----------
class Owner:
    """Something whose entries are compared: ``read()`` gives them now, ``label(key)`` names
    one in a message (and is the path of what it holds)."""

    __slots__ = ("arrays", "entries", "label", "obj", "read", "set_once")

    def __init__(self, obj: Any, read: Callable[[], dict[Any, Any]],
                 label: Callable[[Any], str], set_once: frozenset[str] = frozenset()) -> None:
        self.obj, self.read, self.label = obj, read, label
        #: attributes whose first setting (from absent, None or False) is not a change
        self.set_once = set_once
        #: the entries as they were (the values themselves: held, so no id is reused)
        self.entries: dict[Any, Any] = {}
        #: the bytes of the NumPy arrays among them (an update in place), by key
        self.arrays: dict[Any, bytes] = {}


def _object_entries(obj: Any) -> dict[Any, Any]:
    cls = type(obj)
    entries = dict(getattr(obj, "__dict__", None) or {})
    for name in _slots(cls):
        value = getattr(obj, name, MISSING)
        if value is not MISSING:
            entries[name] = value
    for name in _ignored(cls):
        entries.pop(name, None)
    return entries


def _class_entries(cls: type) -> dict[Any, Any]:
    """A user's class: its attributes (a counter kept on the class), its methods' functions."""
    entries = {}
    for name, value in vars(cls).items():
        if name.startswith("__") and name.endswith("__"):
            continue
        entries[name] = value.__func__ if isinstance(value, (staticmethod, classmethod)) \
            else value
    return entries


def _container_entries(obj: Any) -> dict[Any, Any]:
    if len(obj) > MAX_ITEMS:
        return {"length": len(obj)}
    if isinstance(obj, dict):
        return dict(obj)
    if isinstance(obj, (set, frozenset)):
        return {item: item for item in obj}
    return dict(enumerate(obj))


def _namespace_entries(fn: types.FunctionType) -> Callable[[], dict[Any, Any]]:
    names = sorted(set(_code_names(fn.__code__)))
    cells = list(zip(fn.__code__.co_freevars, fn.__closure__ or ()))

    def read() -> dict[Any, Any]:
        g = fn.__globals__
        entries: dict[Any, Any] = {("global", n): g.get(n, MISSING) for n in names}
        for name, cell in cells:
            try:
                entries[("closure variable", name)] = cell.cell_contents
            except ValueError:                   # (a cell not yet bound)
                entries[("closure variable", name)] = MISSING
        return {k: v for k, v in entries.items() if v is not MISSING}

    return read


def read(owner: Owner) -> dict[Any, Any]:
    """The owner's entries now; none where they cannot be read (an object of the user's whose
    ``__dict__`` or items raise): not looked into, rather than failing the trace."""
    try:
        return owner.read()
    except Exception:
        return {}


def _describe_object(obj: Any, path: str) -> str:
    name = (getattr(obj, "__dict__", None) or {}).get("name")
    return f"{type(obj).__name__} {name!r}" if isinstance(name, str) else path


def show(value: Any) -> str:
    if isinstance(value, Variable):
        return f"variable {value.name!r}"
    if isinstance(value, Tensor):
        return f"a {value.dtype}{list(value.shape)} tensor"
    if isinstance(value, (*_PLAIN, numbers.Number)) or type(value) is tuple:
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    if isinstance(value, (list, dict, set, deque)):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"a {type(value).__name__}"


class At:
    """The path of what ``owner`` holds at ``key``, spelled only for a message (a trace
    spells none of the thousands it walks)."""

    __slots__ = ("key", "owner")

    def __init__(self, owner: Owner, key: Any) -> None:
        self.owner, self.key = owner, key


#: A path: a string, an :class:`At`, or ``(format, path)`` (the path put in the format).
Path = Any


def text(path: Path) -> str:
    if isinstance(path, str):
        return path
    if isinstance(path, At):
        return path.owner.label(path.key)
    return str(path[0].format(text(path[1])))


@_by_class
def kind_of(kind: type) -> str:
    """What a value of type ``kind`` is to the walk (one look-up per value: a trace walks
    thousands)."""
    if kind is DrawnSeed:
        return "leaf"
    if kind in BUILTIN_PLAIN or issubclass(kind, (str, bytes, numbers.Number)):
        return "plain"
    if issubclass(kind, tuple):                 # (a namedtuple too)
        return "tuple"
    if kind is types.MethodType:
        return "method"
    if kind is types.FunctionType:
        return "function"
    if issubclass(kind, functools.partial):
        return "partial"
    if issubclass(kind, (list, dict, set, deque)):
        return "container"
    if issubclass(kind, type):
        return "class"
    if _inspected(kind):
        return "object"
    return "opaque" if getattr(kind, "_trace_opaque", False) else "leaf"


def owner_of(value: Any, path: Path, queue: deque[tuple[Any, Path]]) -> Owner | None:
    """The owner ``value`` is (``path`` names it), or None: a leaf, or something looked
    through (a tuple, a bound method, a partial: what they hold is queued)."""
    kind = type(value)
    category = kind_of(kind)
    if category == "object":
        if _origin(kind.__module__) == "user":        # its class: methods, class attributes
            queue.append((kind, path))
        return Owner(value, functools.partial(_object_entries, value),
                     lambda k: f"{_describe_object(value, text(path))} attribute {k!r}",
                     _set_once(kind))
    if category == "container":
        noun = ("key {!r}" if isinstance(value, dict) else
                "member {}" if isinstance(value, set) else "item {}")
        name = kind.__name__

        def label(k: Any) -> str:
            shown = show(k) if isinstance(value, set) else k
            return f"{noun.format(shown)} of the {name} in {text(path)}"

        return Owner(value, functools.partial(_container_entries, value), label)
    if category == "tuple":
        queue.extend((v, ("{}[" + str(i) + "]", path)) for i, v in enumerate(value))
    elif category == "partial":
        queue.append((value.func, path))
        queue.extend((v, (f"argument {i} of {{}}", path)) for i, v in enumerate(value.args))
        queue.extend((v, (f"argument {k!r} of {{}}", path)) for k, v in value.keywords.items())
    elif category == "method":                        # a bound method: its object, its code
        queue.append((value.__self__, path))
        queue.append((value.__func__, path))
    elif category == "function" and _user_function(value):
        qualname = value.__qualname__
        return Owner(value, _namespace_entries(value),
                     lambda k: f"{k[0]} {k[1]!r} of {qualname}")
    elif category == "class" and _origin(getattr(value, "__module__", "") or "") == "user":
        return Owner(value, functools.partial(_class_entries, value),
                     lambda k: f"class attribute {value.__name__}.{k}")
    elif category == "opaque":
        wrapped = getattr(value, "__wrapped__", None)
        if wrapped is not None:
            queue.append((wrapped, path))             # a traced function: what it traces
    return None
