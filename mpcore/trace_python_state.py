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
import weakref
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
#: ... and up to this many bytes of them in all (a global list of small arrays: a dataset).
MAX_SNAPSHOT_BYTES = 1 << 24
_REMOVED: Fingerprint = ("-",)
_MISSING = object()
_PLAIN = (str, bytes, bool, type(None))
_BUILTIN_PLAIN = frozenset((str, bytes, bool, int, float, complex, type(None)))
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


def _by_class(compute: Callable[[type], Any]) -> Callable[[type], Any]:
    """``compute(cls)``, kept while the class lives (classes made in a loop are not held)."""
    cache: weakref.WeakKeyDictionary[type, Any] = weakref.WeakKeyDictionary()

    def get(cls: type) -> Any:
        try:
            return cache[cls]
        except KeyError:
            value = cache[cls] = compute(cls)
            return value
        except TypeError:                     # (a class that takes no weak reference)
            return compute(cls)

    return get


@_by_class
def _inspected(cls: type) -> bool:
    """Whether objects of ``cls`` are looked into (see the module docstring)."""
    if issubclass(cls, _NOT_INSPECTED) or getattr(cls, "_trace_opaque", False):
        return False
    return _origin(getattr(cls, "__module__", "") or "") != "package"


@_by_class
def _ignored(cls: type) -> frozenset[str]:
    return frozenset(name for klass in cls.__mro__
                     for name in klass.__dict__.get("_trace_ignored_attributes", ()))


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


def _read(owner: _Owner) -> dict[Any, Any]:
    """The owner's entries now; none where they cannot be read (an object of the user's whose
    ``__dict__`` or items raise): not looked into, rather than failing the trace."""
    try:
        return owner.read()
    except Exception:
        return {}


def _describe_object(obj: Any, path: str) -> str:
    name = (getattr(obj, "__dict__", None) or {}).get("name")
    return f"{type(obj).__name__} {name!r}" if isinstance(name, str) else path


# --- fingerprints --------------------------------------------------------------------------
def _plain(value: Any) -> bool:
    # (a seed drawn in the step is the trace's value: by identity, as any other object)
    kind = type(value)
    return kind in _BUILTIN_PLAIN or _category(kind) == "plain"


def _fingerprint(value: Any, budget: list[int]) -> Fingerprint:
    """What :func:`unchanged` compares ``value`` by; an array's bytes are kept while
    ``budget`` (bytes, for the whole snapshot) lasts, identity only after."""
    kind = type(value)
    if kind in _BUILTIN_PLAIN or _plain(value):
        return ("=", kind, value)
    if _category(kind) == "tuple":
        return ("(", kind, tuple(_fingerprint(v, budget) for v in value))
    if type(value).__module__ == "numpy" and hasattr(value, "tobytes"):
        size = getattr(value, "nbytes", MAX_ARRAY_BYTES + 1)
        if size > MAX_ARRAY_BYTES or size > budget[0]:
            return ("a", value, None)
        budget[0] -= size
        return ("a", value, value.tobytes())
    return ("@", value)


def unchanged(old: Fingerprint, value: Any) -> bool:
    """Whether ``value`` is what ``old`` was taken from, unchanged."""
    kind = old[0]
    if kind == "=":
        if not (_plain(value) and type(value) is old[1]):
            return False
        x = old[2]
        return bool(x is value or x == value or (x != x and value != value))   # (NaN)
    if kind == "(":
        return (type(value) is old[1] and len(value) == len(old[2])
                and all(unchanged(o, v) for o, v in zip(old[2], value)))
    if kind == "a":
        return value is old[1] and (old[2] is None or value.tobytes() == old[2])
    return value is old[1]


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


class _At:
    """The path of what ``owner`` holds at ``key``, spelled only for a message (a trace
    spells none of the thousands it walks)."""

    __slots__ = ("key", "owner")

    def __init__(self, owner: _Owner, key: Any) -> None:
        self.owner, self.key = owner, key


#: A path: a string, an :class:`_At`, or ``(format, path)`` (the path put in the format).
Path = Any


def _text(path: Path) -> str:
    if isinstance(path, str):
        return path
    if isinstance(path, _At):
        return path.owner.label(path.key)
    return str(path[0].format(_text(path[1])))


@_by_class
def _category(kind: type) -> str:
    """What a value of type ``kind`` is to the walk (one look-up per value: a trace walks
    thousands)."""
    if kind is DrawnSeed:
        return "leaf"
    if kind in _BUILTIN_PLAIN or issubclass(kind, (str, bytes, numbers.Number)):
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


def _owner(value: Any, path: Path, queue: deque[tuple[Any, Path]]) -> _Owner | None:
    """The owner ``value`` is (``path`` names it), or None: a leaf, or something looked
    through (a tuple, a bound method, a partial: what they hold is queued)."""
    kind = type(value)
    category = _category(kind)
    if category == "object":
        if _origin(kind.__module__) == "user":        # its class: methods, class attributes
            queue.append((kind, path))
        return _Owner(value, functools.partial(_object_entries, value),
                      lambda k: f"{_describe_object(value, _text(path))} attribute {k!r}")
    if category == "container":
        noun = ("key {!r}" if isinstance(value, dict) else
                "member {}" if isinstance(value, set) else "item {}")
        name = kind.__name__

        def label(k: Any) -> str:
            shown = _show(k) if isinstance(value, set) else k
            return f"{noun.format(shown)} of the {name} in {_text(path)}"

        return _Owner(value, functools.partial(_container_entries, value), label)
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
        return _Owner(value, _namespace_entries(value),
                      lambda k: f"{k[0]} {k[1]!r} of {qualname}")
    elif category == "class" and _origin(getattr(value, "__module__", "") or "") == "user":
        return _Owner(value, functools.partial(_class_entries, value),
                      lambda k: f"class attribute {value.__name__}.{k}")
    elif category == "opaque":
        wrapped = getattr(value, "__wrapped__", None)
        if wrapped is not None:
            queue.append((wrapped, path))             # a traced function: what it traces
    return None


# --- the watch -----------------------------------------------------------------------------
class StateWatch:
    """The Python state a traced call can reach, as it was before the call (see the module
    docstring); :meth:`refusal` says what the call changed."""

    def __init__(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.owners: dict[int, _Owner] = {}
        #: (owner id, key) -> the entry's value after a call kept whole changed it
        self.exempt: dict[tuple[int, Any], Fingerprint] = {}
        self._kept: list[Any] = []        # (what the exemptions name stays alive)
        self._budget = [MAX_SNAPSHOT_BYTES]
        roots: list[tuple[Any, Path]] = [(fn, "the traced function")]
        roots += [(a, f"argument {i}") for i, a in enumerate(args)]
        roots += [(v, f"argument {k!r}") for k, v in kwargs.items()]
        self._walk(roots, self.owners)

    def _walk(self, roots: list[tuple[Any, Path]], owners: dict[int, _Owner]) -> None:
        queue = deque(roots)
        while queue:
            value, path = queue.popleft()
            if id(value) in owners:
                continue
            owner = _owner(value, path, queue)
            if owner is None:
                continue
            owners[id(value)] = owner
            entries = _read(owner)
            owner.entries = {k: _fingerprint(v, self._budget) for k, v in entries.items()}
            queue.extend((child, _At(owner, key)) for key, child in entries.items()
                         if type(child) not in _BUILTIN_PLAIN)

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
            now = _read(owner)
            for entry in owner.entries.keys() | now.keys():
                old, value = owner.entries.get(entry), now.get(entry, _MISSING)
                if old is None or value is _MISSING or not unchanged(old, value):
                    self.exempt[(key, entry)] = (_REMOVED if value is _MISSING else
                                                 _fingerprint(value, [MAX_ARRAY_BYTES]))
                    self._kept.append(owner.obj)

    # the end of the trace ---------------------------------------------------------------------
    def changes(self, steps: Sequence[Any] = ()) -> list[str]:
        """What the traced call changed, one phrase each, in the order the state was found.
        ``steps``: the recorded program's; an array given to one of its kernels as a constant
        (a slot updated in place) is written again by each replay."""
        operands = _constant_operands(steps)
        out: list[str] = []
        for key, owner in self.owners.items():
            now = _read(owner)
            for entry in [*owner.entries, *(k for k in now if k not in owner.entries)]:
                old = owner.entries.get(entry)
                value = now.get(entry, _MISSING)
                gone = value is _MISSING
                if old is not None and not gone and (
                        unchanged(old, value) or (old[0] == "a" and id(old[1]) in operands)):
                    continue
                exempt = self.exempt.get((key, entry))
                if exempt is not None and (exempt is _REMOVED if gone else
                                           exempt is not _REMOVED and unchanged(exempt, value)):
                    continue
                label = owner.label(entry)
                if old is None:
                    out.append(f"{label} was added ({_show(value)})")
                elif gone:
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
        return tuple(_value_of(f) for f in fingerprint[2])
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
