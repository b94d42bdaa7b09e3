"""The value checks of the required array kernels, against the reference in float64: creation,
elementwise (broadcasting, Python-scalar operands, inf and nan), reductions over axes with
keepdims, matmul transposes and batches, shape ops, indexing and the image kernels, in float32
and, where the core calls the kernel in 16 bits, float16 and bfloat16."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from mpcore.conformance.harness import FLOATS, CheckFailedError, Context


# --- creation -----------------------------------------------------------------------------
def check_asarray(ctx: Context) -> None:
    np = ctx.np
    cases: list[tuple[Any, str]] = [
        ([[1.0, -2.5], [0.0, 65504.0]], "float32"), ([[1.0, -2.5], [0.0, 65504.0]], "float16"),
        ([[1.0, -2.5], [0.0, 256.0]], "bfloat16"), ([3, -7, 0], "int32"),
        ([2**40, -1], "int64"), ([True, False, True], "bool"), (2.5, "float32"),
        (np.arange(6.0).reshape(2, 3), "float16"), ([], "float32")]
    for value, dtype in cases:
        want = np.asarray(value, dtype=ctx.np_dtypes[dtype])
        ctx.expect(ctx.be.asarray(value, dtype), want, dtype, f"asarray({value!r}, {dtype})")


def check_full(ctx: Context) -> None:
    np = ctx.np
    for dtype in (*FLOATS, "int32", "bool"):
        for shape, value in (((2, 3), 1.5 if dtype in FLOATS else 1), ((), 0), ((0, 4), 7)):
            want = np.full(shape, value, dtype=ctx.np_dtypes[dtype])
            ctx.expect(ctx.k["full"](shape, value, dtype), want, dtype,
                       f"full({shape}, {value}, {dtype})")


def check_cast(ctx: Context) -> None:
    values = [0.0, 1.0, -2.0, 3.0, 1.2345678, -0.001, 250.0, 65504.0, 1e5, -1e5, 3.0e-5]
    dtypes = (*FLOATS, "int32", "bool")
    for src in dtypes:
        vals = [v for v in values if abs(v) < 2e4] if src in ("int32", "bool") else values
        with ctx.np.errstate(over="ignore"):  # 1e5 is inf in float16, on purpose
            host = ctx.np.asarray(vals, dtype=ctx.np_dtypes[src]) if src != "bool" else \
                ctx.np.asarray([v != 0 for v in vals])
        x = ctx.up(host, src)
        rx = ctx.rk["asarray"](host, src)
        for dst in dtypes:
            if src in FLOATS and dst == "int32":
                continue  # out-of-range float -> int is undefined behaviour in C
            ctx.expect(ctx.k["cast"](x, dst), ctx.ref_call("cast", rx, dst), dst,
                       f"cast {src} -> {dst}")


def check_copy(ctx: Context) -> None:
    for dtype in (*FLOATS, "int32", "bool"):
        host = ctx.data((3, 4), key=dtype) > 0 if dtype == "bool" else ctx.data((3, 4), key=dtype)
        x = ctx.up(host, dtype)
        y = ctx.k["copy"](x)
        if y is x:
            raise CheckFailedError(f"copy[{dtype}] returned its input; it must be a new array "
                                   "(Variables own theirs and kernels update them in place)")
        ctx.expect(y, ctx.host(x, "copy"), dtype, f"copy[{dtype}]")


# --- elementwise --------------------------------------------------------------------------
# kernel -> (input range, tolerance scale)
UNARY: dict[str, tuple[tuple[float, float], float]] = {
    "negative": ((-3, 3), 1), "abs": ((-3, 3), 1), "sign": ((-3, 3), 1),
    "exp": ((-3, 3), 4), "log": ((0.1, 5), 4), "sqrt": ((0.1, 5), 2), "square": ((-3, 3), 2),
    "relu": ((-3, 3), 1), "sigmoid": ((-6, 6), 4), "tanh": ((-3, 3), 4), "erf": ((-3, 3), 4),
    # more than a period each way: a range reduction that fails beyond pi/4 shows
    "cos": ((-7, 7), 4), "sin": ((-7, 7), 4),
}
BINARY: dict[str, tuple[tuple[float, float], float]] = {
    "add": ((-2, 2), 2), "subtract": ((-2, 2), 2), "multiply": ((-2, 2), 2),
    "divide": ((0.5, 2), 2), "power": ((0.5, 2), 4), "maximum": ((-2, 2), 1),
    "minimum": ((-2, 2), 1),
}
COMPARISONS = ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")


def check_unary(name: str, dtype: str) -> Callable[[Context], None]:
    (lo, hi), scale = UNARY[name]

    def run(ctx: Context) -> None:
        ctx.low_ok(name, dtype)
        host = ctx.data((3, 5), lo, hi, key=name)
        if name in ("sign", "relu", "abs"):
            host[0, :3] = (0.0, -0.0, 1.0)
        want = ctx.ref_call(name, ctx.ref_up(host, dtype))
        ctx.expect(ctx.k[name](ctx.up(host, dtype)), want, dtype, f"{name}[{dtype}]", scale)
        if dtype == "float32" and name in ("negative", "abs", "relu", "sign", "exp", "sqrt",
                                           "tanh", "cos", "sin"):
            special = ctx.np.asarray([ctx.np.inf, -ctx.np.inf, ctx.np.nan, 0.0])
            if name == "sqrt":
                special = special[[0, 3]]
            ctx.expect(ctx.k[name](ctx.up(special, dtype)),
                       ctx.ref_call(name, ctx.ref_up(special, dtype)), dtype,
                       f"{name}[{dtype}] on inf/nan", scale)

    return run


def check_binary(name: str, dtype: str) -> Callable[[Context], None]:
    (lo, hi), scale = BINARY[name]

    def run(ctx: Context) -> None:
        ctx.low_ok(name, dtype)
        k, rk = ctx.k[name], ctx.rk[name]
        integer = dtype == "int32"

        def make(shape: tuple[int, ...], key: str) -> Any:
            d = ctx.data(shape, lo, hi + 0.5, key=(name, key))
            return ctx.np.round(d * 3) if integer else d

        shapes = [((3, 4), (3, 4)), ((3, 4), (4,)), ((4,), (3, 4)), ((3, 1), (1, 4)),
                  ((2, 3, 4), (3, 1)), ((), (2, 3))]
        for sa, sb in shapes:
            a, b = make(sa, "a"), make(sb, "b")
            want = ctx.ref_host(rk(ctx.ref_up(a, dtype), ctx.ref_up(b, dtype)))
            ctx.expect(k(ctx.up(a, dtype), ctx.up(b, dtype)), want, dtype,
                       f"{name}[{dtype}] {sa} with {sb}", scale)
        a = make((2, 3), "s")
        scalars: tuple[float | int, ...] = (2, 3) if integer else (1.5, 2, 0.25)
        for s in scalars:
            ra = ctx.ref_up(a, dtype)
            ctx.expect(k(ctx.up(a, dtype), s), ctx.ref_host(rk(ra, s)), dtype,
                       f"{name}[{dtype}](x, Python scalar {s!r})", scale)
            ctx.expect(k(s, ctx.up(a, dtype)), ctx.ref_host(rk(s, ra)), dtype,
                       f"{name}[{dtype}](Python scalar {s!r}, x)", scale)

    return run


def check_comparison(dtype: str) -> Callable[[Context], None]:
    def run(ctx: Context) -> None:
        np = ctx.np
        a = np.asarray([[1, 2, 3], [4, 5, 6]], dtype=np.float64)
        b = np.asarray([3, 2, 4], dtype=np.float64)
        special = np.asarray([np.nan, 1.0, np.inf, -np.inf])
        for name in COMPARISONS:
            k, rk = ctx.k[name], ctx.rk[name]
            ctx.expect(k(ctx.up(a, dtype), ctx.up(b, dtype)),
                       ctx.ref_host(rk(ctx.ref_up(a, dtype), ctx.ref_up(b, dtype))), "bool",
                       f"{name}[{dtype}] (2, 3) with (3,)")
            ctx.expect(k(ctx.up(a, dtype), 3), ctx.ref_host(rk(ctx.ref_up(a, dtype), 3)),
                       "bool", f"{name}[{dtype}](x, Python scalar 3)")
            ctx.expect(k(3, ctx.up(a, dtype)), ctx.ref_host(rk(3, ctx.ref_up(a, dtype))),
                       "bool", f"{name}[{dtype}](Python scalar 3, x)")
            if dtype in FLOATS:
                ctx.expect(k(ctx.up(special, dtype), ctx.up(special[::-1], dtype)),
                           ctx.ref_host(rk(ctx.ref_up(special, dtype),
                                           ctx.ref_up(special[::-1], dtype))),
                           "bool", f"{name}[{dtype}] with nan and inf")

    return run


def check_logical(ctx: Context) -> None:
    np = ctx.np
    p = np.asarray([[True, True, False, False]])
    q = np.asarray([[True], [False]])
    for name in ("logical_and", "logical_or"):
        ctx.expect(ctx.k[name](ctx.up(p, "bool"), ctx.up(q, "bool")),
                   ctx.ref_call(name, ctx.ref_up(p, "bool"), ctx.ref_up(q, "bool")), "bool",
                   f"{name} (1, 4) with (2, 1)")
    ctx.expect(ctx.k["logical_not"](ctx.up(p, "bool")), ~p, "bool", "logical_not")


def check_isfinite(ctx: Context) -> None:
    np = ctx.np
    x = np.asarray([[1.0, np.inf, -np.inf], [np.nan, 0.0, -3.5]])
    for dtype in FLOATS:
        ctx.expect(ctx.k["isfinite"](ctx.up(x, dtype)), np.isfinite(x), "bool",
                   f"isfinite[{dtype}]")


def check_where(dtype: str) -> Callable[[Context], None]:
    def run(ctx: Context) -> None:
        x = ctx.data((3, 4), key="where-x")
        cond = x > 0
        for sa, sb in (((3, 4), (3, 4)), ((3, 4), (4,)), ((1, 4), ())):
            a, b = ctx.data(sa, key="where-a"), ctx.data(sb, 5, 6, key="where-b")
            want = ctx.ref_call("where", ctx.ref_up(cond, "bool"), ctx.ref_up(a, dtype),
                                ctx.ref_up(b, dtype))
            ctx.expect(ctx.k["where"](ctx.up(cond, "bool"), ctx.up(a, dtype), ctx.up(b, dtype)),
                       want, dtype, f"where[{dtype}] cond (3, 4), {sa}, {sb}")

    return run


# --- reductions ---------------------------------------------------------------------------
AXES: tuple[tuple[int, ...] | None, ...] = (None, (0,), (1,), (2,), (0, 2))


def check_reduction(name: str, dtype: str) -> Callable[[Context], None]:
    def run(ctx: Context) -> None:
        ctx.low_ok(name, dtype)
        np = ctx.np
        if dtype == "int32":
            host = np.round(ctx.data((2, 3, 4), -50, 50, key=name))
        else:
            host = ctx.data((2, 3, 4), key=name)
        for axis in AXES:
            for keepdims in (False, True):
                x, rx = ctx.up(host, dtype), ctx.ref_up(host, dtype)
                want = ctx.ref_call(name, rx, axis, keepdims)
                mag = (ctx.ref_call(name, ctx.ref_up(np.abs(host), dtype), axis, keepdims)
                       if name in ("sum", "mean") else None)
                ctx.expect(ctx.k[name](x, axis, keepdims), want, dtype,
                           f"{name}[{dtype}] axis={axis} keepdims={keepdims}", 2, mag)

    return run


def check_argmax(dtype: str) -> Callable[[Context], None]:
    def run(ctx: Context) -> None:
        np = ctx.np
        # distinct values exactly representable in every dtype: no ties to break
        host = ctx.rng("argmax").permutation(24).reshape(2, 3, 4).astype(np.float64) - 12
        for axis in (0, 1, 2):
            ctx.expect(ctx.k["argmax"](ctx.up(host, dtype), axis), np.argmax(host, axis),
                       "int64", f"argmax[{dtype}] axis={axis}")

    return run


# --- matmul -------------------------------------------------------------------------------
def check_matmul(dtype: str) -> Callable[[Context], None]:
    def run(ctx: Context) -> None:
        np = ctx.np
        # odd sizes catch a swapped dimension; square ones a transpose ignored where shapes
        # cannot tell
        sizes = [(5, 7, 3) if ctx.quick else (17, 33, 9), (4, 4, 4)]
        for (m, k, n), batch in itertools.product(sizes, ((), (2,))):
            for ta in (False, True):
                for tb in (False, True):
                    sa = (*batch, *((k, m) if ta else (m, k)))
                    sb = (*batch, *((n, k) if tb else (k, n)))
                    a, b = ctx.data(sa, key=("mm-a", sa)), ctx.data(sb, key=("mm-b", sb))
                    want = ctx.ref_call("matmul", ctx.ref_up(a, dtype), ctx.ref_up(b, dtype),
                                        ta, tb)
                    mag = ctx.ref_call("matmul", ctx.ref_up(np.abs(a), dtype),
                                       ctx.ref_up(np.abs(b), dtype), ta, tb)
                    ctx.expect(ctx.k["matmul"](ctx.up(a, dtype), ctx.up(b, dtype), ta, tb),
                               want, dtype,
                               f"matmul[{dtype}] {sa}{'^T' if ta else ''} @ "
                               f"{sb}{'^T' if tb else ''}", 2, mag)

    return run


# --- shapes and indexing ------------------------------------------------------------------
def check_shapes(dtype: str) -> Callable[[Context], None]:
    def run(ctx: Context) -> None:
        np = ctx.np
        host = ctx.data((2, 3, 4), key="shapes")
        x, rx = ctx.up(host, dtype), ctx.ref_up(host, dtype)
        for shape in ((6, 4), (4, 6), (24,), (2, 12), (1, 2, 3, 4)):
            ctx.expect(ctx.k["reshape"](x, shape), ctx.ref_call("reshape", rx, shape), dtype,
                       f"reshape[{dtype}] (2, 3, 4) -> {shape}")
        for perm in ((2, 0, 1), (0, 2, 1), (1, 0, 2), (0, 1, 2)):
            ctx.expect(ctx.k["transpose"](x, perm), ctx.ref_call("transpose", rx, perm), dtype,
                       f"transpose[{dtype}] perm={perm}")
        # a transposed view fed to another kernel must read in the logical order
        t = ctx.k["transpose"](x, (2, 0, 1))
        ctx.expect(ctx.k["reshape"](t, (4, 6)),
                   ctx.ref_call("reshape", ctx.rk["transpose"](rx, (2, 0, 1)), (4, 6)), dtype,
                   f"reshape[{dtype}] of a transpose")
        for src, shape in (((4,), (3, 4)), ((3, 1), (3, 4)), ((), (2, 2)), ((1, 4), (2, 3, 4))):
            h = ctx.data(src, key=("bc", src))
            ctx.expect(ctx.k["broadcast_to"](ctx.up(h, dtype), shape),
                       ctx.ref_call("broadcast_to", ctx.ref_up(h, dtype), shape), dtype,
                       f"broadcast_to[{dtype}] {src} -> {shape}")
        parts = [ctx.data((2, 3), key="c0"), ctx.data((1, 3), key="c1"),
                 ctx.data((3, 3), key="c2")]
        ctx.expect(ctx.k["concat"]([ctx.up(p, dtype) for p in parts], 0),
                   np.concatenate([ctx.rounded(p, dtype) for p in parts], 0), dtype,
                   f"concat[{dtype}] axis 0 of (2, 3), (1, 3), (3, 3)")
        parts = [ctx.data((2, 1, 4), key="d0"), ctx.data((2, 3, 4), key="d1")]
        ctx.expect(ctx.k["concat"]([ctx.up(p, dtype) for p in parts], 1),
                   np.concatenate([ctx.rounded(p, dtype) for p in parts], 1), dtype,
                   f"concat[{dtype}] axis 1 of (2, 1, 4), (2, 3, 4)")

    return run


def check_take(dtype: str) -> Callable[[Context], None]:
    def run(ctx: Context) -> None:
        host = ctx.data((5, 3), key="take")
        x, rx = ctx.up(host, dtype), ctx.ref_up(host, dtype)
        cases = (([4, 0, 0, 2], "int32", 0), ([2, 0], "int64", 1), ([[1, 3], [0, 4]], "int32", 0))
        for idx, idt, axis in cases:
            want = ctx.ref_call("take", rx, ctx.ref_up(idx, idt), axis)
            ctx.expect(ctx.k["take"](x, ctx.up(idx, idt), axis), want, dtype,
                       f"take[{dtype}] indices {idx} ({idt}) axis={axis}")
        # repeated indices must accumulate, not overwrite
        g = ctx.data((4, 3), key="take-g")
        for idx, idt in (([4, 0, 0, 2], "int32"), ([1, 1, 1, 1], "int64")):
            want = ctx.ref_call("take_grad", ctx.ref_up(g, dtype), ctx.ref_up(idx, idt), 0,
                                (5, 3))
            ctx.expect(ctx.k["take_grad"](ctx.up(g, dtype), ctx.up(idx, idt), 0, (5, 3)), want,
                       dtype, f"take_grad[{dtype}] indices {idx} axis=0 (repeats accumulate)",
                       2)
        g = ctx.data((5, 2), key="take-g1")
        want = ctx.ref_call("take_grad", ctx.ref_up(g, dtype), ctx.ref_up([2, 2], "int32"), 1,
                            (5, 3))
        ctx.expect(ctx.k["take_grad"](ctx.up(g, dtype), ctx.up([2, 2], "int32"), 1, (5, 3)),
                   want, dtype, f"take_grad[{dtype}] indices [2, 2] axis=1", 2)

    return run


GETITEM_KEYS: tuple[tuple[Any, ...], ...] = (
    (1,), (slice(1, None),), (slice(None, None, 2), slice(1, 3)), (Ellipsis, 0),
    (None, slice(None), -1), (slice(None, None, -1),), (-1, slice(None), 2),
    (slice(0, 0),), (0, 1, 2),
)


def check_getitem(dtype: str) -> Callable[[Context], None]:
    def run(ctx: Context) -> None:
        host = ctx.data((3, 4, 5), key="getitem")
        x, rx = ctx.up(host, dtype), ctx.ref_up(host, dtype)
        for key in GETITEM_KEYS:
            want = ctx.ref_call("getitem", rx, key)
            ctx.expect(ctx.k["getitem"](x, key), want, dtype, f"getitem[{dtype}] key={key}")
            g = ctx.data(want.shape, key=("gi", key))
            ctx.expect(ctx.k["getitem_grad"](ctx.up(g, dtype), key, (3, 4, 5)),
                       ctx.ref_call("getitem_grad", ctx.ref_up(g, dtype), key, (3, 4, 5)),
                       dtype, f"getitem_grad[{dtype}] key={key}")

    return run


def check_one_hot(ctx: Context) -> None:
    for dtype in FLOATS:
        for idx, idt in (([0, 2, 1, 3], "int32"), ([[3, 0], [1, 1]], "int64")):
            want = ctx.ref_call("one_hot", ctx.ref_up(idx, idt), 4, dtype)
            ctx.expect(ctx.k["one_hot"](ctx.up(idx, idt), 4, dtype), want, dtype,
                       f"one_hot indices {idx} ({idt}) depth 4 -> {dtype}")


# --- images -------------------------------------------------------------------------------
IMAGE_CASES = ((3, 2, 1, 1, (0, 0, 0, 0)), (3, 3, 2, 2, (1, 1, 0, 1)), (2, 2, 2, 1, (0, 1, 1, 0)))


def _image_input(ctx: Context, shape: tuple[int, ...]) -> Any:
    # distinct small integers: exact in every dtype, so the max of a window is unique
    np = ctx.np
    n = math.prod(shape)
    return (ctx.rng("image", shape).permutation(n) - n // 2).astype(np.float64).reshape(shape)


def _geometry(size: tuple[int, int], window: tuple[int, int], strides: tuple[int, int],
              pads: tuple[int, int, int, int]) -> tuple[int, int]:
    oh = (size[0] + pads[0] + pads[1] - window[0]) // strides[0] + 1
    ow = (size[1] + pads[2] + pads[3] - window[1]) // strides[1] + 1
    return oh, ow


def check_patches(dtype: str) -> Callable[[Context], None]:
    def run(ctx: Context) -> None:
        shape = (2, 5, 6, 3)
        host = _image_input(ctx, shape)
        x, rx = ctx.up(host, dtype), ctx.ref_up(host, dtype)
        for kh, kw, sh, sw, pads in IMAGE_CASES:
            what = f"[{dtype}] window {kh}x{kw} strides {sh}x{sw} pads {pads}"
            want = ctx.ref_call("extract_patches", rx, kh, kw, sh, sw, pads)
            ctx.expect(ctx.k["extract_patches"](x, kh, kw, sh, sw, pads), want, dtype,
                       "extract_patches" + what)
            g = ctx.data(want.shape, key=("col2im", kh, kw, sh, sw, pads))
            ctx.expect(ctx.k["extract_patches_grad"](ctx.up(g, dtype), shape, kh, kw, sh, sw,
                                                     pads),
                       ctx.ref_call("extract_patches_grad", ctx.ref_up(g, dtype), shape, kh, kw,
                                    sh, sw, pads), dtype, "extract_patches_grad" + what, 4)

    return run


def check_pool(dtype: str) -> Callable[[Context], None]:
    def run(ctx: Context) -> None:
        shape = (2, 5, 6, 3)
        host = _image_input(ctx, shape)
        x, rx = ctx.up(host, dtype), ctx.ref_up(host, dtype)
        for ph, pw, sh, sw, pads in IMAGE_CASES:
            what = f"[{dtype}] pool {ph}x{pw} strides {sh}x{sw} pads {pads}"
            want = ctx.ref_call("max_pool2d", rx, ph, pw, sh, sw, pads)
            y = ctx.k["max_pool2d"](x, ph, pw, sh, sw, pads)
            ctx.expect(y, want, dtype, "max_pool2d" + what)
            g = ctx.data(want.shape, key=("pool-g", ph, pw, sh, sw, pads))
            ctx.expect(ctx.k["max_pool2d_grad"](ctx.up(g, dtype), x, y, ph, pw, sh, sw, pads),
                       ctx.ref_call("max_pool2d_grad", ctx.ref_up(g, dtype), rx,
                                    ctx.rk["max_pool2d"](rx, ph, pw, sh, sw, pads), ph, pw, sh,
                                    sw, pads), dtype, "max_pool2d_grad" + what, 2)

    return run


