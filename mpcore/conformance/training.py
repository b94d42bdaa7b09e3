"""The end-to-end checks: gradients of a small MLP and its loss through GradientTape against
the CPU backend in float64, and a short mixed_float16 training run with a LossScaleOptimizer
that skips the step with an Inf and recovers."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from mpcore.conformance.harness import LOW, CheckFailedError, Context
from mpcore.core.backend import Backend


def _mlp_grads(be: Backend, host: dict[str, Any], dtype: str) -> dict[str, Any]:
    """Gradients of a small MLP's loss on ``be``: the weights are ``dtype`` Variables read in
    ``dtype`` (float16/bfloat16: float32 Variables read through a cast, as layers do)."""
    from mpcore import ops
    from mpcore.core.tape import GradientTape
    from mpcore.core.tensor import Variable

    var_dtype = "float32" if dtype in LOW else dtype
    ws = {n: Variable(host[n], dtype=var_dtype, backend=be, name=n)
          for n in ("w1", "b1", "w2", "b2")}
    x = ops.constant(host["x"], dtype=dtype, backend=be)
    labels = ops.constant(host["labels"], dtype="int32", backend=be)
    with GradientTape() as tape:
        w = {n: v.read_as(dtype) for n, v in ws.items()}
        h = ops.relu(ops.bias_add(ops.matmul(x, w["w1"]), w["b1"]))
        h = ops.tanh(h) * 0.5 + h * 0.5
        logits = ops.add(ops.matmul(h, w["w2"]), w["b2"])
        loss = ops.mean(ops.sparse_softmax_cross_entropy(labels, logits))
        loss = loss + 0.1 * ops.mean(ops.sigmoid(ops.cast(logits, "float32")))
        loss = loss + 1e-3 * ops.sum(ops.square(ops.cast(ws["w1"], "float32")))
    grads = tape.gradient(loss, list(ws.values()))
    return {"loss": loss.numpy(), **{n: g.numpy() for n, g in zip(ws, grads)},
            "dtypes": [g.dtype for g in grads]}


def _mlp_inputs(ctx: Context) -> dict[str, Any]:
    rng = ctx.rng("mlp")
    return {"x": rng.uniform(-1, 1, (8, 6)), "labels": rng.integers(0, 3, (8,)),
            "w1": rng.normal(0, 0.5, (6, 5)), "b1": rng.normal(0, 0.1, (5,)),
            "w2": rng.normal(0, 0.5, (5, 3)), "b2": rng.normal(0, 0.1, (3,))}


# float32: several roundings per gradient; 16-bit: the forward pass rounds every activation
MLP_TOLERANCE = {"float32": (1e-4, 1e-5), "float16": (2e-2, 5e-3), "bfloat16": (1e-1, 3e-2)}


def check_gradients(dtype: str) -> Callable[[Context], str]:
    def run(ctx: Context) -> str:
        np = ctx.np
        host = _mlp_inputs(ctx)
        if dtype in LOW:
            host["x"] = ctx.rounded(host["x"], dtype)
        got = _mlp_grads(ctx.be, host, dtype)
        want = _mlp_grads(ctx.ref, host, "float64")
        if got["dtypes"] != ["float32"] * 4:
            raise CheckFailedError(f"gradients of float32 variables came back {got['dtypes']}, "
                                   "expected float32")
        rtol, atol = MLP_TOLERANCE[dtype]
        worst = 0.0
        for n in ("loss", "w1", "b1", "w2", "b2"):
            g = np.asarray(got[n], np.float64)
            w = np.asarray(want[n], np.float64)
            if g.shape != w.shape:
                raise CheckFailedError(f"gradient of {n}: shape {g.shape}, expected {w.shape}")
            err = np.abs(g - w) - (atol + rtol * np.abs(w))
            if (err > 0).any() or not np.isfinite(g).all():
                i = tuple(np.argwhere(~(err <= 0))[0]) if g.ndim else ()
                raise CheckFailedError(f"MLP {'loss' if n == 'loss' else 'gradient of ' + n} "
                                       f"[{dtype}]: at {i} got {g[i]!r}, reference (CPU, float64) "
                                       f"{w[i]!r} (rtol={rtol:g} atol={atol:g})")
            scale = float(np.abs(w).max()) or 1.0
            worst = max(worst, float(np.abs(g - w).max()) / scale)
        return f"max error {worst:.2e} of the largest gradient"

    return run


def check_training(ctx: Context) -> str:
    """mixed_float16 training with a dynamic loss scale: one batch carries an Inf, that step
    is skipped (weights untouched, scale halved) and training goes on."""
    np = ctx.np
    from mpcore.mixed_precision.loss_scale import DynamicLossScale
    from mpcore.optimizers import SGD
    from mpcore.optimizers.loss_scale_optimizer import LossScaleOptimizer

    host = _mlp_inputs(ctx)
    steps = 6 if ctx.quick else 20
    bad_step = 2

    def train(be: Backend) -> tuple[list[float], list[bool], list[float], bool, int]:
        from mpcore import ops
        from mpcore.core.tape import GradientTape
        from mpcore.core.tensor import Variable

        ws = [Variable(host[n], dtype="float32", backend=be, name=n)
              for n in ("w1", "b1", "w2", "b2")]
        opt = LossScaleOptimizer(SGD(0.5, momentum=0.5),
                                 DynamicLossScale(initial_loss_scale=2.0**15))
        labels = ops.constant(host["labels"], dtype="int32", backend=be)
        losses, applied, scales = [], [], []
        untouched = True
        for step in range(steps):
            xs = np.array(host["x"])
            if step == bad_step:
                xs[3, 2] = np.inf
            x = ops.constant(xs, dtype="float16", backend=be)
            before = [np.array(v.numpy(), copy=True) for v in ws]
            # The Inf batch is deliberate: NumPy-based kernels may warn about inf - inf there.
            with np.errstate(all="ignore") if step == bad_step else contextlib.nullcontext():
                with GradientTape() as tape:
                    w1, b1, w2, b2 = (v.read_as("float16") for v in ws)
                    h = ops.relu(ops.bias_add(ops.matmul(x, w1), b1))
                    logits = ops.bias_add(ops.matmul(h, w2), b2)
                    loss = ops.mean(ops.sparse_softmax_cross_entropy(labels, logits))
                    scaled = opt.get_scaled_loss(loss)
                grads = opt.get_unscaled_gradients(tape.gradient(scaled, ws))
                applied.append(bool(opt.apply_gradients(zip(grads, ws))))
            scales.append(opt.loss_scale())
            if step == bad_step:
                untouched = all(np.array_equal(b, v.numpy()) for b, v in zip(before, ws))
            losses.append(float(loss.numpy()))
        return losses, applied, scales, untouched, opt.skipped_steps

    losses, applied, scales, untouched, skipped = train(ctx.be)
    # the root cause first: weights written on a skipped step poison every later step
    if not untouched:
        raise CheckFailedError(f"step {bad_step} had an Inf gradient but the weights changed")
    want_applied = [s != bad_step for s in range(steps)]
    if applied != want_applied:
        raise CheckFailedError(f"steps applied {applied}, expected only step {bad_step} (the Inf "
                               "batch) skipped")
    if skipped != 1 or scales[bad_step] != 2.0**14 or scales[bad_step - 1] != 2.0**15:
        raise CheckFailedError(f"loss scales {scales}, skipped_steps {skipped}: expected the scale "
                               "to halve once, at the Inf step")
    if not losses[-1] < losses[0]:
        raise CheckFailedError(f"the loss did not decrease after the skipped step: {losses}")
    ref_losses, *_ = train(ctx.ref)
    finite = [i for i in range(steps) if i != bad_step]
    for i in finite:
        if abs(losses[i] - ref_losses[i]) > 2e-2 * abs(ref_losses[i]) + 2e-3:
            raise CheckFailedError(f"loss at step {i}: {losses[i]:.5f}, CPU reference "
                                   f"{ref_losses[i]:.5f} (same data, same float16 compute)")
    return f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, step {bad_step} skipped, scale 2^14"

