"""Checks of the optional FP8 kernels (``quantize_fp8``, ``dequantize_fp8``, ``fp8_matmul``,
``fp8_scale``). Codes, dequantised values and scales are compared bit for bit with ml_dtypes
and NumPy computed here on the host (the CPU backend's own reference); the GEMM, whose float32
sums may be added in any order, at float32's tolerance."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from mpcore.conformance.harness import CheckFailedError, CheckSkippedError, Context

FORMATS = ("e4m3", "e5m2")
_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def _kernel(ctx: Context, name: str) -> Any:
    fn = ctx.k.get(name)
    if fn is None:
        raise CheckSkippedError(f"{name} is not provided (optional, but the core cannot compose "
                                "it: the FP8 ops and the mixed_float8 policy need it)")
    return fn


def _np_format(ctx: Context, fmt: str) -> Any:
    import ml_dtypes

    return ctx.np.dtype(ml_dtypes.float8_e4m3fn if fmt == "e4m3" else ml_dtypes.float8_e5m2)


def _inputs(ctx: Context, dtype: str) -> Any:
    """Values across every binade of both formats, their rounding ties, saturation and the
    special values, as ``dtype`` holds them."""
    np = ctx.np
    rng = ctx.rng("fp8 inputs", dtype)
    spread = rng.standard_normal(3000) * 10.0 ** rng.integers(-9, 7, 3000)
    # ties and near-ties: midpoints between neighbouring e4m3/e5m2 values, nudged
    grid = np.concatenate([2.0 ** np.arange(-18, 16) * (1 + k / 8) for k in range(8)])
    ties = np.concatenate([grid * (1 + 1 / 16), grid * (1 + 1 / 32), grid * (1 - 1 / 64)])
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 448.0, 464.0, 480.0, 57344.0, 61440.0,
               1e30, -1e30, 2.0 ** -9, 2.0 ** -10, 1.5 * 2.0 ** -10, 2.0 ** -16, 2.0 ** -17,
               1.5 * 2.0 ** -17, 1e-40]
    values = np.concatenate([spread, ties, -ties, special])
    return ctx.rounded(values, dtype)


def check_quantize(dtype: str) -> Callable[[Context], str]:
    """``quantize_fp8``: codes bit for bit those of ml_dtypes' cast of ``x * scale`` (float32)
    clipped to the format's largest value; amax equal to ``max |x|`` (NaN when x holds one)."""
    def run(ctx: Context) -> str:
        np = ctx.np
        kernel = _kernel(ctx, "quantize_fp8")
        x = _inputs(ctx, dtype)
        for fmt in FORMATS:
            for scale in (1.0, 3.0, 2.0 ** -7, 1024.0):
                with np.errstate(over="ignore", invalid="ignore"):
                    y = np.clip(x.astype(np.float32) * np.float32(scale), -_MAX[fmt], _MAX[fmt])
                    want = y.astype(np.float32).astype(_np_format(ctx, fmt)).view(np.uint8)
                for finite in (False, True):
                    xs = x[np.isfinite(x)] if finite else x
                    codes, amax = kernel(ctx.up(xs, dtype), ctx.up(np.float32(scale), "float32"),
                                         fmt)
                    what = f"quantize_fp8 [{dtype} -> {fmt}, scale {scale:g}]"
                    got = ctx.host(codes, what)
                    expected = want[np.isfinite(x)] if finite else want
                    if got.dtype != np.uint8 or got.shape != expected.shape:
                        raise CheckFailedError(f"{what}: codes of dtype {got.dtype} and shape "
                                               f"{got.shape}, expected uint8 {expected.shape}")
                    bad = np.flatnonzero(got != expected)
                    if bad.size:
                        i = bad[0]
                        raise CheckFailedError(
                            f"{what}: {bad.size} of {got.size} codes differ; x={xs[i]!r} gave "
                            f"{int(got[i]):#04x}, ml_dtypes {int(expected[i]):#04x}")
                    a = np.asarray(ctx.host(amax, what + " amax"), np.float64)
                    wanted = np.max(np.abs(xs))
                    if a.shape != () or not (a == wanted or (np.isnan(a) and np.isnan(wanted))):
                        raise CheckFailedError(f"{what}: amax {a!r}, expected {wanted!r}")
        return f"{x.size} values, both formats, four scales, codes bit-exact"

    return run


def check_dequantize(dtype: str) -> Callable[[Context], str]:
    """``dequantize_fp8`` of every code: ``decode(c) * (1 / scale)`` in float32, rounded once to
    ``dtype``, bit for bit."""
    def run(ctx: Context) -> str:
        np = ctx.np
        kernel = _kernel(ctx, "dequantize_fp8")
        codes = np.arange(256, dtype=np.uint8)
        for fmt in FORMATS:
            values = codes.view(_np_format(ctx, fmt)).astype(np.float32)
            for scale in (1.0, 3.0, 2.0 ** -7):
                with np.errstate(over="ignore", invalid="ignore"):
                    want = (values * (np.float32(1) / np.float32(scale))).astype(
                        ctx.np_dtypes[dtype])
                got = ctx.host(kernel(ctx.be.asarray(codes.copy(), "uint8"),
                                      ctx.up(np.float32(scale), "float32"), fmt, dtype),
                               "dequantize_fp8")
                what = f"dequantize_fp8 [{fmt} -> {dtype}, scale {scale:g}]"
                if got.dtype != want.dtype or got.shape != want.shape:
                    raise CheckFailedError(f"{what}: got {got.dtype} {got.shape}, expected "
                                           f"{want.dtype} {want.shape}")
                g, w = got.astype(np.float64), want.astype(np.float64)
                bad = ~((g == w) | (np.isnan(g) & np.isnan(w)))
                if bad.any():
                    i = int(np.flatnonzero(bad)[0])
                    raise CheckFailedError(f"{what}: code {i:#04x} gave {g[i]!r}, expected "
                                           f"{w[i]!r}")
        return "all 256 codes of both formats, three scales, bit-exact"

    return run


def check_fp8_matmul(dtype: str) -> Callable[[Context], str]:
    """``fp8_matmul``: the exact product of the decoded codes (float64 here), times the
    inverse scales, at float32's tolerance then ``dtype``'s; every transpose combination."""
    def run(ctx: Context) -> str:
        np = ctx.np
        kernel = _kernel(ctx, "fp8_matmul")
        rng = ctx.rng("fp8 matmul", dtype)
        m, k, n = 5, 33, 7
        for ta in (False, True):
            for tb in (False, True):
                a = _finite_codes(ctx, rng, (k, m) if ta else (m, k), "e4m3")
                b = _finite_codes(ctx, rng, (n, k) if tb else (k, n), "e5m2")
                da = a.view(_np_format(ctx, "e4m3")).astype(np.float64)
                db = b.view(_np_format(ctx, "e5m2")).astype(np.float64)
                da, db = (da.T if ta else da), (db.T if tb else db)
                sa, sb = 4.0, 0.5
                want = (da @ db) * (1 / sa) * (1 / sb)
                got = kernel(ctx.be.asarray(a, "uint8"), ctx.be.asarray(b, "uint8"),
                             ctx.up(np.float32(sa), "float32"), ctx.up(np.float32(sb), "float32"),
                             "e4m3", "e5m2", ta, tb, dtype)
                ctx.expect(got, want, dtype, f"fp8_matmul [ta={ta}, tb={tb} -> {dtype}]", 2.0,
                           magnitude=np.abs(da) @ np.abs(db) / (sa * sb))
        return "e4m3 x e5m2, every transpose"

    return run


def _finite_codes(ctx: Context, rng: Any, shape: tuple[int, ...], fmt: str) -> Any:
    np = ctx.np
    codes = rng.integers(0, 256, shape).astype(np.uint8)
    values = codes.view(_np_format(ctx, fmt)).astype(np.float32)
    return np.where(np.isfinite(values), codes, np.uint8(0x38)).astype(np.uint8)


def check_fp8_scale(ctx: Context) -> str:
    """``fp8_scale``: Transformer Engine's rule, with and without power-of-two rounding and a
    margin, bit for bit; zero, NaN and infinite amaxes keep the old scale."""
    np = ctx.np
    kernel = _kernel(ctx, "fp8_scale")
    amaxes = [0.0, math.nan, math.inf, 1e-45, 1e-30, 3.0, 448.0, 449.0, 5.5e-3, 1e38, 7.0, 57344.0]
    for fmt, fp8_max in _MAX.items():
        for margin in (0, 2):
            for pow2 in (False, True):
                for amax in amaxes:
                    a32 = np.float32(amax)
                    got = ctx.host(kernel(ctx.up(a32, "float32"), ctx.up(np.float32(7.0),
                                                                         "float32"),
                                          fp8_max, margin, pow2), "fp8_scale")
                    want = _scale(np, float(a32), fp8_max, margin, pow2)
                    if got.shape != () or got.dtype != np.float32 or float(got) != want:
                        raise CheckFailedError(
                            f"fp8_scale [{fmt}, margin {margin}, power_of_two={pow2}] of amax "
                            f"{amax!r}: got {got!r}, expected {want!r}")
    return "both formats, margins 0 and 2, with and without power-of-two rounding"


def _scale(np: Any, amax: float, fp8_max: float, margin: int, pow2: bool) -> float:
    if not (amax > 0 and math.isfinite(amax)):
        return 7.0
    if pow2:   # the exact floor(log2(fp8_max / amax)), from Python's exact float comparisons
        k = math.floor(math.log2(fp8_max / amax)) + 1
        while math.ldexp(amax, k) > fp8_max:
            k -= 1
        return float(np.float32(math.ldexp(1.0, min(max(k - margin, -149), 127))))
    with np.errstate(over="ignore"):
        sf = (np.float32(fp8_max) / np.float32(amax)) / np.float32(2.0 ** margin)
    return float(np.finfo(np.float32).max) if np.isinf(sf) else float(sf)
