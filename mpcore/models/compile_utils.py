"""What ``compile`` makes of ``loss``, ``loss_weights`` and ``metrics`` for a model of one or
several outputs (Keras 3's ``trainers/compile_utils.py``): one loss per output, weighted and
summed, and each metric bound to an output.

- ``loss``: one loss (a name, a Loss or a function), used for every output; a list or tuple
  with one entry per output (None: no loss for that output); or a dict keyed by output name.
- ``loss_weights``: None (1.0 each), a list with one number per output, or a dict by name.
- ``metrics``: a list (each metric on every output; a Metric instance only with one output), a
  list of lists (one list per output), or a dict by output name (a metric or a list).
- ``y`` (and a step's ``y_pred``): the array (one output), or a list or tuple in the outputs'
  order, or a dict keyed by output name.

With several outputs, Keras 3's log names: ``loss`` (the weighted total), ``<output>_loss``
for each output with a loss, and ``<output>_<metric>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mpcore import ops
from mpcore.core.tensor import Tensor
from mpcore.layers.base import flatten
from mpcore.losses import losses as _losses
from mpcore.metrics import metrics as _metrics


def _by_output(what: str, spec: Any, names: list[str], single_ok: bool) -> list[Any]:
    """``spec`` as one entry per output: a list or tuple of that length, a dict by name, or
    (``single_ok``) one value for every output."""
    n = len(names)
    if isinstance(spec, dict):
        unknown = [k for k in spec if k not in names]
        if unknown:
            raise ValueError(f"{what} names outputs {unknown}; the model's outputs are "
                             f"{names}")
        return [spec.get(name) for name in names]
    if isinstance(spec, (list, tuple)):
        if len(spec) != n:
            raise ValueError(f"{what} has {len(spec)} entries but the model has {n} outputs "
                             f"({', '.join(names)}): give one per output, or a dict by name")
        return list(spec)
    if not single_ok:
        raise ValueError(f"{what} must be a list or a dict by output name for a model of {n} "
                         f"outputs ({', '.join(names)}), got {spec!r}")
    return [spec] * n


def outputs_list(values: Any, names: list[str], what: str) -> list[Any]:
    """``y`` or ``y_pred`` as a list in the outputs' order."""
    if len(names) == 1:
        if isinstance(values, dict):
            return [values[names[0]]] if names[0] in values else list(values.values())[:1]
        flat = flatten(values)
        return [values if len(flat) == 1 else flat[0]]
    if isinstance(values, dict):
        missing = [n for n in names if n not in values]
        if missing:
            raise ValueError(f"{what} lacks outputs {missing}; the model's outputs are {names}")
        return [values[n] for n in names]
    if isinstance(values, (list, tuple)) and len(values) == len(names):
        return list(values)
    raise ValueError(f"{what} must hold one array per output ({', '.join(names)}): a list "
                     f"in that order or a dict by name, got {type(values).__name__}")


class CompileLoss:
    """The compiled loss: ``loss(y, y_pred, sample_weight=None)`` is the weighted sum of each
    output's loss; :attr:`last` holds each output's own loss of the last call (for its
    ``<output>_loss`` log)."""

    #: Each call's own per-output losses, read by the same step right after (its output loss
    #: trackers) and by nothing later: a replay's come from its program, so a traced step may
    #: leave the trace's there (mpcore.tracing.python_state).
    _trace_ignored_attributes = ("last",)

    def __init__(self, loss: Any, loss_weights: Any, names: list[str]) -> None:
        self.names = names
        specs = _by_output("loss", loss, names, single_ok=True)
        self.losses = [None if s is None else _losses.get(s) for s in specs]
        if all(x is None for x in self.losses):
            raise ValueError("loss gives no loss for any output")
        weights = [1.0] * len(names) if loss_weights is None else _by_output(
            "loss_weights", loss_weights, names, single_ok=False)
        for w in weights:
            if w is not None and (isinstance(w, bool) or not isinstance(w, (int, float))):
                raise ValueError(f"loss_weights must be numbers, got {w!r}")
        self.weights = [1.0 if w is None else float(w) for w in weights]
        self.name = "loss" if len(names) > 1 else self.losses[0].name  # type: ignore[union-attr]
        self.last: list[Tensor | None] = []

    @property
    def output_loss_names(self) -> list[str]:
        """``<output>_loss`` for each output with a loss, when there are several outputs."""
        if len(self.names) == 1:
            return []
        return [f"{n}_loss" for n, loss in zip(self.names, self.losses) if loss is not None]

    def __call__(self, y: Any, y_pred: Any, sample_weight: Any = None) -> Tensor:
        ys = outputs_list(y, self.names, "y")
        preds = outputs_list(y_pred, self.names, "the model's outputs")
        # one array for every output, or one per output (a list or a dict by name), as Keras 3
        per_output = len(self.names) > 1 and isinstance(sample_weight, (list, tuple, dict))
        weights = (_by_output("sample_weight", sample_weight, self.names, single_ok=True)
                   if per_output else [sample_weight] * len(self.names))
        total: Tensor | None = None
        self.last = []
        for loss, w, yt, yp, sw in zip(self.losses, self.weights, ys, preds, weights):
            if loss is None:
                self.last.append(None)
                continue
            value = loss(yt, yp, sw)
            self.last.append(value)
            term = value if w == 1.0 else ops.multiply(value, w)
            total = term if total is None else ops.add(total, term)
        assert total is not None
        return total

    def __repr__(self) -> str:
        return f"<CompileLoss outputs={self.names}>"


def compile_metrics(metrics: Any, loss: CompileLoss | None, names: list[str]) -> list[Any]:
    """The compiled metrics, each with ``output`` (its output's index) and, with several
    outputs, named ``<output>_<metric>``."""
    if metrics is None:
        return []
    if isinstance(metrics, str) or callable(metrics):  # a Metric is callable too
        metrics = [metrics]
    if not isinstance(metrics, (list, tuple, dict)):
        raise ValueError("metrics must be a metric (a name, an mp.metrics.Metric or a "
                         f"function), a list of them, or a dict by output name; got {metrics!r}")
    n = len(names)
    per_output: list[Sequence[Any]]
    # one list per output (a dict, or a list of lists), else every metric on every output
    shared = not (isinstance(metrics, dict) or (n > 1 and len(metrics) == n and all(
        isinstance(m, (list, tuple)) or m is None for m in metrics)))
    if shared:
        per_output = [list(metrics)] * n
    else:
        per_output = [[] if m is None else (list(m) if isinstance(m, (list, tuple)) else [m])
                      for m in _by_output("metrics", metrics, names, single_ok=False)]
    out: list[Any] = []
    for i, (name, specs) in enumerate(zip(names, per_output)):
        for spec in specs:
            if shared and n > 1 and isinstance(spec, _metrics.Metric):
                raise ValueError(f"metric {spec.name!r} is one object for every output: give "
                                 "names, or a list of metrics per output")
            # "accuracy" picks the accuracy its output's loss calls for, as Keras does
            metric = _metrics.get(spec, None if loss is None else loss.losses[i])
            if n > 1:
                metric.name = f"{name}_{metric.name}"
            metric.output = i
            out.append(metric)
    seen = [m.name for m in out]
    loss_names = [] if loss is None else loss.output_loss_names
    if len(set(seen)) != len(seen) or "loss" in seen or set(seen) & set(loss_names):
        raise ValueError(f"metric names must be unique and not 'loss', got {seen}")
    return out
