"""The inspector's report as a table for people (``print(report)``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpcore.debugging.formats import Fractions

if TYPE_CHECKING:
    from mpcore.debugging.report import NumericsReport

def percent(fraction: float) -> str:
    if fraction == 0:
        return "0"
    if fraction < 1e-4:
        return "<0.01%"
    return f"{100 * fraction:.3g}%"


def _cell(f: Fractions) -> str:
    return f"{percent(f.overflow)} / {percent(f.underflow)} / {f.relative_error:.1e}"


def _columns(rows: list[list[str]]) -> list[str]:
    """``rows`` as lines, each column as wide as its widest cell plus two spaces."""
    widths = [max(len(row[i]) for row in rows) + 2 for i in range(len(rows[0]))]
    return ["".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _first_nonfinite(report: NumericsReport) -> str:
    first = report.first_nonfinite
    if first is not None:
        return (f"First op to produce Inf/NaN: {first.describe()}; its inputs: "
                f"{'; '.join(first.input_ranges) or 'none floating'}")
    origin = report.nonfinite_origin()
    if origin is not None:
        return f"First op to produce Inf/NaN: none; they came in with {origin}"
    return "First op to produce Inf/NaN: none (every value was finite)"


def render(report: NumericsReport, ops: bool = False) -> str:
    """The report as text; ``ops=True`` lists every op under its layer's row."""
    dtypes = report.dtypes
    lines = [f"Numerics of one float32 training step of model {report.model!r} (batch "
             f"{report.batch}, {len(report.ops)} floating ops, inspected in "
             f"{report.seconds:.2f} s)", _first_nonfinite(report)]
    if report.pinned:
        lines.append(f"Pinned to float32 (dtype='float32'), left out of the 16-bit figures: "
                     f"{', '.join(report.pinned)}")
    rows = [["layer", "pass", "max|x|", "Inf/NaN", *dtypes]]
    for s in report.layers:
        rows.append([s.layer, s.phase, f"{s.abs_max:.2e}", str(s.nonfinite),
                     *(_cell(s.fractions[d]) for d in dtypes)])
        if ops:
            rows += [[f"  #{r.index} {r.op}", "", f"{r.measurement.abs_max:.2e}",
                      str(r.measurement.nonfinite),
                      *(_cell(r.measurement.fractions[d]) for d in dtypes)]
                     for r in report.ops
                     if r.layer == s.layer and r.phase == s.phase and r.in_16_bits]
    lines += ["", "Per layer and pass, the ops a mixed policy runs in 16 bits: overflow / "
              "underflow (subnormal or zero) / RMS relative error, of the finite values",
              *_columns(rows)]
    rows = [["dtype", "headroom", "dynamic scaler settles near", "safe loss scales"]]
    for d in dtypes:
        w = report.loss_scale_windows[d]
        headroom = "-" if w.headroom_log2 is None else f"2^{w.headroom_log2:.1f}"
        settle = ("-" if w.settle_scale_log2 is None else "not needed" if not w.scaling_needed
                  else f"2^{w.settle_scale_log2} ({percent(w.underflow_at_settle)} underflow)")
        rows.append([d, headroom, settle, w.describe()])
    lines += ["", "Loss scales (backward pass at scale 1): safe = no overflow and at most "
              "0.1% of non-zero gradient values below the smallest normal", *_columns(rows)]
    rows = [["layer", *dtypes]]
    for layer in report.suggested_dtypes[dtypes[0]]:
        rows.append([layer, *(report.suggested_dtypes[d][layer] or "- (Inf/NaN in float32)"
                              for d in dtypes)])
    lines += ["", "Suggested compute dtype per layer (float32 where its 16-bit ops would "
              "overflow, or lose over 1% of non-zero values to underflow)", *_columns(rows)]
    return "\n".join(line.rstrip() for line in lines)
