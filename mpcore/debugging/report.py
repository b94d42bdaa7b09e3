"""The inspector's report: per op and per layer figures, the first op to produce a non-finite
value, the window of safe loss scales and a suggested dtype per layer; a table for people
(``print(report)``), JSON for tools and a plot.

Decisions (where no peer decides for us):

- A layer's figures cover the ops a mixed policy would run in 16 bits: ops of the deny list
  (exp, softmax, cross-entropy, sums) run in float32 under every mixed policy, so their values
  never meet the format; they still count for the first non-finite value.
- Overflow is a fraction of the finite values; subnormal and flush-to-zero are fractions of the
  non-zero ones (a ReLU's zeros are not underflow); the relative error is the worst op's RMS
  rounding error over the values that stay in range.
- A safe loss scale is a power of two at which no gradient value overflows and at most 0.1%
  (``UNDERFLOW_TOLERANCE``) of the non-zero ones fall below the smallest normal. The dynamic
  scaler halves on every overflow and doubles after a run of good steps, so it settles at the
  largest power of two that does not overflow (never below its floor of 1).
- A layer is suggested float32 for a format where its 16-bit ops would overflow at all, or
  where over 1% (``KEEP_FLOAT32_UNDERFLOW``) of their non-zero forward values would underflow
  (gradients are the loss scale's job, not a reason to keep a layer in float32). A layer pinned
  to float32 (``dtype="float32"`` in a mixed model) stays so; one whose float32 values already
  hold Inf/NaN gets no suggestion (None): no dtype cures that, and neither the loss scales
  (no window is given when the float32 backward pass holds Inf/NaN).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from mpcore.core.categories import DENY
from mpcore.debugging import formats as _formats
from mpcore.debugging.formats import Fractions, Measurement

UNDERFLOW_TOLERANCE = 1e-3
KEEP_FLOAT32_UNDERFLOW = 0.01
LARGEST_SCALE_LOG2 = 127      # a loss scale stays a finite float32


@dataclass
class OpRecord:
    """One op of the inspected step."""

    index: int
    phase: str                 # "forward" or "backward"
    op: str
    layer: str                 # the layer it ran in (backward: the layer it differentiates)
    dtype: str
    shape: tuple[int, ...]
    category: str              # allow / deny / infer / clear
    measurement: Measurement
    produced_nonfinite: bool = False
    input_ranges: list[str] = field(default_factory=list)
    pinned: bool = False       # its layer is pinned to float32 (dtype="float32")

    @property
    def in_16_bits(self) -> bool:
        """Whether a mixed policy would compute this op in 16 bits."""
        return self.category != DENY.value and not self.pinned

    def describe(self) -> str:
        return (f"{self.op} (op #{self.index}, {self.phase}) in layer {self.layer!r}, output "
                f"{self.dtype}{list(self.shape)}")


@dataclass(frozen=True)
class LayerSummary:
    """The ops of one layer in one pass that a mixed policy runs in 16 bits, taken together."""

    layer: str
    phase: str
    ops: int
    abs_max: float
    nonfinite: int
    fractions: dict[str, Fractions]


@dataclass(frozen=True)
class LossScaleWindow:
    """For one format, what the backward pass's values (at loss scale 1) allow."""

    dtype: str
    headroom_log2: float | None       # log2(format max / largest gradient value)
    min_scale_log2: int | None
    max_scale_log2: int | None
    settle_scale_log2: int | None
    underflow_at_settle: float
    nonfinite: int = 0                # Inf/NaN values of the float32 backward pass

    @property
    def empty(self) -> bool:
        return (self.min_scale_log2 is not None and self.max_scale_log2 is not None
                and self.min_scale_log2 > self.max_scale_log2)

    @property
    def scaling_needed(self) -> bool:
        return (self.min_scale_log2 or 0) > 0

    def describe(self) -> str:
        if self.nonfinite:
            return (f"none: the float32 backward pass holds {self.nonfinite} Inf/NaN values "
                    "(find where they come from first)")
        if self.headroom_log2 is None:
            return "every gradient value is 0 or non-finite"
        if self.empty:
            return (f"none: overflow above 2^{self.max_scale_log2}, underflow below "
                    f"2^{self.min_scale_log2}")
        window = f"2^{self.min_scale_log2} .. 2^{self.max_scale_log2}"
        return window if self.scaling_needed else f"{window} (1 is safe: scaling not needed)"


def _aggregate(records: list[OpRecord], formats: tuple[str, ...]) -> dict[str, Fractions]:
    finite = [r.measurement.size - r.measurement.nonfinite for r in records]
    nonzero = [sum(r.measurement.exponents.values()) for r in records]
    total, total_nonzero = sum(finite) or 1, sum(nonzero) or 1
    out = {}
    for name in formats:
        fr = [r.measurement.fractions[name] for r in records]
        out[name] = Fractions(
            overflow=sum(f.overflow * n for f, n in zip(fr, finite)) / total,
            subnormal=sum(f.subnormal * n for f, n in zip(fr, nonzero)) / total_nonzero,
            flush_to_zero=sum(f.flush_to_zero * n for f, n in zip(fr, nonzero)) / total_nonzero,
            relative_error=max((f.relative_error for f in fr), default=0.0))
    return out


def loss_scale_window(fmt: _formats.Format, records: list[OpRecord]) -> LossScaleWindow:
    """The safe loss scales of ``fmt`` for the backward ``records`` (see the module's rules)."""
    abs_max = max((r.measurement.abs_max for r in records), default=0.0)
    exponents: Counter[int] = Counter()
    for r in records:
        exponents.update(r.measurement.exponents)
    nonfinite = sum(r.measurement.nonfinite for r in records)
    if abs_max == 0.0 or nonfinite:
        return LossScaleWindow(fmt.name, None, None, None, None, 0.0, nonfinite)
    high = math.floor(math.log2(fmt.overflow_threshold / abs_max))
    if fmt.overflows(abs_max * 2.0 ** high):
        high -= 1
    normal_log2 = round(math.log2(fmt.smallest_normal))
    total = sum(exponents.values())
    allowed, below, threshold = UNDERFLOW_TOLERANCE * total, 0, None
    for exponent in sorted(exponents):
        if below > allowed:
            break
        threshold = exponent
        below += exponents[exponent]
    low = normal_log2 - (threshold if threshold is not None else normal_log2)
    settle = min(max(high, 0), LARGEST_SCALE_LOG2)
    lost = sum(c for e, c in exponents.items() if e + settle < normal_log2)
    return LossScaleWindow(fmt.name, math.log2(fmt.max / abs_max), low, high, settle,
                           lost / total if total else 0.0)


class NumericsReport:
    """What :func:`~mpcore.debugging.inspect_numerics` found. ``ops`` holds every op in the
    order it ran; the other attributes are derived from them."""

    def __init__(self, model: str, batch: int, dtypes: tuple[str, ...], ops: list[OpRecord],
                 seconds: float, pinned: list[str] | None = None, data_nonfinite: int = 0,
                 variables_nonfinite: list[str] | None = None) -> None:
        self.model, self.batch, self.dtypes, self.ops = model, batch, dtypes, ops
        self.seconds = seconds
        #: layers pinned to float32 (``dtype="float32"`` in a mixed model): not in the 16-bit
        #: figures, suggested float32
        self.pinned = pinned or []
        #: Inf/NaN values in the inputs, and the variables holding some: where non-finite
        #: values that no op produced came from
        self.data_nonfinite = data_nonfinite
        self.variables_nonfinite = variables_nonfinite or []
        self.first_nonfinite: OpRecord | None = next(
            (r for r in ops if r.produced_nonfinite), None)
        self.layers = self._summaries()
        backward = [r for r in ops if r.phase == "backward"]
        self.loss_scale_windows = {name: loss_scale_window(_formats.get(name), backward)
                                   for name in dtypes}
        self.suggested_dtypes = {name: self._suggest(name) for name in dtypes}
        #: with ``float8_recipe=``: each GEMM operand under the recipe
        #: (:class:`~mpcore.debugging.float8_gemms.Float8Operand`), else empty
        self.float8_gemms: list[Any] = []

    def float8_table(self) -> str:
        """The FP8 view as text: one line per GEMM operand, then the most affected one."""
        from mpcore.debugging.float8_gemms import table

        return table(self.float8_gemms)

    def _summaries(self) -> list[LayerSummary]:
        groups: dict[tuple[str, str], list[OpRecord]] = {}
        for r in self.ops:
            if r.in_16_bits:
                groups.setdefault((r.layer, r.phase), []).append(r)
        order = sorted(groups, key=lambda k: (k[1] != "forward", groups[k][0].index))
        return [LayerSummary(layer, phase, len(groups[layer, phase]),
                             max(r.measurement.abs_max for r in groups[layer, phase]),
                             sum(r.measurement.nonfinite for r in groups[layer, phase]),
                             _aggregate(groups[layer, phase], self.dtypes))
                for layer, phase in order]

    def layer(self, name: str, phase: str = "forward") -> LayerSummary:
        for summary in self.layers:
            if summary.layer == name and summary.phase == phase:
                return summary
        names = sorted({s.layer for s in self.layers})
        raise KeyError(f"no {phase} ops of a layer {name!r} were inspected; layers: {names}")

    def _suggest(self, name: str) -> dict[str, str | None]:
        """Per layer: ``name``, "float32", or None where float32 itself holds Inf/NaN (no
        dtype is the cure: find where they come from)."""
        out: dict[str, str | None] = {}
        for summary in self.layers:
            if summary.phase != "forward":
                continue
            f = summary.fractions[name]
            risky = f.overflow > 0 or f.underflow > KEEP_FLOAT32_UNDERFLOW
            out[summary.layer] = None if summary.nonfinite else "float32" if risky else name
        out.update({layer: "float32" for layer in self.pinned})
        return out

    def keep_float32(self, dtype: str) -> list[str]:
        """The layers to keep in float32 when computing in ``dtype`` (pinned ones included)."""
        name = _formats.get(dtype).name
        if name not in self.suggested_dtypes:
            raise ValueError(f"{name} was not inspected; this report has: "
                             f"{', '.join(self.dtypes)}")
        return [layer for layer, dt in self.suggested_dtypes[name].items() if dt == "float32"]

    def nonfinite_origin(self) -> str | None:
        """Where Inf/NaN that no op produced came from, or None when there were none."""
        if not any(r.measurement.nonfinite for r in self.ops) or self.first_nonfinite:
            return None
        where = []
        if self.data_nonfinite:
            where.append(f"the input data ({self.data_nonfinite} Inf/NaN values)")
        if self.variables_nonfinite:
            where.append(f"variables {', '.join(self.variables_nonfinite)}")
        return " and ".join(where) or "values made outside the inspected step"

    # --- output -------------------------------------------------------------------------
    def __str__(self) -> str:
        return self.table()

    def table(self, ops: bool = False) -> str:
        """The report as text (what ``print(report)`` shows); ``ops=True`` adds every op."""
        from mpcore.debugging.table import render

        return render(self, ops=ops)

    def to_dict(self) -> dict[str, Any]:
        def op(r: OpRecord) -> dict[str, Any]:
            d = asdict(r)
            d["shape"] = list(r.shape)
            d["measurement"]["exponents"] = {str(k): v for k, v in r.measurement.exponents.items()}
            return d

        return _finite({
            "model": self.model, "batch": self.batch, "dtypes": list(self.dtypes),
            "seconds": self.seconds,
            "first_nonfinite": None if self.first_nonfinite is None else op(self.first_nonfinite),
            "nonfinite_origin": self.nonfinite_origin(), "pinned": self.pinned,
            "layers": [asdict(s) for s in self.layers],
            "loss_scale_windows": {k: {**asdict(w), "describe": w.describe()}
                                   for k, w in self.loss_scale_windows.items()},
            "suggested_dtypes": self.suggested_dtypes,
            "float8_gemms": [asdict(o) for o in self.float8_gemms],
            "ops": [op(r) for r in self.ops]})

    def to_json(self, **kwargs: Any) -> str:
        """The report as JSON (infinities as null), for tools."""
        return json.dumps(self.to_dict(), allow_nan=False, **kwargs)

    def plot(self, path: str) -> None:
        """Draw overflow and underflow per layer and the gradients' headroom (needs
        matplotlib, the ``plot`` extra)."""
        from mpcore.debugging.plot import plot_report

        plot_report(self, path)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
