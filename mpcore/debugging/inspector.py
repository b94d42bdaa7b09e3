"""``inspect_numerics``: one float32 training step of a model, every op of its forward and
backward pass watched and measured against the 16- and 8-bit formats a user might train in.

How it watches: the same per-op hook as ``enable_check_numerics`` (dispatch calls it with every
op's inputs and output), layers naming themselves with :func:`~mpcore.layers.scopes.
layer_scope`, and a scope around each recorded node's backward ops (``backprop.node_scope``), so
a gradient op is named after the layer of the forward op it differentiates; only the ops of the
thread that inspects are watched, and tensors are told apart by identity (a weak reference
beside each ``id()``, which a dead tensor hands on). Every op's output is read to the host once
and reduced to a :class:`~mpcore.debugging.formats.Measurement`; no values are kept. The model
computes in float32 for the inspection (each layer's policy is swapped for float32 and restored
afterwards), so the figures say what *would* happen in each format, and the first op to produce
an Inf or NaN is found in float32 itself.

The step draws from the random stream (dropout runs with ``training=True``) and changes no
weights.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
import warnings
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from mpcore.core import dtypes as _dtypes
from mpcore.core.categories import CLEAR
from mpcore.core.tape import GradientTape, Node, VariableRead
from mpcore.core.tensor import Tensor, Variable
from mpcore.debugging import formats as _formats
from mpcore.debugging.report import NumericsReport, OpRecord
from mpcore.layers.base import Layer, flatten, no_tapes
from mpcore.layers.scopes import layer_path
from mpcore.losses import losses as _losses
from mpcore.mixed_precision import policy as _policy
from mpcore.models.data import count, to_device
from mpcore.ops import backprop as _backprop
from mpcore.ops import dispatch as _dispatch

DEFAULT_DTYPES = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")

#: The layer a node's backward ops are charged to, while backprop runs them.
_backward_of: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mpcore_backward_of", default=None)
_region: contextvars.ContextVar[str] = contextvars.ContextVar("mpcore_region", default="")


def inspect_numerics(model: Any, x: Any, y: Any,
                     dtypes: Sequence[str] = DEFAULT_DTYPES,
                     loss: Any = None, float8_recipe: Any = None) -> NumericsReport:
    """Run one forward and backward step of ``model`` on ``(x, y)`` in float32 and report, per
    op and per layer, what each format in ``dtypes`` would do to its values, the first op that
    produced a non-finite value, the window of safe loss scales and a suggested dtype per layer.

    ``x`` and ``y`` are what ``fit`` takes (arrays, tensors, or lists/dicts of them for a model
    of several inputs). ``loss`` is a loss (name, function or :class:`~mpcore.losses.Loss`); by
    default the loss the model was compiled with. ``dtypes`` are names from
    :data:`~mpcore.debugging.formats.FORMATS`. A model not built yet is built first, by a call
    in its own policy that is not inspected.

    ``float8_recipe`` (a CurrentScaling or DelayedScaling, or a serialized one) adds the FP8
    view (``report.float8_gemms``, ``report.float8_table()``): each GEMM operand, scaled as
    the recipe would, and the share of its values that FP8 saturates or flushes to zero
    (:mod:`mpcore.debugging.float8_gemms`)."""
    if not isinstance(model, Layer):
        raise TypeError(f"inspect_numerics needs an mp.Model (or an mp.layers.Layer), got "
                        f"{type(model).__name__}")
    chosen = _formats_of(dtypes)
    loss_fn = _loss_of(model, loss)
    x, y = to_device(x), to_device(y)
    batch = count(x, "x")
    if batch == 0:
        raise ValueError("inspect_numerics got no samples: x is empty")
    if not model.built:
        with no_tapes():
            model(x, training=False)
    recipe = None
    if float8_recipe is not None:
        from mpcore.mixed_precision import recipes

        recipe = recipes.get(float8_recipe)
    watcher = _Watcher(chosen, recipe)
    start = time.perf_counter()
    with _float32(model) as pinned, watcher.watching(), warnings.catch_warnings():
        # the arrays' own warnings about the Inf/NaN they compute: the report counts those
        warnings.simplefilter("ignore", RuntimeWarning)
        with GradientTape() as tape:
            with _in_region("model"):
                y_pred = model(x, training=True)
            with _in_region("loss"):
                value = loss_fn(y, y_pred)
        tape.gradient(value, list(model.trainable_variables))
    seconds = time.perf_counter() - start
    for record in watcher.records:
        record.pinned = record.layer in pinned
    report = NumericsReport(
        model=model.name, batch=batch, dtypes=tuple(f.name for f in chosen),
        ops=watcher.records, seconds=seconds, pinned=sorted(pinned),
        data_nonfinite=sum(_nonfinite(t) for t in flatten(x) if _dtypes.is_floating(t.dtype)),
        variables_nonfinite=[v.name for v in model.weights if _nonfinite(v)])
    report.float8_gemms = watcher.float8
    return report


def _formats_of(dtypes: Any) -> list[_formats.Format]:
    if isinstance(dtypes, str):
        dtypes = (dtypes,)
    if not isinstance(dtypes, (list, tuple)):
        raise ValueError(f"inspect_numerics: dtypes must be a name or a tuple of names from "
                         f"{', '.join(_formats.FORMATS)}; got {dtypes!r}")
    chosen = [_formats.get(d) for d in dtypes]
    if not chosen:
        raise ValueError(f"inspect_numerics needs at least one dtype: choose from "
                         f"{', '.join(_formats.FORMATS)}")
    if len({f.name for f in chosen}) != len(chosen):
        raise ValueError(f"inspect_numerics: dtypes {list(dtypes)} name one twice")
    return chosen


def _loss_of(model: Any, loss: Any) -> Any:
    if loss is not None:
        return _losses.get(loss)
    compiled = getattr(model, "loss", None)
    if compiled is None:
        raise ValueError(f"inspect_numerics: model {model.name!r} has no compiled loss; pass "
                         "loss= (a name such as 'sparse_categorical_crossentropy', a function "
                         "or an mp.losses.Loss) or compile the model first")
    return compiled


@contextlib.contextmanager
def _in_region(name: str) -> Iterator[None]:
    token = _region.set(name)
    try:
        yield
    finally:
        _region.reset(token)


def _all_layers(layer: Any) -> Iterator[Any]:
    yield layer
    for sub in layer._sublayers():
        yield from _all_layers(sub)


@contextlib.contextmanager
def _float32(model: Any) -> Iterator[set[str]]:
    """Every layer of ``model`` computes in float32 inside (variables keep their dtype). Yields
    the layers pinned to float32: those computing in float32 in a model where others compute
    in 16 bits (``dtype="float32"`` under a mixed policy); in an all-float32 model none is."""
    float32 = _policy.Policy("float32")
    saved = [(layer, layer._dtype_policy) for layer in _all_layers(model)]
    mixed = any(p.compute_dtype != "float32" for _, p in saved)
    pinned = {layer.name for layer, p in saved if mixed and p.compute_dtype == "float32"
              and not layer._sublayers()}
    for layer, _ in saved:
        layer._dtype_policy = float32
    try:
        yield pinned
    finally:
        for layer, policy in saved:
            layer._dtype_policy = policy


@dataclass
class _Watcher:
    formats: list[_formats.Format]
    recipe: Any = None   # an FP8 recipe: its view of the GEMM operands too

    def __post_init__(self) -> None:
        self.records: list[OpRecord] = []
        # Tensors are told apart by identity, and an ``id()`` alone is not one: a temporary of
        # the backward pass (the loss's clip mask, a transposed weight) dies, and CPython hands
        # its address to the next tensor, a gradient as often as not. Whether it does depends
        # on the allocator's free blocks, that is on what ran before in the process, which
        # made the FP8 view flaky (a gradient taken for a value). So each entry keeps a weak
        # reference and counts only while it still points at the very tensor looked up.
        self.layer_of: dict[int, tuple[weakref.ref[Tensor], str]] = {}   # forward output
        # values (forward tensors, and backward ones computed from values only): in a
        # backward GEMM, an operand that is not one is a gradient
        self.values: dict[int, weakref.ref[Tensor]] = {}
        self.float8: list[Any] = []
        self.thread: int | None = None

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        # the hooks are module globals that every thread's ops call; only the inspecting
        # thread's step is the report's (another thread's ops, a data loader's or a test's
        # left running, would be charged to "other" and fill the maps with their tensors)
        self.thread = threading.get_ident()
        saved = _dispatch.numerics_check, _backprop.node_scope
        _dispatch.numerics_check, _backprop.node_scope = self.observe, self.node_scope
        try:
            yield
        finally:
            _dispatch.numerics_check, _backprop.node_scope = saved

    @contextlib.contextmanager
    def node_scope(self, node: Node) -> Iterator[None]:
        if threading.get_ident() != self.thread:
            yield
            return
        entry = self.layer_of.get(id(node.output))
        layer = entry[1] if entry is not None and entry[0]() is node.output else "other"
        token = _backward_of.set(layer)
        try:
            yield
        finally:
            _backward_of.reset(token)

    def observe(self, op: str, inputs: tuple[Any, ...], out: Tensor) -> None:
        if threading.get_ident() != self.thread:
            return
        backward = _backward_of.get()
        if backward is None:
            path = layer_path()
            layer = path[-1] if path else (_region.get() or "other")
            self.layer_of[id(out)] = (weakref.ref(out), layer)
        else:
            layer = backward
        if self.recipe is not None:
            self._float8(op, inputs, out, layer, backward is not None)
        if not _dtypes.is_floating(out._dtype) or out.size == 0:
            return
        measured = _formats.measure(_host(out), self.formats)
        record = OpRecord(index=len(self.records),
                          phase="forward" if backward is None else "backward",
                          op=op, layer=layer, dtype=out.dtype, shape=tuple(out.shape),
                          category=out._backend.categories().get(op, CLEAR).value,
                          measurement=measured)
        if measured.nonfinite:
            floats = [t for t in inputs if isinstance(t, Tensor)
                      and _dtypes.is_floating(t._dtype) and t.size]
            seen = [(t, _formats.measure(_host(t), [])) for t in floats]   # each read once
            record.produced_nonfinite = all(m.nonfinite == 0 for _, m in seen)
            record.input_ranges = [_describe(t, m) for t, m in seen]
        self.records.append(record)

    def _float8(self, op: str, inputs: tuple[Any, ...], out: Tensor, layer: str,
                backward: bool) -> None:
        from mpcore.debugging import float8_gemms as _f8

        tensors = [t for t in inputs if isinstance(t, Tensor)]
        if not backward or all(self._is_value(t) for t in tensors):
            self.values.update((id(t), weakref.ref(t)) for t in (*tensors, out))
        operands = [t for t in inputs[:2] if isinstance(t, Tensor)]
        if op not in _f8.GEMM_OPS or len(operands) < 2:
            return
        # in the backward pass an operand that is not a value is a gradient (also one a fused
        # kernel returned unobserved); the bias gradient's GEMV ones @ g is no FP8 GEMM
        gradient = [backward and not self._is_value(t) for t in operands]
        first = operands[0]
        if backward and first.shape[:1] == (1,) and bool((_host(first) == 1).all()):
            return
        for i, (t, grad) in enumerate(zip(operands, gradient)):
            if _dtypes.is_floating(t._dtype) and t.size:
                fmt, amax, scale, over, under = _f8.measure(_host(t), self.recipe, grad)
                self.float8.append(_f8.Float8Operand(
                    layer, "backward" if backward else "forward", op, i, grad, fmt, amax,
                    scale, over, under))

    def _is_value(self, t: Tensor) -> bool:
        if isinstance(t, (Variable, VariableRead)):
            return True
        ref = self.values.get(id(t))
        return ref is not None and ref() is t


def _host(t: Tensor) -> Any:
    return t._backend.to_host(t._data)


def _nonfinite(t: Tensor) -> int:
    return _formats.count_nonfinite(_host(t))


def _describe(t: Tensor, m: _formats.Measurement) -> str:
    return (f"{t.dtype}{list(t.shape)}: max |x| {m.abs_max:.6g}"
            + (f", {m.nonfinite} non-finite" if m.nonfinite else ""))
