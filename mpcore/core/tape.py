"""GradientTape: reverse-mode autodiff over the ops run while it is active.

Ops report to every active tape of the current thread; a tape records an op only when one of
its inputs is watched (a trainable Variable it saw, a tensor passed to ``watch``, or the output of
an op it recorded), so work outside the model's graph costs nothing. Gradient formulas live in
the family modules of :mod:`mpcore.ops`, next to their ops, so they run on any backend.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from mpcore.core.tensor import Tensor, Variable


class _State(threading.local):
    def __init__(self) -> None:
        self.tapes: list[GradientTape] = []
        # Bumped whenever the set of active tapes changes; keys Variable.read_as caches so a
        # cast recorded by one tape is never reused under another.
        self.generation = 0


#: The active tapes of this thread (``state.tapes``): ops check it before recording.
state = _State()


def generation() -> int:
    return state.generation


def recording() -> bool:
    return bool(state.tapes)


class VariableRead(Tensor):
    """A Variable's value as a recorded op saw it; it stands for the variable in every tape."""

    __slots__ = ("variable",)

    def __init__(self, variable: Variable) -> None:
        super().__init__(variable._data, variable._backend, variable._dtype)
        self.variable = variable


class Node:
    """One recorded op: what ran, on what, and what came out."""

    __slots__ = ("attrs", "input_ids", "inputs", "op", "output", "saved")

    def __init__(self, op: str, inputs: tuple[Any, ...], input_ids: tuple[int | None, ...],
                 output: Tensor, attrs: dict[str, Any], saved: Any) -> None:
        self.op = op
        self.inputs = inputs
        self.input_ids = input_ids
        self.output = output
        self.attrs = attrs
        self.saved = saved


def record(op: str, inputs: tuple[Any, ...], output: Tensor, attrs: dict[str, Any] | None = None,
           saved: Any = None) -> None:
    """Called by the op layer after an op ran (only when a tape is active)."""
    for tape in state.tapes:
        tape._record(op, inputs, output, attrs or {}, saved)


class GradientTape:
    """Records ops for differentiation, as ``tf.GradientTape``.

    >>> import mpcore as mp
    >>> x = mp.Variable([1.0, 2.0])
    >>> with mp.GradientTape() as tape:
    ...     y = mp.ops.sum(x * x)
    >>> tape.gradient(y, x).numpy().tolist()
    [2.0, 4.0]
    """

    def __init__(self, persistent: bool = False, watch_accessed_variables: bool = True) -> None:
        self._persistent = persistent
        self._auto_watch = watch_accessed_variables
        self._nodes: list[Node] = []
        self._watched: set[int] = set()
        self._keep: dict[int, Tensor] = {}   # watched tensors and variables, kept alive
        self._used = False

    # --- context ------------------------------------------------------------------------
    def __enter__(self) -> GradientTape:
        state.tapes.append(self)
        state.generation += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        self._pop()

    def _pop(self) -> None:
        tapes = state.tapes
        for i in range(len(tapes) - 1, -1, -1):
            if tapes[i] is self:
                del tapes[i]
                break
        state.generation += 1

    @contextlib.contextmanager
    def stop_recording(self) -> Iterator[None]:
        """Ops inside this block are not recorded by this tape."""
        active = self in state.tapes
        if active:
            self._pop()
        try:
            yield
        finally:
            if active:
                state.tapes.append(self)
                state.generation += 1

    def reset(self) -> None:
        self._nodes.clear()
        self._watched.clear()
        self._keep.clear()
        self._used = False

    def watch(self, tensor: Any) -> None:
        for t in _flatten(tensor):
            if not isinstance(t, Tensor):
                raise TypeError(f"GradientTape.watch takes tensors, got {type(t).__name__}")
            self._watched.add(id(t))
            self._keep[id(t)] = t

    def watched_variables(self) -> list[Variable]:
        return [t for t in self._keep.values() if isinstance(t, Variable)]

    # --- recording ----------------------------------------------------------------------
    def _record(self, op: str, inputs: tuple[Any, ...], output: Tensor, attrs: dict[str, Any],
                saved: Any) -> None:
        watched = self._watched
        hit = False
        ids: list[int | None] = []
        values: list[Any] = []
        for x in inputs:
            if not isinstance(x, Tensor):
                ids.append(None)
                values.append(x)
                continue
            if isinstance(x, Variable):
                ix = id(x)
                if ix not in watched and self._auto_watch and x.trainable:
                    watched.add(ix)
                    self._keep[ix] = x
                # The value the op saw, not whatever the variable holds when we backprop.
                values.append(VariableRead(x))
            elif type(x) is VariableRead:
                # A gradient computed from a recorded read is a function of the variable
                # itself: outer tapes must see it so (second-order derivatives).
                var = x.variable
                ix = id(var)
                if ix not in watched and self._auto_watch and var.trainable:
                    watched.add(ix)
                    self._keep[ix] = var
                values.append(x)
            else:
                ix = id(x)
                values.append(x)
            ids.append(ix)
            if ix in watched:
                hit = True
        if hit:
            self._nodes.append(Node(op, tuple(values), tuple(ids), output, attrs, saved))
            watched.add(id(output))

    # --- differentiation ----------------------------------------------------------------
    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: str = "none") -> Any:
        """d(sum of targets)/d(sources), in the structure of ``sources`` (a tensor, a list,
        a tuple or a dict). Unconnected sources get None, or zeros with
        ``unconnected_gradients="zero"``."""
        from mpcore import ops
        from mpcore.ops.backprop import backprop

        if unconnected_gradients not in ("none", "zero"):
            raise ValueError("unconnected_gradients must be 'none' or 'zero', "
                             f"got {unconnected_gradients!r}")
        if self._used and not self._persistent:
            raise RuntimeError("a non-persistent GradientTape can compute gradients only once; "
                               "use GradientTape(persistent=True)")
        self._used = True
        targets = _flatten(target)
        flat_sources = _flatten(sources)
        for s in flat_sources:
            if not isinstance(s, Tensor):
                raise TypeError(f"gradient sources must be tensors or variables, got {s!r}")
        if output_gradients is None:
            seeds = [None] * len(targets)
        else:
            seeds = _flatten(output_gradients)
            if len(seeds) != len(targets):
                raise ValueError(f"{len(seeds)} output_gradients for {len(targets)} targets")
        # A source this tape never watched has no gradient (as in TF), even when a recorded
        # op used it alongside a watched tensor.
        watched = self._watched
        live = [s for s in flat_sources if id(s) in watched]
        with self.stop_recording():
            live_grads = iter(backprop(self._nodes, targets, seeds, live))
            grads = [next(live_grads) if id(s) in watched else None for s in flat_sources]
            if unconnected_gradients == "zero":
                grads = [ops.zeros_like(s) if g is None else g
                         for g, s in zip(grads, flat_sources)]
        if not self._persistent:
            self._nodes = []
        return _unflatten(sources, grads)

    def __del__(self) -> None:
        if state.tapes and self in state.tapes:
            self._pop()


def _flatten(structure: Any) -> list[Any]:
    if isinstance(structure, dict):
        return [v for k in structure for v in _flatten(structure[k])]
    if isinstance(structure, (list, tuple)):
        return [v for item in structure for v in _flatten(item)]
    return [structure]


def _unflatten(structure: Any, flat: list[Any]) -> Any:
    return _build(structure, iter(flat))


def _build(s: Any, it: Any) -> Any:
    # Not a closure over itself: that is a reference cycle holding ``flat`` (every gradient)
    # until the cyclic GC runs, so large gradient arrays were freed late and at random.
    if isinstance(s, dict):
        return {k: _build(v, it) for k, v in s.items()}
    if isinstance(s, (list, tuple)):
        return type(s)(_build(v, it) for v in s)
    return next(it)
