"""The inspector's report as a table for people (``print(report)``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpcore.debugging.formats import Fractions

if TYPE_CHECKING:
    from mpcore.debugging.report import NumericsReport

_CELL = 24


def percent(fraction: float) -> str:
    if fraction == 0:
        return "0"
    if fraction < 1e-4:
        return "<0.01%"
    return f"{100 * fraction:.3g}%"


def _cell(f: Fractions) -> str:
    return f"{percent(f.overflow)} / {percent(f.underflow)} / {f.relative_error:.1e}"


def render(report: NumericsReport, ops: bool = False) -> str:
    """The report as text; ``ops=True`` lists every op under its layer's row."""
    dtypes = report.dtypes
    names = [s.layer for s in report.layers]
    if ops:
        names += [f"  #{r.index} {r.op}" for r in report.ops]
    width = max(len("layer"), *(len(n) for n in names)) + 2
    lines = [f"Numerics of one float32 training step of model {report.model!r} (batch "
             f"{report.batch}, {len(report.ops)} floating ops, inspected in "
             f"{report.seconds:.2f} s)"]
    first = report.first_nonfinite
    if first is None:
        lines.append("First op to produce Inf/NaN: none (every value was finite)")
    else:
        lines.append(f"First op to produce Inf/NaN: {first.describe()}; its inputs: "
                     f"{'; '.join(first.input_ranges) or 'none floating'}")
    lines += ["", "Per layer and pass, the ops a mixed policy runs in 16 bits: overflow / "
              "underflow (subnormal or zero) / RMS relative error",
              f"{'layer':<{width}}{'pass':<10}{'max|x|':>9}  "
              + "".join(f"{d:<{_CELL}}" for d in dtypes)]
    for s in report.layers:
        lines.append(f"{s.layer:<{width}}{s.phase:<10}{s.abs_max:>9.2e}  "
                     + "".join(f"{_cell(s.fractions[d]):<{_CELL}}" for d in dtypes))
        if ops:
            lines += [f"{'  #' + str(r.index) + ' ' + r.op:<{width}}{'':<10}"
                      f"{r.measurement.abs_max:>9.2e}  "
                      + "".join(f"{_cell(r.measurement.fractions[d]):<{_CELL}}" for d in dtypes)
                      for r in report.ops
                      if r.layer == s.layer and r.phase == s.phase and r.in_16_bits]
    lines += ["", "Loss scales (backward pass at scale 1): safe = no overflow and at most "
              "0.1% of non-zero gradient values below the smallest normal",
              f"{'dtype':<16}{'headroom':>10}  {'dynamic scaler settles near':<32}"
              "safe loss scales"]
    for d in dtypes:
        w = report.loss_scale_windows[d]
        headroom = "-" if w.headroom_log2 is None else f"2^{w.headroom_log2:.1f}"
        settle = ("-" if w.settle_scale_log2 is None else "not needed" if not w.scaling_needed
                  else f"2^{w.settle_scale_log2} ({percent(w.underflow_at_settle)} underflow)")
        lines.append(f"{d:<16}{headroom:>10}  {settle:<32}{w.describe()}")
    lines += ["", "Suggested compute dtype per layer (float32 where its 16-bit ops would "
              "overflow, or lose over 1% of non-zero values to underflow)",
              f"{'layer':<{width}}" + "".join(f"{d:<16}" for d in dtypes)]
    for layer in report.suggested_dtypes[dtypes[0]]:
        lines.append(f"{layer:<{width}}" + "".join(
            f"{report.suggested_dtypes[d][layer]:<16}" for d in dtypes))
    return "\n".join(line.rstrip() for line in lines)
