"""Python state a traced step changes: refused, since a replay runs no Python code.

A replay calls the recorded kernels (and the calls kept whole); the step's own Python code runs
only while it is traced. So a step that changes Python state (``self.calls += 1``,
``self.last = x``, ``self.history.append(...)``, ``state["n"] += 1`` on a dict it closes over,
a ``global`` counter) would change it once, at the trace, and never again: eagerly it changes at
every call. ``tf.function`` lets that happen silently; mpcore refuses it with a
:class:`~mpcore.core.trace_state.TraceError` naming the object and the attribute (or, under
``fallback=True``, runs the function eagerly from then on).

How it is seen: before the step runs, :class:`StateWatch` takes a shallow snapshot of the Python
state the step can reach, and after it compares (only for a trace that is kept: a first trace
that creates variables is run eagerly and never replayed, so what it changes is right). So the
refusal comes at the trace's end, as the other refusals only a step's end decides: the call
ran eagerly to its end (its changes made once, as eagerly; under ``fallback`` nothing runs
twice). What is looked at, from the traced callable:

- the object of a bound method (a model's step: the model), the non-tensor arguments, a
  callable object, ``functools.partial``'s function and arguments;
- the globals the function's code names (``co_names`` of its code and of the code nested in
  it) and the variables of its closure, and so for each function of the user's code reached;
- from there, recursively: the attributes (``__dict__`` and ``__slots__``) of objects of
  mpcore's classes (layers, sublayers, metrics, the optimizer, the loss scale) and of the
  user's classes, with the user's classes' own attributes (a counter kept on the class) and
  methods (their globals), but not the objects of the standard library or of installed
  packages (a logger's level cache changes for reasons of its own), unless their class
  derives from one of mpcore's (a layer from a package); and the items of lists,
  dicts, sets and deques (tuples, namedtuples included, are looked through).

An entry (an attribute, a key, an item, a global) has changed when it was added or removed,
or its value differs: numbers, strings, bytes, ``None`` (and tuples of them) by value; anything
else by identity (a tensor stored on an object is the trace's tensor, stale after the first
replay; a seed drawn in the step is the trace's draw). A NumPy array held as an entry is also
compared by its bytes (an update in place), where it is at most 64 KiB and the snapshot's
16 MiB for arrays lasts (a dataset of small arrays in a global: by identity beyond). Containers
over 100 000 items are compared by length only. Variables are not looked into: an ``assign``
is a step of the program, and replays. Also not seen: state kept inside objects of the
standard library or of installed packages (a ``random.Random``, an ``itertools.count``, a
generator's position), and an array inside a tuple changed in place.

What is not refused:

- a change made inside a call kept whole (``function.kept_whole``: the optimizer's
  ``apply_gradients``, the loss scaling), which each replay makes again, and inside a kept
  whole method recorded kernel by kernel, whose per-step Python work is recorded with
  ``on_replay`` (the optimizer's step count and last gradients), and in the guard that
  decides so (called at every call);
- an array that a recorded kernel updates in place (a constant operand of the program: each
  replay writes it again);
- attributes a class declares set once, in ``_trace_set_once_attributes`` (a tuple of names,
  inherited and combined over the class's bases): their first setting, from absent, None or
  False, is what every later eager call leaves as it is, so a replay that does not make it
  changes nothing (a layer's ``built`` flag and build shape, set by its first call, also in a
  step for a layer without weights; the variables an optimizer's ``apply`` keeps for a later
  ``apply(grads)``, rebound only to other variables). Any later change is refused;
- attributes a class declares in ``_trace_ignored_attributes`` (the same way): state a step
  writes and reads itself, which nothing reads after it (the compiled loss's per-output
  losses), or that no call on tensors writes (a layer's input rule, set by its build, and its
  functional-graph nodes). Each declaration says why;
- objects whose class sets ``_trace_opaque = True`` (a traced function, whose ``__wrapped__``
  is looked into instead; the functional graph's KerasTensors and Nodes, which no step
  changes), and tensors, variables, backends, modules, classes and functions of mpcore or of
  packages: entries that hold them compare by identity, and are not looked into.

The snapshot is taken at each trace, never at a replay: replays cost the same as before. For
a ResNet of 179 layers (``benchmarks/trace_python_state.py``: about 700 lists, dicts and
objects watched) the check costs about 7 ms per trace (snapshot ~4 ms, comparison ~2 ms,
around the optimizer's update ~1 ms), under a tenth of the 82 ms its training step takes to
trace on an idle 2-core CPU; a step traces once per signature.
"""

from __future__ import annotations

import contextlib
import gc
import types
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from mpcore.tracing.program import Const, KernelCall, leaves
from mpcore.tracing.reach import (
    BUILTIN_PLAIN,
    MAX_ITEMS,
    MISSING,
    At,
    Owner,
    Path,
    kind_of,
    owner_of,
    read,
    show,
)

__all__ = ["StateWatch", "watching_whole"]

#: NumPy arrays compared by their bytes up to this size (by identity above).
MAX_ARRAY_BYTES = 1 << 16
#: ... and up to this many bytes of them in all (a global list of small arrays: a dataset).
MAX_SNAPSHOT_BYTES = 1 << 24
_REMOVED = object()


# --- comparing values ----------------------------------------------------------------------
def _same(old: Any, new: Any) -> bool:
    """Whether ``new`` stands for the value ``old`` was: the same object, or an equal number,
    string, bytes or None, or a tuple of such (of the same type); a drawn seed by identity
    (the trace's value)."""
    if old is new:
        return True
    kind = type(old)
    if type(new) is not kind:
        return False
    category = "plain" if kind in BUILTIN_PLAIN else kind_of(kind)
    if category == "plain":
        return bool(old == new or (old != old and new != new))    # (NaN)
    if category == "tuple":
        return len(old) == len(new) and all(_same(a, b) for a, b in zip(old, new))
    return False


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """The garbage collector paused while a snapshot is taken or compared: it makes thousands
    of small tuples, each batch of which would start a collection over the whole heap of a
    trace (the step's tensors, the recorder's), several times the snapshot's own cost."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# --- the watch -----------------------------------------------------------------------------
class StateWatch:
    """The Python state a traced call can reach, as it was before the call (see the module
    docstring); :meth:`refusal` says what the call changed."""

    def __init__(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.owners: dict[int, Owner] = {}
        #: (owner id, key) -> the entry's value after a call kept whole changed it
        self.exempt: dict[tuple[int, Any], Any] = {}
        self._kept: list[Any] = []        # (what the exemptions name stays alive)
        #: the state each call kept whole could reach, as it was before the call, in order
        self._before_whole: list[dict[int, Owner]] = []
        self._budget = [MAX_SNAPSHOT_BYTES]
        roots: list[tuple[Any, Path]] = [(fn, "the traced function")]
        roots += [(a, f"argument {i}") for i, a in enumerate(args)]
        roots += [(v, f"argument {k!r}") for k, v in kwargs.items()]
        self._walk(roots, self.owners)

    def _walk(self, roots: list[tuple[Any, Path]], owners: dict[int, Owner]) -> None:
        with _no_collection():
            self._walk_all(deque(roots), owners)

    def _walk_all(self, queue: deque[tuple[Any, Path]], owners: dict[int, Owner]) -> None:
        append, plain, budget = queue.append, BUILTIN_PLAIN, self._budget   # (the hot loop)
        while queue:
            value, path = queue.popleft()
            if id(value) in owners:
                continue
            owner = owner_of(value, path, queue)
            if owner is None:
                continue
            owners[id(value)] = owner
            owner.entries = entries = read(owner)
            for key, child in entries.items():
                kind = type(child)
                if kind in plain:
                    continue
                category = kind_of(kind)
                if category != "leaf":
                    if category != "plain":
                        append((child, At(owner, key)))
                elif kind.__module__ == "numpy" and hasattr(child, "tobytes"):
                    size = getattr(child, "nbytes", MAX_ARRAY_BYTES + 1)
                    if size <= MAX_ARRAY_BYTES and size <= budget[0]:
                        budget[0] -= size
                        owner.arrays[key] = child.tobytes()

    # calls kept whole -------------------------------------------------------------------------
    def before_whole(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[int, Owner]:
        """The state a call kept whole can reach through its arguments, before it runs."""
        owners: dict[int, Owner] = {}
        self._walk([(a, "") for a in args] + [(v, "") for v in kwargs.values()], owners)
        return owners

    def after_whole(self, before: dict[int, Owner]) -> None:
        """What the call changed is made again at each replay: not refused (while it stays
        as the call left it)."""
        self._before_whole.append(before)
        for key, owner in before.items():
            for entry, _old, value, _bytes_differ in _changed(owner):
                self.exempt[(key, entry)] = _REMOVED if value is MISSING else value
                self._kept.append(owner.obj)

    def undo_whole(self) -> bool:
        """Put back what the calls kept whole changed (their entries as before the first of
        them), for a pre-pass whose effects must not stand (:mod:`mpcore.tracing.effects`).
        False, with nothing put back, where a change is not one this can undo: an array
        changed in place, an entry of a class or of a function's globals, a container too
        large to have been read."""
        undo: list[tuple[Owner, Any, Any]] = []
        for before in reversed(self._before_whole):     # newest first: the oldest value wins
            for owner in before.values():
                for entry, old, _value, bytes_differ in _changed(owner):
                    if bytes_differ or not _writable(owner.obj):
                        return False
                    undo.append((owner, entry, old))
        for owner, entry, old in undo:
            _write(owner.obj, entry, old)
        return True

    # the end of the trace ---------------------------------------------------------------------
    def changes(self, steps: Sequence[Any] = ()) -> list[str]:
        """What the traced call changed, one phrase each, in the order the state was found.
        ``steps``: the recorded program's; an array given to one of its kernels as a constant
        (a slot updated in place) is written again by each replay."""
        out: list[str] = []
        with _no_collection():
            self._compare(steps, out)
        return out

    def _compare(self, steps: Sequence[Any], out: list[str]) -> None:
        operands: set[int] | None = None       # (found only where an array changed)
        for key, owner in self.owners.items():
            now = read(owner)
            entries = owner.entries
            for entry in [*entries, *(k for k in now if k not in entries)]:
                old = entries.get(entry, MISSING)
                value = now.get(entry, MISSING)
                gone = value is MISSING
                if (not gone and entry in owner.set_once
                        and (old is MISSING or old is None or old is False)):
                    continue                    # (set by a first call, as eagerly: see above)
                if old is not MISSING and not gone and _same(old, value):
                    before = owner.arrays.get(entry)
                    if before is None or value.tobytes() == before:
                        continue
                    if operands is None:
                        operands = _constant_operands(steps)
                    if id(value) in operands:
                        continue
                exempt = self.exempt.get((key, entry), MISSING)
                if exempt is not MISSING and (exempt is _REMOVED if gone else
                                               exempt is not _REMOVED and _same(exempt, value)):
                    continue
                label = owner.label(entry)
                if old is MISSING:
                    out.append(f"{label} was added ({show(value)})")
                elif gone:
                    out.append(f"{label} was removed")
                elif old is value:
                    out.append(f"{label} ({show(value)}) was changed in place")
                else:
                    out.append(f"{label} changed from {show(old)} to {show(value)}")

    def refusal(self, name: str, steps: Sequence[Any]) -> str | None:
        """The refusal's message for the traced function ``name`` (whose program has
        ``steps``), or None."""
        changes = self.changes(steps)
        if not changes:
            return None
        more = f" (and {len(changes) - 1} more: {'; '.join(changes[1:3])})" if len(
            changes) > 1 else ""
        # a model's step is traced by compile(jit_compile=...), not by an mp.function the
        # user wrote: name the switch they have (Model._step names its steps so)
        untraced = ("compile the model with jit_compile=False (or \"auto\": such a step then "
                    "runs eagerly)" if " step of model " in name
                    else "call the function without mp.function")
        return (f"{changes[0]} while tracing {name}{more}: a replay does not run Python code, "
                "so it would not change it again (and a tensor kept there would stay the "
                "trace's). Keep such state in a mp.Variable (updated with assign), or change "
                f"it outside the step, or {untraced}.")


def _changed(owner: Owner) -> Iterator[tuple[Any, Any, Any, bool]]:
    """The entries of ``owner`` that differ from its snapshot: (entry, old value, value now,
    whether an array's bytes differ from the snapshot's); MISSING where absent."""
    now = read(owner)
    for entry in owner.entries.keys() | now.keys():
        old = owner.entries.get(entry, MISSING)
        value = now.get(entry, MISSING)
        bytes_differ = (entry in owner.arrays and hasattr(value, "tobytes")
                        and value.tobytes() != owner.arrays[entry])
        if old is MISSING or value is MISSING or not _same(old, value) or bytes_differ:
            yield entry, old, value, bytes_differ


def _writable(obj: Any) -> bool:
    """Whether :func:`_write` can put an entry of ``obj`` back: an object's attribute, a
    dict's key, a list's item (not a class, a function's namespace, a set or a deque)."""
    if isinstance(obj, (dict, list)):
        return len(obj) <= MAX_ITEMS          # (a larger one was read as its length alone)
    return not isinstance(obj, (type, types.FunctionType, set, frozenset, deque)) and (
        hasattr(obj, "__dict__") or hasattr(type(obj), "__slots__"))


def _write(obj: Any, entry: Any, old: Any) -> None:
    if isinstance(obj, dict):
        if old is MISSING:
            obj.pop(entry, None)
        else:
            obj[entry] = old
    elif isinstance(obj, list):
        if old is not MISSING:
            while len(obj) <= entry:
                obj.append(None)
            obj[entry] = old
        elif entry < len(obj):
            del obj[entry:]
    elif old is MISSING:
        if hasattr(obj, entry):
            delattr(obj, entry)
    else:
        setattr(obj, entry, old)


def _constant_operands(steps: Sequence[Any]) -> set[int]:
    """The ids of the constants (:class:`~mpcore.tracing.program.Const` leaves) the kernel calls of
    ``steps`` read."""
    return {id(leaf.value) for step in steps if isinstance(step, KernelCall)
            for a in step.inputs for leaf in leaves(a) if type(leaf) is Const}


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
