"""Python state a traced step changes: refused, since a replay runs no Python code.

A replay calls the recorded kernels (and the calls kept whole); the step's own Python code runs
only while it is traced. So a step that changes Python state (``self.calls += 1``,
``self.last = x``, ``self.history.append(...)``, ``state["n"] += 1`` on a dict it closes over,
a ``global`` counter) would change it once, at the trace, and never again: eagerly it changes at
every call. ``tf.function`` lets that happen silently; mpcore refuses it with a
:class:`~mpcore.trace_state.TraceError` naming the object and the attribute (or, under
``fallback=True``, runs the function eagerly from then on).

How it is seen: before the step runs, :class:`StateWatch` takes a shallow snapshot of the Python
state the step can reach, and after it compares (only for a trace that is kept: a first trace
that creates variables is run eagerly and never replayed, so what it changes is right). What
is looked at, from the traced callable:

- the object of a bound method (a model's step: the model), the non-tensor arguments, a
  callable object, ``functools.partial``'s function and arguments;
- the globals the function's code names (``co_names`` of its code and of the code nested in
  it) and the variables of its closure, and so for each function of the user's code reached;
- from there, recursively: the attributes (``__dict__`` and ``__slots__``) of objects of
  mpcore's classes (layers, sublayers, metrics, the optimizer, the loss scale) and of the
  user's classes (not those of the standard library or of installed packages: their objects,
  a logger's cache say, change for reasons of their own), and the items of lists, dicts, sets
  and deques (tuples are looked through).

An entry (an attribute, a key, an item, a global) has changed when it was added or removed,
or its value differs: numbers, strings, bytes, ``None`` (and tuples of them) by value; a small
NumPy array by its bytes (an update in place; one over 64 KiB by identity only); anything else
by identity (a tensor stored on an object is the trace's tensor, stale after the first
replay). Containers over 100 000 items are compared by length only. Variables are not looked
into: an ``assign`` is a step of the program, and replays. Also not seen: state kept inside
objects of the standard library or of installed packages (a ``random.Random``, an
``itertools.count``, a generator's position).

What is not refused:

- a change made inside a call kept whole (``function.kept_whole``: the optimizer's
  ``apply_gradients``, the loss scaling), which each replay makes again, and inside a kept
  whole method recorded kernel by kernel, whose per-step Python work is recorded with
  ``on_replay`` (the optimizer's step count and last gradients);
- attributes a class declares in ``_trace_ignored_attributes`` (a tuple of names, inherited
  and combined over the class's bases): state mpcore's own machinery sets in a step where the
  next eager call would leave it as it is (a layer's ``built`` flag and build shape, set by its
  first call; the compiled loss's per-output losses, written and read within the same step).
  Each declaration says why;
- objects whose class sets ``_trace_opaque = True`` (a traced function itself), and tensors,
  variables, backends, modules, classes and functions of mpcore or of packages: entries that
  hold them compare by identity, and are not looked into.

The snapshot is taken at each trace, never at a replay: replays cost the same as before.
"""

from __future__ import annotations

import contextlib
import functools
import numbers
import os
import sys
import types
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from mpcore.backend import Backend
from mpcore.program import KernelCall
from mpcore.tensor import Tensor, Variable
from mpcore.trace_seeds import DrawnSeed

__all__ = ["StateWatch", "watching_whole"]

#: Containers compared by length only above this many items (a dataset held in a global).
MAX_ITEMS = 100_000
#: NumPy arrays compared by their bytes up to this size (by identity above).
MAX_ARRAY_BYTES = 1 << 16
_MISSING = object()
_PLAIN = (str, bytes, bool, type(None))
_NOT_INSPECTED = (type, types.ModuleType, types.BuiltinFunctionType, types.MethodType,
                  types.MethodWrapperType, types.WrapperDescriptorType, property,
                  classmethod, staticmethod, Tensor, Backend)
_SITE = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)

Fingerprint = tuple[Any, ...]


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


@functools.cache
def _inspected(cls: type) -> bool:
    """Whether objects of ``cls`` are looked into (see the module docstring)."""
    if issubclass(cls, _NOT_INSPECTED) or getattr(cls, "_trace_opaque", False):
        return False
    return _origin(getattr(cls, "__module__", "") or "") != "package"


@functools.cache
def _ignored(cls: type) -> frozenset[str]:
    return frozenset(name for klass in cls.__mro__
                     for name in klass.__dict__.get("_trace_ignored_attributes", ()))


@functools.cache
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
class _Owner:
    """Something whose entries are compared: ``read()`` gives them now, ``label(key)`` names
    one in a message (and is the path of what it holds)."""

    __slots__ = ("entries", "label", "obj", "read")

    def __init__(self, obj: Any, read: Callable[[], dict[Any, Any]],
                 label: Callable[[Any], str]) -> None:
        self.obj, self.read, self.label = obj, read, label
        self.entries: dict[Any, Fingerprint] = {}


def _object_entries(obj: Any) -> dict[Any, Any]:
    cls = type(obj)
    entries = dict(getattr(obj, "__dict__", None) or {})
    for name in _slots(cls):
        value = getattr(obj, name, _MISSING)
        if value is not _MISSING:
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
        entries: dict[Any, Any] = {("global", n): g.get(n, _MISSING) for n in names}
        for name, cell in cells:
            try:
                entries[("closure variable", name)] = cell.cell_contents
            except ValueError:                   # (a cell not yet bound)
                entries[("closure variable", name)] = _MISSING
        return {k: v for k, v in entries.items() if v is not _MISSING}

    return read


def _describe_object(obj: Any, path: str) -> str:
    name = (getattr(obj, "__dict__", None) or {}).get("name")
    return f"{type(obj).__name__} {name!r}" if isinstance(name, str) else path


# --- fingerprints --------------------------------------------------------------------------
def _fingerprint(value: Any) -> Fingerprint:
    if isinstance(value, _PLAIN) or (isinstance(value, numbers.Number)
                                     and type(value) is not DrawnSeed):
        # (a seed drawn in the step is the trace's value: by identity, as any other object)
        return ("=", type(value), value)
    if type(value) is tuple:
        return ("(", tuple(_fingerprint(v) for v in value))
    if (type(value).__module__ == "numpy" and hasattr(value, "tobytes")
            and getattr(value, "nbytes", MAX_ARRAY_BYTES + 1) <= MAX_ARRAY_BYTES):
        return ("a", value, value.tobytes())
    return ("@", value)


def _same(a: Fingerprint, b: Fingerprint) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "=":
        x, y = a[2], b[2]
        return a[1] is b[1] and bool(x is y or x == y or (x != x and y != y))   # (NaN)
    if a[0] == "(":
        return len(a[1]) == len(b[1]) and all(_same(x, y) for x, y in zip(a[1], b[1]))
    if a[0] == "a":
        return a[1] is b[1] and a[2] == b[2]
    return a[1] is b[1]


def _show(value: Any) -> str:
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


def _owner(value: Any, path: str, queue: deque[tuple[Any, str]]) -> _Owner | None:
    """The owner ``value`` is (``path`` names it), or None: a leaf, or something looked
    through (a tuple, a bound method, a partial: what they hold is queued)."""
    if isinstance(value, (str, bytes, numbers.Number)) or value is None:
        return None
    if type(value) is tuple:
        queue.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
        return None
    if isinstance(value, functools.partial):
        queue.append((value.func, path))
        queue.extend((v, f"argument {i} of {path}") for i, v in enumerate(value.args))
        queue.extend((v, f"argument {k!r} of {path}") for k, v in value.keywords.items())
        return None
    if isinstance(value, types.MethodType):           # a bound method: its object, its code
        queue.append((value.__self__, _describe_object(value.__self__, path)))
        queue.append((value.__func__, path))
        return None
    if isinstance(value, (list, dict, set, deque)):
        where = f"the {type(value).__name__} in {path}"
        noun = ("key {!r}" if isinstance(value, dict) else "item {}")
        if isinstance(value, set):
            return _Owner(value, functools.partial(_container_entries, value),
                          lambda k: f"member {_show(k)} of {where}")
        return _Owner(value, functools.partial(_container_entries, value),
                      lambda k: f"{noun.format(k)} of {where}")
    if type(value) is types.FunctionType:
        if not _user_function(value):
            return None
        name = value.__qualname__
        return _Owner(value, _namespace_entries(value), lambda k: f"{k[0]} {k[1]!r} of {name}")
    if isinstance(value, type):
        if _origin(getattr(value, "__module__", "") or "") != "user":
            return None
        return _Owner(value, functools.partial(_class_entries, value),
                      lambda k: f"class attribute {value.__name__}.{k}")
    if not _inspected(type(value)):
        wrapped = getattr(value, "__wrapped__", None)
        if getattr(type(value), "_trace_opaque", False) and wrapped is not None:
            queue.append((wrapped, path))             # a traced function: what it traces
        return None
    if _origin(type(value).__module__) == "user":     # its class: methods, class attributes
        queue.append((type(value), path))
    what = _describe_object(value, path)
    return _Owner(value, functools.partial(_object_entries, value),
                  lambda k: f"{what} attribute {k!r}")


# --- the watch -----------------------------------------------------------------------------
class StateWatch:
    """The Python state a traced call can reach, as it was before the call (see the module
    docstring); :meth:`refusal` says what the call changed."""

    def __init__(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.owners: dict[int, _Owner] = {}
        #: (owner id, key) -> the entry's value after a call kept whole changed it
        self.exempt: dict[tuple[int, Any], Fingerprint] = {}
        self._kept: list[Any] = []        # (what the exemptions name stays alive)
        roots: list[tuple[Any, str]] = [(fn, "the traced function")]
        roots += [(a, f"argument {i}") for i, a in enumerate(args)]
        roots += [(v, f"argument {k!r}") for k, v in kwargs.items()]
        self._walk(roots, self.owners)

    def _walk(self, roots: list[tuple[Any, str]], owners: dict[int, _Owner]) -> None:
        queue = deque(roots)
        while queue:
            value, path = queue.popleft()
            if id(value) in owners:
                continue
            owner = _owner(value, path, queue)
            if owner is None:
                continue
            owners[id(value)] = owner
            entries = owner.read()
            owner.entries = {k: _fingerprint(v) for k, v in entries.items()}
            queue.extend((child, owner.label(key)) for key, child in entries.items())

    # calls kept whole -------------------------------------------------------------------------
    def before_whole(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[int, _Owner]:
        """The state a call kept whole can reach through its arguments, before it runs."""
        owners: dict[int, _Owner] = {}
        self._walk([(a, "") for a in args] + [(v, "") for v in kwargs.values()], owners)
        return owners

    def after_whole(self, before: dict[int, _Owner]) -> None:
        """What the call changed is made again at each replay: not refused (while it stays
        as the call left it)."""
        for key, owner in before.items():
            now = {k: _fingerprint(v) for k, v in owner.read().items()}
            for entry in owner.entries.keys() | now.keys():
                old, new = owner.entries.get(entry), now.get(entry)
                if old is None or new is None or not _same(old, new):
                    self.exempt[(key, entry)] = new if new is not None else ("-",)
                    self._kept.append(owner.obj)

    # the end of the trace ---------------------------------------------------------------------
    def changes(self, steps: Sequence[Any] = ()) -> list[str]:
        """What the traced call changed, one phrase each, in the order the state was found.
        ``steps``: the recorded program's; an array given to one of its kernels as a constant
        (a slot updated in place) is written again by each replay."""
        operands = _constant_operands(steps)
        out: list[str] = []
        for key, owner in self.owners.items():
            now = owner.read()
            for entry in [*owner.entries, *(k for k in now if k not in owner.entries)]:
                old = owner.entries.get(entry)
                value = now.get(entry, _MISSING)
                new = None if value is _MISSING else _fingerprint(value)
                if old is not None and new is not None and (
                        _same(old, new) or (old[0] == "a" and id(old[1]) in operands)):
                    continue
                exempt = self.exempt.get((key, entry))
                if exempt is not None and (_same(exempt, new) if new is not None
                                           else exempt == ("-",)):
                    continue
                label = owner.label(entry)
                if old is None:
                    out.append(f"{label} was added ({_show(value)})")
                elif new is None:
                    out.append(f"{label} was removed")
                else:
                    out.append(f"{label} changed from {_show(_value_of(old))} to "
                               f"{_show(value)}")
        return out

    def refusal(self, name: str, steps: Sequence[Any]) -> str | None:
        """The refusal's message for the traced function ``name`` (whose program has
        ``steps``), or None."""
        changes = self.changes(steps)
        if not changes:
            return None
        more = f" (and {len(changes) - 1} more: {'; '.join(changes[1:3])})" if len(
            changes) > 1 else ""
        return (f"{changes[0]} while tracing {name}{more}: a replay does not run Python code, "
                "so it would not change it again (and a tensor kept there would stay the "
                "trace's). Keep such state in a mp.Variable (updated with assign), or change "
                "it outside the step, or call the function without mp.function.")


def _constant_operands(steps: Sequence[Any]) -> set[int]:
    """The ids of the constants (``("c", value)`` specs) the kernel calls of ``steps`` read."""
    out: set[int] = set()

    def visit(spec: Any) -> None:
        if not isinstance(spec, tuple) or not spec:
            return
        kind = spec[0]
        if kind == "c":
            out.add(id(spec[1]))
        elif kind in ("l", "t"):
            for item in spec[1]:
                visit(item)
        elif kind == "d":
            for item in spec[1].values():
                visit(item)
        elif kind == "T":
            visit(spec[1])

    for step in steps:
        if isinstance(step, KernelCall):
            for spec in step.args:
                visit(spec)
    return out


def _value_of(fingerprint: Fingerprint) -> Any:
    if fingerprint[0] == "=":
        return fingerprint[2]
    if fingerprint[0] == "(":
        return tuple(_value_of(f) for f in fingerprint[1])
    return fingerprint[1]


@contextlib.contextmanager
def watching_whole(watch: StateWatch | None, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Iterator[None]:
    """Around a call kept whole in a trace that ``watch`` watches (None: nothing to do)."""
    if watch is None:
        yield
        return
    before = watch.before_whole(args, kwargs)
    yield
    watch.after_whole(before)
