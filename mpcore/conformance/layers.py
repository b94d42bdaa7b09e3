"""The layer checks: each layer family of issue "Real models" (BatchNormalization,
LayerNormalization, Embedding, MultiHeadAttention, average pooling, a residual Add, a
multi-axis Softmax) built on the tested backend with the reference's weights, its forward pass
and the gradients of every input and weight compared with the reference (the CPU) in float64.

The layers are composites of the required kernels (5-D reshapes, sums over several axes,
take/take_grad, batched matmuls with masks), so these checks find what the kernel checks'
single calls do not: a kernel that mishandles the shapes and dtypes a real model gives it. In
16 bits they also check each layer's precision rule: output in the compute dtype, float32
gradients of float32 weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mpcore.conformance.harness import CheckFailedError, Context
from mpcore.core.backend import Backend

#: (rtol, atol as a fraction of the largest reference value): float32 holds several roundings
#: per value; 16-bit inputs and activations round each layer's every step.
TOLERANCE = {"float32": (1e-4, 1e-5), "float16": (3e-2, 1e-2), "bfloat16": (1.5e-1, 5e-2)}
POLICY = {"float32": "float32", "float64": "float64", "float16": "mixed_float16",
          "bfloat16": "mixed_bfloat16"}


@dataclass(frozen=True)
class Case:
    """A layer, how to call it, and its inputs (host arrays; ``ints`` are not differentiated)."""

    make: Callable[[], Any]
    inputs: Callable[[Context], list[Any]]
    call: Callable[[Any, list[Any]], Any] = lambda layer, xs: layer(xs[0], training=True)
    ints: tuple[int, ...] = field(default=())


def _floats(*shapes: tuple[int, ...]) -> Callable[[Context], list[Any]]:
    return lambda ctx: [ctx.data(s, key=("layers", i)) for i, s in enumerate(shapes)]


def _cases() -> dict[str, Case]:
    from mpcore import layers

    def residual() -> Any:
        class Residual(layers.Layer):
            def build(self, input_shape: Any) -> None:
                self.dense = layers.Dense(input_shape[-1], activation="relu")

            def call(self, x: Any) -> Any:
                return layers.Add()([x, self.dense(x)])
        return Residual()

    return {
        "batch_normalization": Case(lambda: layers.BatchNormalization(momentum=0.8),
                                    _floats((6, 3, 4))),
        "layer_normalization": Case(layers.LayerNormalization, _floats((3, 4, 6))),
        "embedding": Case(lambda: layers.Embedding(11, 5),
                          lambda ctx: [ctx.rng("ids").integers(0, 11, (3, 4))], ints=(0,)),
        "multi_head_attention": Case(
            lambda: layers.MultiHeadAttention(2, 3), _floats((2, 5, 6)),
            lambda layer, xs: layer(xs[0], xs[0], use_causal_mask=True)),
        "average_pooling2d": Case(lambda: layers.AveragePooling2D(3, 2, "same"),
                                  _floats((2, 5, 5, 2))),
        "global_average_pooling2d": Case(layers.GlobalAveragePooling2D, _floats((2, 3, 4, 5))),
        "residual_add": Case(residual, _floats((4, 6))),
        "softmax_two_axes": Case(lambda: layers.Softmax(axis=(1, 2)), _floats((2, 3, 4))),
    }


CASE_NAMES = ("batch_normalization", "layer_normalization", "embedding", "multi_head_attention",
              "average_pooling2d", "global_average_pooling2d", "residual_add",
              "softmax_two_axes")


def _run(be: Backend, case: Case, host: list[Any], weights: list[Any] | None,
         dtype: str) -> dict[str, Any]:
    """The case's output, the gradients of ``sum(output * r)`` and the layer's weights after
    the call (BatchNorm's moving statistics), all as host arrays; computed on ``be`` under the
    policy of ``dtype`` (float64 on the reference)."""
    from mpcore import ops
    from mpcore.core.tape import GradientTape
    from mpcore.mixed_precision import policy
    from mpcore.plugins import registry

    with registry.backend_scope(be), policy.policy_scope(POLICY[dtype]):
        layer = case.make()
        floating = "float64" if dtype == "float64" else "float32"
        xs = [ops.constant(h, dtype="int32" if i in case.ints else floating)
              for i, h in enumerate(host)]
        case.call(layer, xs)                       # builds the weights
        if weights is None:
            weights = [w.numpy() for w in layer.weights]
        layer.set_weights(weights)
        start = [w.numpy() for w in layer.weights]
        seen = [x for i, x in enumerate(xs) if i not in case.ints]
        with GradientTape() as tape:
            for x in seen:
                tape.watch(x)
            out = case.call(layer, xs)
            r = ops.constant(_weights_of(out.shape), dtype="float32")
            loss = ops.sum(ops.multiply(ops.cast(out, floating), r))
        trainable = layer.trainable_weights
        grads = tape.gradient(loss, [*seen, *trainable])
        for w, s in zip(layer.weights, start):
            w.assign(s)   # leave the weights as found (a reference run reuses them)
        case.call(layer, xs)
        after = [w.numpy() for w in layer.weights]
        return {"out": out.numpy(), "out_dtype": out.dtype,
                "grads": [None if g is None else g.numpy() for g in grads],
                "grad_dtypes": [None if g is None else g.dtype for g in grads[len(seen):]],
                "names": [f"input {i}" for i in range(len(seen))] + [w.name for w in trainable],
                "weights": weights, "after": after,
                "weight_names": [w.name for w in layer.weights]}


def _weights_of(shape: tuple[int, ...]) -> Any:
    """A fixed, uneven cotangent (the same on every backend): 1, -0.5, 0.25 ... repeating."""
    import numpy as np

    n = int(np.prod(shape))
    return (np.array([1.0, -0.5, 0.25, -0.125, 0.75])[np.arange(n) % 5]).reshape(shape)


def _compare(ctx: Context, got: Any, want: Any, dtype: str, what: str,
             floor: float) -> float:
    """The largest error over the reference's largest value (or ``floor``, the case's
    largest gradient: a gradient that is zero in exact arithmetic, as the key bias's under
    softmax's shift invariance, is judged against the gradients' scale, not against 1e-17)."""
    np = ctx.np
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if g.shape != w.shape:
        raise CheckFailedError(f"{what}: shape {g.shape}, reference {w.shape}")
    rtol, atol = TOLERANCE[dtype]
    scale = max(float(np.abs(w).max()) if w.size else 0.0, floor)
    err = np.abs(g - w) - (atol * scale + rtol * np.abs(w))
    if (err > 0).any() or not np.isfinite(g).all():
        i = tuple(np.argwhere(~(err <= 0))[0]) if g.ndim else ()
        raise CheckFailedError(f"{what} [{dtype}]: at {i} got {g[i]!r}, reference (CPU, "
                               f"float64) {w[i]!r} (rtol={rtol:g}, atol={atol:g} x {scale:.3g})")
    return float(np.abs(g - w).max()) / (scale or 1.0)


def check_layer(name: str, dtype: str) -> Callable[[Context], str]:
    def run(ctx: Context) -> str:
        case = _cases()[name]
        host = case.inputs(ctx)
        # the reference sees the values the tested backend does (16-bit, or float32)
        host = [h if i in case.ints else ctx.rounded(h, dtype) for i, h in enumerate(host)]
        got = _run(ctx.be, case, host, None, dtype)
        want = _run(ctx.ref, case, host, got["weights"], "float64")
        compute = "float32" if dtype == "float32" else dtype
        if got["out_dtype"] != compute:
            raise CheckFailedError(f"{name}: output dtype {got['out_dtype']}, expected the "
                                   f"compute dtype {compute}")
        if any(d not in (None, "float32") for d in got["grad_dtypes"]):
            raise CheckFailedError(f"{name}: gradients of float32 weights came back "
                                   f"{got['grad_dtypes']}, expected float32")
        np = ctx.np
        floor = max(float(np.abs(w).max()) for w in want["grads"] if w is not None)
        worst = _compare(ctx, got["out"], want["out"], dtype, f"{name} output", 0.0)
        for label, g, w in zip(got["names"], got["grads"], want["grads"]):
            if (g is None) != (w is None):
                raise CheckFailedError(f"{name}: gradient of {label} is "
                                       f"{'missing' if g is None else 'present'} here, not on "
                                       "the reference")
            if g is not None:
                worst = max(worst, _compare(ctx, g, w, dtype, f"{name} gradient of {label}",
                                            floor))
        for label, g, w in zip(got["weight_names"], got["after"], want["after"]):
            worst = max(worst, _compare(ctx, g, w, dtype, f"{name} {label} after a call", 0.0))
        return f"max error {worst:.2e} of the largest value"

    return run


def check_batch_norm_kernels(ctx: Context) -> str:
    """The optional ``batch_norm`` and ``batch_norm_grad`` kernels against NumPy in float64:
    the normalized output, the batch mean and biased variance, 1/sqrt(var + eps), and the
    closed-form gradients, with and without gamma and beta (float32); and 16-bit inputs."""
    return _check_norm_kernels(ctx, "batch_norm", (6, 3, 5), "bn", per_row=False)


def check_layer_norm_kernels(ctx: Context) -> str:
    """The optional ``layer_norm`` and ``layer_norm_grad`` kernels against NumPy in float64:
    each row normalized over the last axis, and the closed-form gradients (float32); and
    16-bit inputs."""
    return _check_norm_kernels(ctx, "layer_norm", (4, 3, 6), "ln", per_row=True)


def _norm_reference(ctx: Context, flat: Any, dy: Any, gamma: Any, per_row: bool
                    ) -> tuple[Any, Any, Any, Any, Any]:
    """(mean, biased variance, inv_std, x_hat, dx) of a (rows, channels) array in float64,
    statistics per channel (batch normalization) or per row (layer normalization). Both
    gradients have one form: dx = inv * (dy*gamma - m(dy*gamma) - x_hat * m(dy*gamma * x_hat))
    with m the mean over the statistics' axis (gamma is per channel, constant over rows)."""
    np = ctx.np
    axis = 1 if per_row else 0
    mu, var = flat.mean(axis, keepdims=True), flat.var(axis, keepdims=True)
    inv = 1.0 / np.sqrt(var + 1e-3)
    x_hat = (flat - mu) * inv
    dyg = dy * gamma
    dx = inv * (dyg - dyg.mean(axis, keepdims=True)
                - x_hat * (dyg * x_hat).mean(axis, keepdims=True))
    return mu.reshape(-1), var.reshape(-1), inv.reshape(-1), x_hat, dx


def _check_norm_kernels(ctx: Context, kind: str, shape: tuple[int, ...], key: str,
                        per_row: bool) -> str:
    np = ctx.np
    forward, backward = ctx.kernel(kind), ctx.kernel(f"{kind}_grad")
    c = shape[-1]
    x = ctx.data(shape, key=f"{key} x") * 3.0 + 1.0
    dy = ctx.data(shape, key=f"{key} dy")
    gamma, beta = ctx.data((c,), key=f"{key} gamma"), ctx.data((c,), key=f"{key} beta")
    flat = ctx.rounded(x, "float32").reshape(-1, c)
    g2 = ctx.rounded(dy, "float32").reshape(-1, c)
    for with_params in (True, False):
        g = ctx.up(gamma, "float32") if with_params else None
        b = ctx.up(beta, "float32") if with_params else None
        gh = ctx.rounded(gamma, "float32") if with_params else np.ones(c)
        bh = ctx.rounded(beta, "float32") if with_params else np.zeros(c)
        mu, var, inv, x_hat, want_dx = _norm_reference(ctx, flat, g2, gh, per_row)
        what = kind + ("" if with_params else " without gamma and beta")
        out = forward(ctx.up(x, "float32"), g, b, 1e-3)
        ctx.expect(out[0], (x_hat * gh + bh).reshape(shape), "float32", f"{what}: y", 10.0)
        ctx.expect(out[1], mu, "float32", f"{what}: mean", 10.0)
        if not per_row:   # batch_norm also returns the variance (the moving averages')
            ctx.expect(out[2], var, "float32", f"{what}: variance", 10.0)
        ctx.expect(out[-1], inv, "float32", f"{what}: inv_std", 10.0)
        dx, dgamma, dbeta = backward(ctx.up(dy, "float32"), ctx.up(x, "float32"), out[1],
                                     out[-1], g)
        ctx.expect(dx, want_dx.reshape(shape), "float32", f"{what}: dx", 20.0)
        ctx.expect(dgamma, (g2 * x_hat).sum(0), "float32", f"{what}: dgamma", 20.0)
        ctx.expect(dbeta, g2.sum(0), "float32", f"{what}: dbeta", 20.0)
    # a 16-bit input: float32 statistics, the output and the input gradient in the input's
    # dtype, rounded once from float32 (within two of its ulps of the float64 result)
    for dtype in ("float16", "bfloat16"):
        x = ctx.rounded(ctx.data(shape, key=(kind, dtype)) * 2.0 + 0.5, dtype)
        dy = ctx.rounded(ctx.data(shape, key=(kind, dtype, "dy")), dtype)
        mu, _, _, x_hat, want_dx = _norm_reference(ctx, x.reshape(-1, c), dy.reshape(-1, c),
                                                   np.ones(c), per_row)
        out = forward(ctx.up(x, dtype), None, None, 1e-3)
        ctx.expect(out[0], x_hat.reshape(shape), dtype, f"{kind} [{dtype} input]: y", 2.0)
        ctx.expect(out[1], mu, "float32", f"{kind} [{dtype} input]: mean", 10.0)
        dx = backward(ctx.up(dy, dtype), ctx.up(x, dtype), out[1], out[-1], None)[0]
        ctx.expect(dx, want_dx.reshape(shape), dtype, f"{kind}_grad [{dtype} input]: dx", 4.0)
    return "forward and gradients within 20x float32's tolerance; 16-bit inputs"


def check_gelu_kernels(dtype: str) -> Callable[[Context], str]:
    """The optional ``gelu`` and ``gelu_grad`` kernels, exact and tanh forms, against NumPy in
    float64 (math.erf): the result in the input's dtype, computed in float32."""
    def run(ctx: Context) -> str:
        import math

        np = ctx.np
        forward, backward = ctx.kernel("gelu"), ctx.kernel("gelu_grad")
        x = ctx.rounded(ctx.data((7, 9), -5.0, 5.0, key="gelu x"), dtype)
        g = ctx.rounded(ctx.data((7, 9), key="gelu g"), dtype)
        erf = np.vectorize(math.erf)(x / math.sqrt(2.0))
        t = np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))
        wants = {False: (0.5 * x * (1 + erf),
                         0.5 * (1 + erf) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)),
                 True: (0.5 * x * (1 + t), 0.5 * (1 + t) + 0.5 * x * (1 - t * t)
                        * math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x * x))}
        for approximate, (y, dy) in wants.items():
            form = "tanh" if approximate else "exact"
            xs = ctx.up(x, dtype)
            got, saved = forward(xs, approximate)
            ctx.expect(got, y, dtype, f"gelu ({form}) [{dtype}]", 4.0)
            ctx.expect(backward(ctx.up(g, dtype), xs, saved, approximate), g * dy,
                       dtype, f"gelu_grad ({form}) [{dtype}]", 4.0)
        return "exact and tanh forms"

    return run
