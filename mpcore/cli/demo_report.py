"""What ``mpcore demo`` reports after training (:mod:`mpcore.cli.demo`): the results table, the
rewrite run's painted step, the loss scaling of every run that had one, the backend's verdict,
and the plot. Kept apart so that the demo's training code stays short."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

REWRITE = "float32+rewrite"


def label(name: str, run: dict[str, Any]) -> str:
    """A run's name in the table and the plot: the rewrite run says its 16-bit dtype."""
    return f"{name} ({run['dtype']})" if name == REWRITE and run.get("dtype") else name


def report(result: dict[str, Any], verdict: Any, where: str, epochs: int,
           painted: list[str], out: Callable[[str], Any]) -> None:
    runs, policy = result["runs"], result["policy"]
    base = runs["float32"]["time_per_sample"]
    out(f"\nResults on {where}, {result['units']} units, batch {result['batch_size']}, "
        f"{epochs} epoch(s):")
    width = max(16, *(len(label(name, r)) + 2 for name, r in runs.items()))
    out(f"{'policy':<{width}}{'test accuracy':>15}{'time/sample':>15}{'speed vs float32':>19}")
    for name, r in runs.items():
        ratio = base / r["time_per_sample"] if r["time_per_sample"] else float("nan")
        r["speedup"] = ratio
        out(f"{label(name, r):<{width}}{r['test_accuracy']:>15.4f}"
            f"{r['time_per_sample'] * 1e6:>12.1f} us{ratio:>18.2f}x")
    if epochs > 1:
        steady = "epoch 2" if epochs == 2 else f"the mean over epochs 2 to {epochs}"
        out(f"time/sample: {steady} (epoch 1 holds the warm-up)")
    # one timing of a shared or busy machine can be far off: say the ratio is a measurement
    out("Speed ratios are one measurement on this machine: they vary from run to run (other "
        "load, warm-up), more so on a shared CPU")
    if epochs == 1:
        out("Times include warm-up (first-step allocation; kernel compilation on OpenCL/CUDA): "
            "with one epoch the speed ratio is not a steady-state figure; use --epochs 2 or "
            "more")
    if painted:
        out(f"\nThe {REWRITE} training step, as traced (op -> dtype it ran in [rule]):")
        for line in painted:
            out(line)
    for name, r in runs.items():
        if r.get("loss_scaled"):         # a LossScaleOptimizer: mixed_float16, the rewrite
            where_ = (f" (in the gradients of {', '.join(r['nonfinite'])})" if r["nonfinite"]
                      else "")
            out(f"{label(name, r)} skipped {r['skipped_steps']} step(s) with Inf/NaN "
                f"gradients{where_}; final loss scale {r['loss_scales'][-1]:g}")
    if not verdict.fast:
        out(f"Note: the backend's verdict, from the hardware and not from these timings, is "
            f"that {policy} is not fast here: {verdict.reason}")
    elif runs.get(policy, {}).get("speedup", 1.0) < 1.0:
        # the verdict and the table disagree on their face: say why both hold
        out(f"Note: {policy} ran slower than float32 here, though the backend's verdict is "
            f"that it is fast on this hardware. The verdict is about 16-bit matrix "
            f"products; at {result['units']} units they are too small to repay the casts to "
            f"and from 16-bit that mixed precision adds to every step. A larger --units "
            f"(1024, say) shows where it pays.")


def plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    fig, (ax_loss, ax_acc, ax_scale) = plt.subplots(1, 3, figsize=(15, 4.2))
    # The runs often overlap exactly: the float32 one gets big hollow markers and a wide line so
    # that it still shows under the mixed one.
    styles = {"float32": {"marker": "o", "markersize": 9, "markerfacecolor": "none",
                          "linewidth": 3, "alpha": 0.6}}
    n_epochs = 1
    for name, r in runs.items():
        h, shown = r["history"], label(name, r)
        epochs = range(1, len(h["loss"]) + 1)
        n_epochs = max(n_epochs, len(h["loss"]))
        style = styles.get(name, {"marker": "x"})
        ax_loss.plot(epochs, h["loss"], label=f"{shown} train", **style)
        if "val_loss" in h:
            ax_loss.plot(epochs, h["val_loss"], linestyle="--", label=f"{shown} val", **style)
        ax_acc.plot(epochs, h["accuracy"], label=f"{shown} train", **style)
        if "val_accuracy" in h:
            ax_acc.plot(epochs, h["val_accuracy"], linestyle="--", label=f"{shown} val",
                        **style)
    ax_loss.set(title="loss per epoch", xlabel="epoch", ylabel="loss")
    ax_acc.set(title="accuracy per epoch", xlabel="epoch", ylabel="accuracy")
    scaled = {name: r for name, r in runs.items() if r.get("loss_scaled")}
    for name, r in scaled.items():        # every run with a loss scale: mixed_float16, rewrite
        scales, skipped = r["loss_scales"], r["skipped_at"]
        # dashed for the rewrite: the two runs' scales often coincide
        ax_scale.plot(range(1, len(scales) + 1), scales, label=label(name, r),
                      linestyle="--" if name == REWRITE else "-")
        if skipped:
            ax_scale.plot([i + 1 for i in skipped], [scales[i] for i in skipped], "rx",
                          label=f"{label(name, r)}: skipped step (Inf/NaN gradients)")
    if scaled:
        ax_scale.set_yscale("log", base=2)
        ax_scale.legend(fontsize=8)
        ax_scale.set(title="loss scale per step", xlabel="step", ylabel="loss scale")
    else:
        ax_scale.text(0.5, 0.5, f"{result['policy']}: no loss scaling\n(bfloat16 has "
                      "float32's range)", ha="center", va="center",
                      transform=ax_scale.transAxes)
        ax_scale.set(title="loss scale per step", xticks=[], yticks=[])
    for ax in (ax_loss, ax_acc):
        # whole epochs only (one epoch: a tick at 1, not an axis of 0.95..1.05)
        ax.set_xticks(range(1, n_epochs + 1, max(1, n_epochs // 10)))
        ax.set_xlim(0.5, n_epochs + 0.5)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"mpcore demo: {result['units']} units, batch {result['batch_size']}, "
                 f"MNIST {result['split']} split")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
