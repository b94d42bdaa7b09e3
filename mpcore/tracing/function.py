"""Traced steps: ``mp.function`` records the kernel calls of a step once and replays them.

The first call with a new signature (input shapes and dtypes, backends, the current backend,
the global policy, the non-tensor arguments by value: numbers, strings, None and containers of
them; other objects by identity) runs the function eagerly while every kernel call is recorded:
which kernel, which arrays it read (an input, a variable, the output of an earlier call, a
captured constant) and which it produced. Later calls with the same signature replay that
program on the new inputs: the kernels are called in the same order on the same kinds of
operands, so a replay computes bit for bit what the eager run would, without the per-op work of
the dispatch (promotion, categories, tape bookkeeping). A new signature traces again, as
``tf.function`` does.

Some calls are kept whole instead of being broken into kernels (:func:`kept_whole`): an
optimizer's ``apply_gradients`` and the loss-scaling steps of a ``LossScaleOptimizer`` where
they hold Python state that changes from step to step (the rate of a user's schedule), so a
replay calls them again, eagerly, on the recorded tensors. SGD, RMSprop, Adam and AdamW with a
constant rate or a built-in schedule, and the loss scale (device variables), are recorded
kernel by kernel. Each seed
the step drew from ``mp.random`` is drawn again at each replay, where eager execution would
draw it.

What a replay could not reproduce is refused while tracing, with a message that says what to
do: a host read of a tensor (``float(t)``, ``t.numpy()``, ``if t:``, a dynamic loss scale's
value), creating variables in any trace but the first (a first trace that creates variables, as
a model's first call does, is run eagerly and not kept; the next call traces again), reading
``mp.random``'s state, computing with a drawn seed (:mod:`mpcore.core.trace_seeds`), an
output a replay could not give back (:mod:`mpcore.tracing.outputs`: an object holding tensors, a
container subclass other than a namedtuple or an OrderedDict), and Python state the step
changes (:mod:`mpcore.tracing.python_state`: an attribute, a container or a global it
reaches). docs/architecture.md lists what a replay takes from each call.
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from mpcore.core import backend as _backend
from mpcore.core import random as _random
from mpcore.core import tape as _tape
from mpcore.core import tensor as _tensor
from mpcore.core import trace_seeds as _seeds
from mpcore.core import user_frames as _user_frames
from mpcore.core.tensor import Tensor, Variable
from mpcore.core.trace_state import TraceError, refuse_host_read, refuse_state_read
from mpcore.core.trace_state import local as _local
from mpcore.mixed_precision import loss_scale as _loss_scale
from mpcore.mixed_precision import trace_hooks as _hooks
from mpcore.ops import dispatch as _dispatch
from mpcore.tracing import effects as _effects
from mpcore.tracing import outputs as _outputs
from mpcore.tracing import python_state as _python_state
from mpcore.tracing import signature as _args
from mpcore.tracing.program import (
    NONE,
    Assign,
    DictOf,
    Program,
    WholeCall,
    fold_constants,
    weakened,
)
from mpcore.tracing.recorder import Recorder
from mpcore.tracing.signature import value_key

__all__ = ["Function", "TraceError", "function", "in_kept_whole", "in_traced_step", "kept_whole",
           "on_replay", "recording_kernels", "value_key"]


# --- tracing ------------------------------------------------------------------------------------
def in_traced_step() -> bool:
    """Whether a traced step is being recorded or replayed here. A call kept whole returns
    device values then, not Python ones: a Python value would be the first call's forever."""
    return _local.recorder is not None or _local.replaying > 0


def kept_whole(method: Callable[..., Any] | None = None, *,
               unless: str | None = None) -> Any:
    """Record calls of ``method`` as one call that each replay makes again, eagerly (for
    methods whose Python state changes between steps: optimizer updates, loss scaling).

    ``unless`` names a method of the instance (the first argument) that says when a call may be
    recorded kernel by kernel instead: it returns None (keep the call whole) or a guard value,
    which the trace then depends on (called again at every call of the traced function, as part
    of its signature: another value traces again); such a call records its own per-step Python
    work with :func:`on_replay`."""
    if method is None:
        return functools.partial(kept_whole, unless=unless)

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        recorder = _local.recorder
        if recorder is None or recorder.whole_depth:
            return method(*args, **kwargs)
        if unless is not None:
            # the guard runs at every call, and a call recorded kernel by kernel records its
            # Python work with on_replay: what they change, each replay changes again
            with _python_state.watching_whole(recorder.state, args, kwargs):
                check = getattr(args[0], unless)
                if check() is not None:
                    recorder.guards.setdefault(check, None)
                    return method(*args, **kwargs)
        # an iterator argument (zip(grads, variables)) is read once: keep what it gave
        args = tuple(list(a) if _is_iterator(a) else a for a in args)
        spec = recorder.tensor_spec(args), recorder.tensor_spec(kwargs)
        if recorder.held is not None:   # a pre-pass: what the call writes is not seen
            recorder.held.whole_call()
        recorder.whole_depth += 1
        try:
            with _python_state.watching_whole(recorder.state, args, kwargs):
                out = method(*args, **kwargs)
        finally:
            recorder.whole_depth -= 1
        # why (an instance's ``kept_whole_reason()``, where it says), shown by fn.graph
        why = getattr(args[0], "kept_whole_reason", None) if args else None
        reason = why() if callable(why) and unless is not None else None
        step = WholeCall(method, *spec, recorder.tensor_bind(out),  # type: ignore[arg-type]
                         f"{method.__qualname__}(...)  [kept whole]"
                         + (f"  ({reason})" if reason else ""))
        recorder.steps.append(step)
        recorder.anchor(step)
        return out

    return wrapper


def recording_kernels() -> bool:
    """Whether kernel calls made here are being recorded one by one (a trace, outside any call
    kept whole)."""
    recorder = _local.recorder
    return recorder is not None and not recorder.whole_depth


def on_replay(fn: Callable[..., Any], *args: Any) -> None:
    """While recording kernel by kernel: add a call of ``fn(*args)`` that each replay makes at
    this point (the Python state a recorded step changes, e.g. an optimizer's step count; the
    trace has done that work itself). Tensors among ``args`` are the replay's."""
    if not recording_kernels():
        return
    recorder = _local.recorder
    assert recorder is not None
    call = fn
    if hasattr(fn, "__self__"):
        # a method: the program does not keep its object alive (a function given optimizers
        # as arguments would otherwise hold every one it saw)
        method = weakref.WeakMethod(fn)

        def call(*args: Any) -> Any:
            bound = method()
            return None if bound is None else bound(*args)

        call.__wrapped__ = fn.__func__  # type: ignore[attr-defined]
    text = f"{getattr(fn, '__qualname__', fn)}(...)  [on each replay]"
    recorder.steps.append(WholeCall(call, recorder.tensor_spec(args),  # type: ignore[arg-type]
                                    DictOf((), ()), NONE, text))


def _is_iterator(value: Any) -> bool:
    return hasattr(value, "__next__") and not isinstance(value, (Tensor, str, bytes))


_hooks_lock = threading.Lock()
_tracing = 0


def _kernel_view(backend: Any, table: dict[str, Callable[..., Any]]) -> dict[str, Any]:
    recorder = _local.recorder
    return table if recorder is None else recorder.table(backend, table)


def _install_hooks() -> None:
    global _tracing
    with _hooks_lock:
        _tracing += 1
        if _tracing == 1:
            _backend.set_kernel_view(_kernel_view)
            _tensor.host_read_guard, _tensor.variable_hook = refuse_host_read, _on_variable
            _random.draw_hook, _random.state_hook = _seeds.next_seed_recorded, on_replay
            _random.state_read_hook = refuse_state_read
            _loss_scale.read_hook = refuse_host_read


def _remove_hooks() -> None:
    global _tracing
    with _hooks_lock:
        _tracing -= 1
        if _tracing == 0:
            _random.draw_hook = _random.state_hook = None
            _random.state_read_hook = _loss_scale.read_hook = None
            _backend.set_kernel_view(None)
            _tensor.host_read_guard = _tensor.variable_hook = None


def _on_variable(variable: Variable, event: str, replaced: Any) -> None:
    recorder = _local.recorder
    if recorder is None:
        return
    held = recorder.held
    if held is not None:
        # a pre-pass: the variable's array before its first write, to be put back
        if event == "create":
            held.created(variable)
        else:
            held.assigned(variable, replaced)
    if recorder.whole_depth:
        # assigned inside a call kept whole (which each replay makes again): a later read of
        # the variable in the step reads its array then, not the trace's as a constant
        if event != "create":
            recorder.variable_of[id(variable._data)] = variable
            recorder.retire(replaced, variable, None)   # anchored at the call's step
        return
    if event == "create":
        recorder.created.append(variable.name)
        recorder.created_trainable = recorder.created_trainable or variable.trainable
        recorder.variable_of[id(variable._data)] = variable
        return
    # the value's spec before the array is the variable's (it would read as the variable)
    assign = Assign(variable, recorder.spec(variable._data), f"assign {variable.name}")
    recorder.variable_of[id(variable._data)] = variable
    recorder.steps.append(assign)
    # the array the variable held until now, should the step read it later (a value taken
    # with current_value() before the assignment): each replay's, not the trace's
    recorder.retire(replaced, variable, assign)


def in_kept_whole() -> bool:
    """Whether a call kept whole is running inside a trace (its ops are not the step's graph)."""
    recorder = _local.recorder
    return recorder is not None and recorder.whole_depth > 0


class Function:
    """A function whose calls replay a recorded kernel program (see the module docstring)."""

    #: Not looked into for Python state a trace changes (its own tracing count, programs):
    #: what it traces, its ``__wrapped__``, is (mpcore.tracing.python_state).
    _trace_opaque = True

    def __init__(self, fn: Callable[..., Any], fallback: bool = False,
                 key: Callable[[], Any] | None = None) -> None:
        functools.update_wrapper(self, fn)
        if not hasattr(self, "__name__"):      # a callable object: named in messages by its type
            self.__name__ = type(fn).__name__
        self._fn = fn
        self._fallback = fallback
        #: More of the signature, computed at each call (a model: its trainable variables).
        self._key = key
        #: Why this function runs eagerly (``fallback=True`` and a trace was refused), or None.
        self.eager_reason: str | None = None
        #: The programs by signature: a runner, or where its traces depend on guards (an
        #: optimizer's hyperparameters, when its update is recorded kernel by kernel) the
        #: runners by the guards' values (:class:`_Guarded`: each signature its own guards).
        self._runners: dict[tuple[Any, ...], Any] = {}
        self._traced_once = False
        #: How many traces were made (a first trace that created variables counts).
        self.tracing_count = 0
        self._last: Program | None = None

    @property
    def graph(self) -> Program | None:
        """The program of the latest trace (``print`` it: one line per kernel call)."""
        return self._last

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        return self if instance is None else functools.partial(self.__call__, instance)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if (_local.recorder is not None or self.eager_reason is not None
                or _dispatch.numerics_check is not None or _tape.state.tapes):
            # inlined in another trace, given up on, every op being checked, or called under
            # a GradientTape (a replay is not recorded on tapes: gradients must flow)
            return self._fn(*args, **kwargs)
        plain = not kwargs and all(type(a) is Tensor for a in args)
        if plain:
            tensors = list(args)              # plain tensors (not variables): as they are
        else:
            args, kwargs = _args.as_tensors(args), _args.as_tensors(kwargs)
            tensors = _args.tensors((args, kwargs))
        signature = _args.signature(args, kwargs, tensors, plain)
        if self._key is not None:
            signature = (*signature, self._key())
        runner = self._runners.get(signature)
        if type(runner) is _Guarded:
            runner = runner.runners.get(runner.values())
        if runner is not None:
            _local.replaying += 1
            depth = _random.shared_depth()
            try:
                return runner([t._data for t in tensors])
            except BaseException:
                _random.leave_shared_to(depth)   # (a shared() block the step did not leave)
                raise
            finally:
                _local.replaying -= 1
        return self._trace(signature, args, kwargs)

    #: Traces of new signatures after the first before the one warning (tf.function's 5).
    RETRACE_WARNING = 5

    def _warn_if_retracing(self, signature: tuple[Any, ...]) -> None:
        """Warn once, as tf.function does, when a function keeps tracing for new signatures:
        each trace runs the step eagerly and records it (39 batch shapes were 39 silent
        traces). Traces of a signature already seen (variables created, the rewrite's second
        pass, another guard value) are not counted."""
        # hashes: a signature may name the call's objects, which the function holds weakly
        seen = self.__dict__.setdefault("_signatures", set())
        if hash(signature) in seen:
            return
        seen.add(hash(signature))
        retraces = len(seen) - 1
        if retraces != self.RETRACE_WARNING:
            return
        warnings.warn(
            f"{retraces} calls to {self.__name__} triggered mpcore.function retracing (a new "
            f"trace for each of {retraces + 1} signatures). Tracing is expensive and the "
            "excessive number of tracings could be due to (1) creating mp.function repeatedly "
            "in a loop, (2) passing tensors with different shapes or dtypes (each traces "
            "again: pad or bucket the batches to a few shapes), (3) passing Python objects "
            "instead of tensors (each value traces again). For (1), define your mp.function "
            "outside of the loop.", RuntimeWarning, stacklevel=_user_frames.stacklevel())

    def runners(self) -> list[Callable[[list[Any]], Any]]:
        """Every program this function replays (its compiled runners)."""
        return [r for entry in self._runners.values()
                for r in (entry.runners.values() if type(entry) is _Guarded else (entry,))]

    def _trace(self, signature: tuple[Any, ...], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> Any:
        called = (args, kwargs)
        recorder = Recorder()
        recorder.fallback, recorder.first = self._fallback, not self._traced_once
        for variable in _tensor.live_variables():
            recorder.variable_of[id(variable._data)] = variable
        args, kwargs = _args.private_inputs((args, kwargs), {})
        inputs = []
        for t in _args.tensors((args, kwargs)):
            slot = recorder.slot_of.get(id(t._data))
            inputs.append(recorder.new_slot(t._data) if slot is None else slot)
        self.tracing_count += 1
        self._warn_if_retracing(signature)
        session = None if _hooks.trace_hook is None else _hooks.trace_hook(self, signature)
        # a pre-pass (the rewrite recording its float32 op graph) runs on the state as it is,
        # which is put back before the real trace: the first call is a painted step
        held = recorder.held = (_effects.HeldEffects(recorder)
                                if getattr(session, "pre_pass", False) else None)
        # a new tape generation: a cast a variable cached before the trace (Variable.read_as)
        # would be captured as a constant, stale once the variable changes; the trace casts
        # afresh, from the variable, and so does every replay
        _tape.state.generation += 1
        recorder.state = _python_state.StateWatch(self._fn, args, kwargs)
        _local.recorder = recorder
        _install_hooks()
        try:        # (the hooks go whatever raises, the rewrite's session included)
            if session is not None:
                session.begin(recorder)
            try:
                out = self._fn(*args, **kwargs)
                try:
                    output, rebuild = _outputs.spec(recorder, out, self.__name__)
                except _outputs.UnsupportedOutputError as exc:
                    if not recorder.fallback:
                        raise TraceError(str(exc)) from None
                    recorder.refused, output, rebuild = str(exc), NONE, None
            finally:
                if session is not None:
                    session.end()
        finally:
            _local.recorder = None
            _remove_hooks()
            _tape.state.generation += 1
        if recorder.refused is not None and not self._fallback:
            raise TraceError(recorder.refused)      # refused, and the step swallowed it
        if recorder.refused is None and not recorder.created:   # (a trace that is kept)
            recorder.refused = (_seeds.seed_refusal(recorder, self.__name__)
                                or recorder.state.refusal(self.__name__, recorder.steps))
            if recorder.refused is not None and not self._fallback:
                raise TraceError(recorder.refused)
        if recorder.created and self._traced_once:
            recorder.refused = (
                f"{self.__name__} created variables ({', '.join(recorder.created[:3])}) after "
                "its first trace: a replay cannot create them. Create every variable in the "
                "first call (build the model and the optimizer first).")
            if not self._fallback:
                raise TraceError(recorder.refused)
        if recorder.refused is not None:
            self.eager_reason = recorder.refused
            warnings.warn(f"{self.__name__} runs eagerly: {recorder.refused}", RuntimeWarning,
                          stacklevel=_user_frames.stacklevel())
            return out
        # variables were made: run eagerly, trace again. A pre-pass that made only
        # non-trainable ones (an optimizer recorded kernel by kernel makes its slots in its
        # first update) is put back below and the same call traces painted, which makes them
        # again (the pre-pass's Python state, slot tables included, was put back): that trace
        # runs as the variable-creating one, so the first call is still a painted step
        if recorder.created and (held is None or recorder.created_trainable):
            self._traced_once = True
            return out
        self._traced_once = not recorder.created
        kept = session is None or session.keep()
        lines = [step.text for step in recorder.steps]
        program = Program(recorder.steps, recorder.slots, inputs, output,
                          lines if session is None else [*lines, *session.describe()])
        if not kept:                        # the op graph was recorded: trace it painted
            if held is not None and held.restore(recorder.state):
                self.tracing_count -= 1     # (a pre-pass, not a trace of its own)
                return self._trace(signature, *called)
            self._last = program            # state not put back: the next call paints
            return out
        # the backend whose kernels the program calls compiles it (with no tensor input too:
        # a step on variables alone); kernels of several backends: the generic replay
        backends = list(recorder.backends.values())
        compile_program = getattr(backends[0] if len(backends) == 1 else None,
                                  "compile_program", None)
        weak = {id(obj): obj for obj in _args.weak_objects(signature)}
        if weak:   # the call's arguments: held weakly, and the program dropped with them
            program = weakened(program, weak)
        runnable = fold_constants(program)
        program.folded = runnable.folded   # print(graph) marks them
        runner = compile_program(runnable) if compile_program is not None else None
        for obj in weak.values():
            weakref.finalize(obj, _forget, weakref.ref(self), signature)
        runner = runner or runnable.compile()
        if rebuild is not None:
            runner = _outputs.rebuilding(runner, rebuild)
        entry = self._runners.get(signature)
        if recorder.guards or type(entry) is _Guarded:
            # what this trace depends on besides the call: the values of its guards
            if type(entry) is not _Guarded:
                entry = self._runners[signature] = _Guarded()
            entry.add(recorder.guards)
            entry.runners[entry.values()] = runner
        else:
            self._runners[signature] = runner
        self._last = program
        return out


class _Guarded:
    """The programs of one signature whose traces depend on guards (methods called at every
    call, held weakly), by the guards' values: another value traces again."""

    __slots__ = ("guards", "runners")

    def __init__(self) -> None:
        self.guards: list[weakref.WeakMethod[Callable[[], Any]]] = []
        self.runners: dict[tuple[Any, ...], Callable[[list[Any]], Any]] = {}

    def add(self, checks: Any) -> None:
        for check in checks:
            ref = weakref.WeakMethod(check)
            if ref not in self.guards:
                self.guards.append(ref)

    def values(self) -> tuple[Any, ...]:
        return tuple(None if (check := ref()) is None else check() for ref in self.guards)


def _forget(function: weakref.ref[Function], signature: tuple[Any, ...]) -> None:
    """An argument of the call ``signature`` stands for is gone: no call can match it again."""
    fn = function()
    if fn is not None:
        fn._runners.pop(signature, None)


def function(fn: Callable[..., Any] | None = None, *, fallback: bool = False,
             key: Callable[[], Any] | None = None, jit_compile: bool | None = None,
             reduce_retracing: bool = False) -> Any:
    """``@mp.function``: trace ``fn`` on its first call with each signature, replay after.
    ``fallback=True``: where a trace is refused, warn once and run ``fn`` eagerly from then
    on (the refused call itself is an eager run, so nothing is done twice) instead of raising
    TraceError. ``key()``, called at each call, is part of the signature too (what the
    function reads that its arguments do not show, e.g. which variables are trainable).

    ``jit_compile`` and ``reduce_retracing`` are ``tf.function``'s, accepted so that its
    callers run unchanged. ``jit_compile`` (True, False or None) changes nothing: every
    ``mp.function`` records its kernel calls and replays them, which is what True asks for
    (XLA's compiled program) and what False and None keep too (TF's graph without XLA).
    ``reduce_retracing=True`` asks TF to trace with generic shapes; mpcore's programs are
    made for their shapes (a new shape traces again), and a warning says so."""
    if jit_compile is not None and not isinstance(jit_compile, bool):
        raise TypeError(f"jit_compile must be True, False or None, got {jit_compile!r}"
                        + ("; 'auto' is Model.compile's" if jit_compile == "auto" else ""))
    if not isinstance(reduce_retracing, bool):
        raise TypeError(f"reduce_retracing must be True or False, got {reduce_retracing!r}")
    if reduce_retracing:
        warnings.warn("mp.function(reduce_retracing=True): mpcore traces each input shape "
                      "once (its programs are made for their shapes), so calls of new shapes "
                      "trace again as without it", UserWarning,
                      stacklevel=_user_frames.stacklevel())
    if fn is None:
        return functools.partial(function, fallback=fallback, key=key, jit_compile=jit_compile)
    return Function(fn, fallback, key)
