"""The inspector's report as a figure: overflow and underflow per layer in each format, and the
gradients' magnitudes against each format's range at the scale the dynamic scaler settles at."""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any

from mpcore.debugging import formats as _formats
from mpcore.plugins.extras import install_command

if TYPE_CHECKING:
    from mpcore.debugging.report import NumericsReport


def plot_report(report: NumericsReport, path: str) -> None:
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError(f"report.plot needs matplotlib: {install_command('plot')}") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (over, under, grads) = plt.subplots(3, 1, figsize=(10, 11))
    rows = [f"{s.layer}\n{s.phase}" for s in report.layers]
    n = len(report.dtypes)
    for k, dtype in enumerate(report.dtypes):
        xs = [i + (k - (n - 1) / 2) * 0.8 / n for i in range(len(rows))]
        over.bar(xs, [100 * s.fractions[dtype].overflow for s in report.layers],
                 width=0.8 / n, label=dtype)
        under.bar(xs, [100 * s.fractions[dtype].underflow for s in report.layers],
                  width=0.8 / n, label=dtype)
    for ax, what in ((over, "overflow"), (under, "underflow (subnormal or zero)")):
        ax.set_xticks(range(len(rows)), rows, fontsize=7)
        ax.set_ylabel(f"% {what}")
        ax.legend(fontsize=8)
    over.set_title(f"Numerics of one float32 step of {report.model!r}")

    exponents: Counter[int] = Counter()
    for r in report.ops:
        if r.phase == "backward":
            exponents.update(r.measurement.exponents)
    _headroom(grads, report, exponents)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _headroom(ax: Any, report: NumericsReport, exponents: Counter[int]) -> None:
    """Each format's subnormal and normal range at the scale the scaler settles at (bars),
    over the histogram of the gradient values at scale 1."""
    rows = [d for d in report.dtypes if report.loss_scale_windows[d].settle_scale_log2 is not None]
    for k, dtype in enumerate(rows):
        fmt, shift = _formats.get(dtype), report.loss_scale_windows[dtype].settle_scale_log2
        assert shift is not None
        low, high = fmt.log2_range
        bottom = math.log2(fmt.smallest_subnormal)
        ax.broken_barh([(bottom - shift, low - bottom), (low - shift, high - low)],
                       (k - 0.35, 0.7), facecolors=("tab:orange", "tab:blue"))
        ax.text(high - shift, k, f" scale 2^{shift}", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xlabel("log2 |gradient value| (bars: subnormal in orange, normal in blue, at the "
                  "scale the dynamic scaler settles near)")
    if not exponents:
        return
    keys = sorted(exponents)
    ax.set_xlim(keys[0] - 12, keys[-1] + 24)
    counts = ax.twinx()
    counts.bar(keys, [exponents[e] for e in keys], width=1.0, color="0.3", alpha=0.6)
    counts.set_yscale("log")
    counts.set_ylabel("gradient values at scale 1")
