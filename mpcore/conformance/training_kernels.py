"""The checks of the kernels a training step relies on beyond array math: the random kernels
(determinism per seed, moments), the loss-scale flag of ``unscale_and_check`` on finite, inf
and nan gradients, and the optional fused kernels a backend provides (softmax, cross-entropy,
relu/bias gradients, dense, dropout masks, and the fused optimizer updates, which must honour
the flag and leave every buffer untouched when it is false)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from mpcore.conformance.harness import FLOATS, CheckFailedError, CheckSkippedError, Context


# --- random -------------------------------------------------------------------------------
def _moments(ctx: Context, values: Any, mean: float, std: float, what: str) -> None:
    np = ctx.np
    v = np.asarray(values, dtype=np.float64).ravel()
    n = v.size
    got_mean, got_std = float(v.mean()), float(v.std())
    # 6 standard errors: a correct generator fails this about once in 10^9 runs
    if abs(got_mean - mean) > 6 * std / math.sqrt(n) + 0.01 * std:
        raise CheckFailedError(f"{what}: mean {got_mean:.4f} over {n} samples, expected {mean:.4f}")
    if abs(got_std - std) > 6 * std * math.sqrt(2.0 / n) + 0.01 * std:
        raise CheckFailedError(f"{what}: standard deviation {got_std:.4f} over {n} samples, "
                               f"expected {std:.4f}")


def check_random(kind: str, dtype: str) -> Callable[[Context], None]:
    def run(ctx: Context) -> None:
        np = ctx.np
        n = 4096 if ctx.quick else 65536
        shape = (n // 64, 64)
        k = ctx.k[kind]
        p, q = (-2.0, 3.0) if kind == "random_uniform" else (1.0, 2.0)
        what = f"{kind}[{dtype}] seed 7"
        a = ctx.host(k(shape, dtype, 7, p, q), what)
        if a.dtype != ctx.np_dtypes[dtype] or a.shape != shape:
            raise CheckFailedError(f"{what}: returned {a.dtype.name} {a.shape}, expected {dtype} "
                                   f"{shape}")
        b = ctx.host(k(shape, dtype, 7, p, q), what)
        if not np.array_equal(a, b):
            raise CheckFailedError(f"{what}: two calls with the same seed differ (a seed must make "
                                   "a run repeatable)")
        c = ctx.host(k(shape, dtype, 8, p, q), what)
        if np.array_equal(a, c):
            raise CheckFailedError(f"{what}: seeds 7 and 8 give the same values")
        v = a.astype(np.float64)
        if not np.isfinite(v).all():
            raise CheckFailedError(f"{what}: non-finite values")
        if kind == "random_uniform":
            if v.min() < p or v.max() > q:
                raise CheckFailedError(f"{what}: values outside [{p}, {q}): min {v.min()}, max "
                                  f"{v.max()}")
            _moments(ctx, v, (p + q) / 2, (q - p) / math.sqrt(12), what)
            lo_half = float((v < (p + q) / 2).mean())
            if abs(lo_half - 0.5) > 6 * 0.5 / math.sqrt(v.size):
                raise CheckFailedError(f"{what}: {lo_half:.3f} of the values in the lower half")
        else:
            _moments(ctx, v, p, q, what)
            within = float((np.abs(v - p) < q).mean())  # 68.3% within one sigma
            if abs(within - 0.6827) > 0.03:
                raise CheckFailedError(f"{what}: {within:.3f} of the values within one standard "
                                       "deviation, expected 0.683 (not a normal distribution?)")
        small = ctx.host(k((3,), dtype, 7, p, q), what)
        if small.shape != (3,):
            raise CheckFailedError(f"{kind}[{dtype}] shape (3,): returned {small.shape}")

    return run


# --- loss scaling -------------------------------------------------------------------------
def check_unscale_and_check(ctx: Context) -> None:
    np = ctx.np
    k = ctx.k["unscale_and_check"]
    grads = [(ctx.data((3, 4), -300, 300, key="u0"), "float32"),
             (ctx.data((5,), -300, 300, key="u1"), "float16"),
             (ctx.data((2, 2), -300, 300, key="u2"), "bfloat16")]

    def run(items: list[tuple[Any, str]], inv: float, expect: bool, what: str) -> None:
        outs, flag = k([ctx.up(g, dt) for g, dt in items], inv)
        if len(outs) != len(items):
            raise CheckFailedError(f"unscale_and_check {what}: {len(outs)} outputs for "
                                   f"{len(items)} gradients")
        if ctx.flag(flag, f"unscale_and_check {what}") is not expect:
            raise CheckFailedError(f"unscale_and_check {what}: flag is {not expect}, expected "
                                   f"{expect}")
        for i, ((g, dt), out) in enumerate(zip(items, outs)):
            with np.errstate(over="ignore"):  # the overflow cases expect inf here
                want = (ctx.rounded(g, dt) * np.float32(inv)).astype(np.float32)
            ctx.expect(out, want, "float32", f"unscale_and_check {what}: gradient {i} ({dt})",
                       2)

    run(grads, 1.0 / 1024, True, "on finite float32/float16/bfloat16 gradients")
    run(grads, 1.0, True, "with inv_scale 1")
    for i, bad in ((0, np.inf), (1, np.nan), (2, -np.inf), (1, np.inf)):
        items = [(g.copy(), dt) for g, dt in grads]
        items[i][0].flat[1] = bad
        run(items, 1.0 / 1024, False, f"with {bad} in gradient {i} ({items[i][1]})")
    # finite values whose sum overflows float32 are still finite
    huge = [(np.asarray([3.0e38, 3.0e38, -1.0]), "float32")]
    run(huge, 1.0, True, "on finite values whose sum overflows")


def check_unscale_and_check_by(ctx: Context) -> None:
    """The device-scale form: the reciprocal read from a float32 array of shape ()."""
    np = ctx.np
    k = ctx.kernel("unscale_and_check_by")
    grads = [(ctx.data((3, 4), -300, 300, key="ub0"), "float32"),
             (ctx.data((5,), -300, 300, key="ub1"), "float16")]
    for inv, bad in ((1.0 / 1024, None), (1.0 / 3.0, None), (0.5, np.inf), (0.5, np.nan)):
        items = [(g.copy(), dt) for g, dt in grads]
        if bad is not None:
            items[1][0].flat[2] = bad
        outs, flag = k([ctx.up(g, dt) for g, dt in items], ctx.up(np.float32(inv), "float32"))
        what = f"unscale_and_check_by with 1/scale {inv!r}" + (f" and {bad}" if bad else "")
        if ctx.flag(flag, what) is not (bad is None):
            raise CheckFailedError(f"{what}: flag is {bad is not None}, expected {bad is None}")
        for i, ((g, dt), out) in enumerate(zip(items, outs)):
            if bad is None:     # exact: one float32 product per element
                want = (ctx.rounded(g, dt).astype(np.float32) * np.float32(inv))
                ctx.expect(out, want, "float32", f"{what}: gradient {i} ({dt})", 0)


#: (period, multiplier, floor, ceiling, hysteresis, initial scale, flags): the cases every
#: backend's loss_scale_update must follow bit for bit (growth, the ceiling, float32 overflow
#: of the growth, the floor, hysteresis, an odd multiplier whose divisions round).
_SCALE_CASES = (
    (2, 2.0, 1.0, math.inf, 1, 4.0, (1, 1, 1, 0, 1, 1, 0, 0, 0, 0)),
    (1, 3.0, 0.25, 100.0, 2, 7.0, (1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1)),
    (1, 2.0, 1.0, math.inf, 1, 2.0**127, (1, 1, 0, 1)),
    (3, 1.5, 1.0, math.inf, 1, 1.0, (0,) * 12 + (1,) * 7),
)


def check_loss_scale_update(ctx: Context) -> None:
    """The in-place update of a dynamic loss scale against the reference backend's kernel,
    bit for bit (scale, reciprocal and counters) after every step of each case."""
    np = ctx.np
    k = ctx.kernel("loss_scale_update")
    ref = ctx.rk["loss_scale_update"]
    for n, (period, mult, floor, ceiling, hyst, initial, flags) in enumerate(_SCALE_CASES):
        state = [ctx.up(np.float32(initial), "float32"),
                 ctx.up(np.float32(1.0) / np.float32(initial), "float32"),
                 ctx.up(np.zeros(4, np.int64), "int64")]
        want = [np.array(np.float32(initial)), np.array(np.float32(1.0) / np.float32(initial)),
                np.zeros(4, np.int64)]
        for i, f in enumerate(flags):
            args = (period, mult, floor, ceiling, hyst, 10)
            k(*state, ctx.up(np.bool_(f), "bool"), *args)
            ref(*want, np.asarray(bool(f)), *args)
            for got, expected, name in zip(state, want, ("scale", "inv_scale", "counters")):
                h = np.asarray(ctx.host(got, "loss_scale_update"))
                if h.dtype != expected.dtype or not np.array_equal(h, expected):
                    raise CheckFailedError(
                        f"loss_scale_update case {n} after step {i} (flags {flags[:i + 1]}): "
                        f"{name} is {h!r}, expected {expected!r}")


def check_all_finite(ctx: Context) -> None:
    np = ctx.np
    k = ctx.kernel("all_finite")
    xs = [ctx.data((3, 4), key="af0"), ctx.data((5,), key="af1")]
    for dt in FLOATS:
        if not ctx.flag(k([ctx.up(x, dt) for x in xs]), f"all_finite[{dt}]"):
            raise CheckFailedError(f"all_finite[{dt}] on finite values: false")
        for bad in (np.inf, np.nan):
            ys = [x.copy() for x in xs]
            ys[1][2] = bad
            if ctx.flag(k([ctx.up(y, dt) for y in ys]), f"all_finite[{dt}]"):
                raise CheckFailedError(f"all_finite[{dt}] with {bad}: true")
    if not ctx.flag(k([ctx.up([3.0e38, 3.0e38], "float32")]), "all_finite"):
        raise CheckFailedError("all_finite on finite values whose sum overflows: false")


def _rates(np: Any, weight_decay: float) -> Any:
    return np.array([0.01 * math.sqrt(1.0 - 0.999**3) / (1.0 - 0.9**3), 0.01 * weight_decay],
                    np.float32)


def _has_float64(be: Any) -> bool:
    """Whether the backend computes in float64 (OpenCL: where the device has cl_khr_fp64)."""
    return getattr(getattr(be, "runtime", None), "fp64", True) is not False


def _as(as_array: bool | str) -> str:
    return "" if not as_array else " as a float32 array" if as_array is True else \
        " as a float64 array"


def check_adam_rates(ctx: Context) -> None:
    """Adam's step size from the device step count, bit for bit the reference's (float64,
    rounded once) at steps from 1 to 10**7, with the rate a number or an array (float32, or
    float64 as a schedule's device rate is)."""
    np = ctx.np
    k = ctx.kernel("adam_rates")
    ref = ctx.rk["adam_rates"]
    for step in (0, 1, 2, 9, 99, 999, 12345, 10**7 - 1):
        for lr, b1, b2, wd in ((1e-3, 0.9, 0.999, 0.0), (3e-4, 0.8, 0.95, 0.004)):
            for as_array in (False, True, "float64")[:3 if _has_float64(ctx.be) else 2]:
                rate = (lr if not as_array else ctx.up(np.float32(lr), "float32")
                        if as_array is True else ctx.up(np.array([lr]), "float64"))
                got = np.asarray(ctx.host(k(ctx.up(np.int64(step), "int64"), rate, b1, b2, wd),
                                          "adam_rates"))
                want = ref(np.array(step, np.int64), lr if not as_array
                           else np.array(np.float32(lr)) if as_array is True
                           else np.array([lr]), b1, b2, wd)
                if got.dtype != np.float32 or not np.array_equal(got, want):
                    raise CheckFailedError(
                        f"adam_rates(iterations={step}, lr={lr}{_as(as_array)}, "
                        f"beta_1={b1}, beta_2={b2}, weight_decay={wd}) is {got!r}, expected "
                        f"{want!r}")


# --- optional fused kernels ---------------------------------------------------------------
def check_softmaxes(ctx: Context) -> None:
    done = []
    for name in ("softmax", "log_softmax"):
        if ctx.k.get(name) is None:
            continue
        host = ctx.data((4, 6), -5, 5, key=name)
        host[0, 0] = 80.0  # exp overflows float32 here unless the max is subtracted
        for axis in (1, 0):
            ctx.expect(ctx.k[name](ctx.up(host, "float32"), axis),
                       ctx.ref_call(name, ctx.ref_up(host, "float32"), axis), "float32",
                       f"{name} axis={axis}", 4)
        # 16-bit too, in the input's dtype: the rewrite may paint softmax 16-bit (an
        # allowlist edit), and a kernel computing in float32 must round back
        for dt in FLOATS[1:]:
            ctx.expect(ctx.k[name](ctx.up(host, dt), 1),
                       ctx.ref_call(name, ctx.ref_up(host, dt), 1), dt, f"{name}[{dt}]", 4)
        done.append(name)
    if not done:
        raise CheckSkippedError("softmax and log_softmax are not provided (optional)")


def check_xent(ctx: Context) -> None:
    fwd = ctx.kernel("sparse_softmax_cross_entropy")
    logits = ctx.data((6, 5), -4, 4, key="xent")
    labels = [0, 4, 2, 2, 1, 3]
    loss, probs = fwd(ctx.up(logits, "float32"), ctx.up(labels, "int32"))
    rl, rp = ctx.rk["sparse_softmax_cross_entropy"](ctx.ref_up(logits, "float32"),
                                                    ctx.ref_up(labels, "int32"))
    ctx.expect(loss, ctx.ref_host(rl), "float32", "sparse_softmax_cross_entropy loss", 4)
    ctx.expect(probs, ctx.ref_host(rp), "float32", "sparse_softmax_cross_entropy softmax", 4)
    grad = ctx.k.get("sparse_softmax_cross_entropy_grad")
    if grad is not None:
        g = ctx.data((6,), 0.5, 2, key="xent-g")
        want = ctx.rounded(ctx.host(probs, "probs"), "float32")
        want[range(6), labels] -= 1.0
        want *= ctx.rounded(g, "float32")[:, None]
        ctx.expect(grad(probs, ctx.up(labels, "int32"), ctx.up(g, "float32")), want, "float32",
                   "sparse_softmax_cross_entropy_grad", 4)


def check_relu_grad_bias_add(dtype: str) -> Callable[[Context], None]:
    def run(ctx: Context) -> None:
        done = []
        if ctx.k.get("relu_grad") is not None:
            g, y = ctx.data((3, 4), key="rg-g"), ctx.data((3, 4), key="rg-y")
            y[0, 0] = 0.0
            ctx.expect(ctx.k["relu_grad"](ctx.up(g, dtype), ctx.up(y, dtype)),
                       ctx.rounded(g, dtype) * (ctx.rounded(y, dtype) > 0), dtype,
                       f"relu_grad[{dtype}]")
            done.append("relu_grad")
        if ctx.k.get("relu_grad_bias") is not None:
            for shape in ((5, 4), (2, 3, 4)):
                g, y = ctx.data(shape, key="rgb-g"), ctx.data(shape, key="rgb-y")
                y.reshape(-1)[0] = 0.0
                want = ctx.rounded(g, dtype) * (ctx.rounded(y, dtype) > 0)
                got = ctx.k["relu_grad_bias"](ctx.up(g, dtype), ctx.up(y, dtype))
                if not isinstance(got, tuple) or len(got) != 2:
                    raise CheckFailedError("relu_grad_bias must return (relu_grad, bias grad)")
                ctx.expect(got[0], want, dtype, f"relu_grad_bias[{dtype}] {shape}: relu_grad")
                rows = want.reshape(-1, shape[-1])
                ctx.expect(got[1], rows.sum(axis=0), dtype,
                           f"relu_grad_bias[{dtype}] {shape}: bias grad", 2,
                           magnitude=abs(rows).sum(axis=0))
            done.append("relu_grad_bias")
        if ctx.k.get("bias_add") is not None:
            for shape in ((3, 4), (2, 3, 4)):
                x, b = ctx.data(shape, key="ba-x"), ctx.data((4,), key="ba-b")
                ctx.expect(ctx.k["bias_add"](ctx.up(x, dtype), ctx.up(b, dtype)),
                           ctx.ref_call("add", ctx.ref_up(x, dtype), ctx.ref_up(b, dtype)),
                           dtype, f"bias_add[{dtype}] {shape} + (4,)", 2)
            done.append("bias_add")
        if not done:
            raise CheckSkippedError("relu_grad, relu_grad_bias and bias_add are not provided "
                                    "(optional)")

    return run


def check_dense(dtype: str) -> Callable[[Context], None]:
    def run(ctx: Context) -> None:
        np = ctx.np
        k = ctx.kernel("dense")
        w = ctx.data((7, 3), key="dense-w")
        b = ctx.data((3,), key="dense-b")
        for shape in ((5, 7), (2, 3, 7)):
            x = ctx.data(shape, key=("dense-x", shape))
            z = ctx.rounded(x, dtype) @ ctx.rounded(w, dtype)
            mag = np.abs(ctx.rounded(x, dtype)) @ np.abs(ctx.rounded(w, dtype))
            for bias in (None, b):
                for activation in (None, "relu"):
                    want = z if bias is None else z + ctx.rounded(bias, dtype)
                    if activation == "relu":
                        want = np.maximum(want, 0.0)
                    got = k(ctx.up(x, dtype), ctx.up(w, dtype),
                            None if bias is None else ctx.up(bias, dtype), activation)
                    ctx.expect(got, want, dtype,
                               f"dense[{dtype}] x {shape} bias={bias is not None} "
                               f"activation={activation}", 2, mag)

    return run


def check_dropout_mask(ctx: Context) -> None:
    np = ctx.np
    k = ctx.kernel("dropout_mask")
    n = 4096 if ctx.quick else 65536
    for dtype in FLOATS:
        for rate in (0.25, 0.5):
            what = f"dropout_mask[{dtype}] rate={rate}"
            a = ctx.host(k((n,), rate, dtype, 3), what)
            if a.dtype != ctx.np_dtypes[dtype] or a.shape != (n,):
                raise CheckFailedError(f"{what}: returned {a.dtype.name} {a.shape}")
            keep = ctx.rounded(1.0 / (1.0 - rate), dtype)
            v = a.astype(np.float64)
            if not np.all((v == 0) | (v == keep)):
                raise CheckFailedError(f"{what}: values other than 0 and {keep}")
            frac = float((v == 0).mean())
            if abs(frac - rate) > 6 * math.sqrt(rate * (1 - rate) / n):
                raise CheckFailedError(f"{what}: {frac:.3f} of the values dropped")
            if not np.array_equal(a, ctx.host(k((n,), rate, dtype, 3), what)):
                raise CheckFailedError(f"{what}: the same seed gives different masks")


def check_random_permutation(ctx: Context) -> None:
    np = ctx.np
    k = ctx.kernel("random_permutation")
    for n in (0, 1, 1000):
        what = f"random_permutation({n})"
        a = ctx.host(k(n, 11), what)
        if a.dtype != np.int64 or a.shape != (n,):
            raise CheckFailedError(f"{what}: returned {a.dtype.name} {a.shape}, not int64 ({n},)")
        if not np.array_equal(np.sort(a), np.arange(n)):
            raise CheckFailedError(f"{what}: not a permutation of range({n})")
        if not np.array_equal(a, ctx.host(k(n, 11), what)):
            raise CheckFailedError(f"{what}: the same seed gives different orders")
    if np.array_equal(ctx.host(k(1000, 11), "a"), ctx.host(k(1000, 12), "b")):
        raise CheckFailedError("random_permutation(1000): seeds 11 and 12 give the same order")


def check_optimizer(name: str) -> Callable[[Context], str]:
    def run(ctx: Context) -> str:
        np = ctx.np
        k = ctx.kernel(name)
        shape = (4, 5)
        var0 = ctx.data(shape, key=(name, "var"))
        grad0 = ctx.data(shape, -0.5, 0.5, key=(name, "grad"))
        slot0 = {"velocity": ctx.data(shape, -0.1, 0.1, key=(name, "vel")),
                 "ms": ctx.data(shape, 0.01, 0.2, key=(name, "ms")),
                 "mom": ctx.data(shape, -0.1, 0.1, key=(name, "mom")),
                 "m": ctx.data(shape, -0.1, 0.1, key=(name, "m")),
                 "v": ctx.data(shape, 0.01, 0.2, key=(name, "v"))}
        variants: list[tuple[str, list[str | None], tuple[Any, ...]]]
        # "... device rate": the rate given as a float32 device scalar (a schedule's)
        if name == "sgd_update":
            variants = [("plain", [None], (0.1, 0.0, False)),
                        ("momentum", ["velocity"], (0.1, 0.9, False)),
                        ("nesterov", ["velocity"], (0.1, 0.9, True)),
                        ("momentum device rate", ["velocity"], (0.1, 0.9, False))]
        elif name == "rmsprop_update":
            variants = [("plain", ["ms", None], (0.01, 0.9, 0.0, 1e-7)),
                        ("momentum", ["ms", "mom"], (0.01, 0.9, 0.5, 1e-7)),
                        ("plain device rate", ["ms", None], (0.01, 0.9, 0.0, 1e-7))]
        else:
            # (alpha, lr*wd) at step 3, lr 0.01: adam_rates' values, given as a device array
            variants = [("adam", ["m", "v"], (_rates(np, 0.0), 0.9, 0.999, 1e-7, 0.0)),
                        ("adamw", ["m", "v"], (_rates(np, 0.01), 0.9, 0.999, 1e-7, 0.01))]
        ok_flag = ctx.k["unscale_and_check"]([ctx.up(grad0, "float32")], 1.0)[1]
        bad_flag = ctx.k["unscale_and_check"]([ctx.up([np.inf], "float32")], 1.0)[1]
        for label, slots, hyper in variants:
            for flag_name, flag in (("None", None), ("true", ok_flag), ("false", bad_flag)):
                what = f"{name} {label} flag={flag_name}"
                var = ctx.up(var0, "float32")
                grad = ctx.up(grad0, "float32")
                bufs = [None if s is None else ctx.up(slot0[s], "float32") for s in slots]
                rvar = ctx.ref.asarray(np.array(var0, np.float32), "float32")
                rbufs = [None if s is None else ctx.ref.asarray(np.array(slot0[s], np.float32),
                                                                "float32") for s in slots]
                args, rargs = hyper, hyper
                if name == "adam_update":
                    args = (ctx.up(hyper[0], "float32"), *hyper[1:])
                    rargs = (ctx.ref.asarray(hyper[0].copy(), "float32"), *hyper[1:])
                elif label.endswith("device rate"):
                    rate = np.array(hyper[0], np.float32)
                    args = (ctx.up(rate, "float32"), *hyper[1:])
                    rargs = (ctx.ref.asarray(rate.copy(), "float32"), *hyper[1:])
                out = k(var, grad, *bufs, *args, flag)
                if out is not None:
                    raise CheckFailedError(f"{what}: returned {type(out).__name__}; fused updates "
                                           "work in place and return None")
                if flag_name == "false":
                    wants = [var0, *[slot0[s] for s in slots if s is not None]]
                    grad_after = ctx.host(grad, what)
                    if not np.array_equal(grad_after, grad0.astype(np.float32)):
                        raise CheckFailedError(f"{what}: the gradient buffer changed")
                else:
                    ctx.rk[name](rvar, ctx.ref.asarray(np.array(grad0, np.float32), "float32"),
                                 *rbufs, *rargs, None)
                    wants = [ctx.ref_host(rvar), *[ctx.ref_host(b) for b in rbufs
                                                   if b is not None]]
                gots = [var, *[b for b in bufs if b is not None]]
                labels = ["var", *[s for s in slots if s is not None]]
                for buf, want, lab in zip(gots, wants, labels):
                    if flag_name == "false":
                        h = ctx.host(buf, what)
                        if not np.array_equal(h, np.asarray(want, np.float32)):
                            raise CheckFailedError(f"{what}: {lab} changed although the flag is "
                                                   "false (a skipped step must leave every buffer "
                                                   "untouched)")
                    else:
                        ctx.expect(buf, want, "float32", f"{what}: {lab}", 8)
        return f"{len(variants)} variants x flag None/true/false"

    return run




# (kh, kw, stride_h, stride_w, pads) on a (2, 5, 6, 3) image: "same" 3x3, strided "same" with
# the odd pad at the bottom/right, strided 1x1, and a non-square window with unequal strides
CONV_CASES = ((3, 3, 1, 1, (1, 1, 1, 1)), (3, 3, 2, 2, (1, 1, 0, 1)), (1, 1, 2, 2, (0, 0, 0, 0)),
              (3, 2, 2, 1, (0, 0, 0, 0)))


def _conv_reference(ctx: Context, dtype: str, case: tuple[Any, ...], x: Any, w: Any,
                    dy: Any) -> tuple[Any, Any, Any]:
    """(y, dx, dw) on the reference, in float64, as the core's composite computes them: im2col,
    one matmul, and for the gradients matmuls and col2im (dx, dw None where ``dy`` is)."""
    kh, kw, sh, sw, pads = case
    rk = ctx.rk
    k, filters = kh * kw * x.shape[3], w.shape[3]
    cols = rk["extract_patches"](ctx.ref_up(x, dtype), kh, kw, sh, sw, pads)
    n, oh, ow = ctx.ref_host(cols).shape[:3]
    flat = rk["reshape"](cols, (n * oh * ow, k))
    w2 = rk["reshape"](ctx.ref_up(w, dtype), (k, filters))
    y = ctx.ref_host(rk["matmul"](flat, w2, False, False)).reshape(n, oh, ow, filters)
    if dy is None:
        return y, None, None
    g = rk["reshape"](ctx.ref_up(dy, dtype), (n * oh * ow, filters))
    dcols = rk["reshape"](rk["matmul"](g, w2, False, True), (n, oh, ow, k))
    dx = ctx.ref_call("extract_patches_grad", dcols, x.shape, kh, kw, sh, sw, pads)
    dw = ctx.ref_host(rk["matmul"](flat, g, True, False)).reshape(w.shape)
    return y, dx, dw


def check_conv2d(dtype: str) -> Callable[[Context], None]:
    """The fused convolution kernels against the reference's composite in float64 on the
    values the tested backend holds in ``dtype``. A 16-bit result may be rounded once (float32
    accumulation) or, as the composite does, the image gradient's window terms may be added in
    ``dtype``: up to kh*kw roundings of the sum of magnitudes."""
    def run(ctx: Context) -> None:
        np = ctx.np
        names = ("conv2d", "conv2d_backprop_input", "conv2d_backprop_filter")
        ks = [ctx.kernel(name) for name in names]
        shape = (2, 5, 6, 3)
        x = ctx.data(shape, key="conv-x")
        widen = float(np.finfo(ctx.np_dtypes[dtype]).eps / np.finfo(np.float32).eps)
        for case in CONV_CASES:
            kh, kw, sh, sw, pads = case
            what = f"[{dtype}] window {kh}x{kw} strides {sh}x{sw} pads {pads}"
            w = ctx.data((kh, kw, shape[3], 4), key=("conv-w", kh, kw))
            y_shape = _conv_reference(ctx, dtype, case, x, w, None)[0].shape
            dy = ctx.data(y_shape, key=("conv-dy", case))
            want = _conv_reference(ctx, dtype, case, x, w, dy)
            mags = _conv_reference(ctx, dtype, case, abs(ctx.rounded(x, dtype)),
                                   abs(ctx.rounded(w, dtype)), abs(ctx.rounded(dy, dtype)))
            got = (ks[0](ctx.up(x, dtype), ctx.up(w, dtype), sh, sw, pads),
                   ks[1](ctx.up(dy, dtype), ctx.up(w, dtype), shape, sh, sw, pads),
                   ks[2](ctx.up(x, dtype), ctx.up(dy, dtype), w.shape, sh, sw, pads))
            for i, name in enumerate(names):
                rounds = kh * kw if i == 1 else 1
                ctx.expect(got[i], want[i], dtype, name + what, 2,
                           magnitude=mags[i] * (widen * rounds if widen > 1 else 1))

    return run
