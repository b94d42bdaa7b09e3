"""The FP8 item of the GPU checklist: cuBLASLt's FP8 GEMMs against the emulated ``fp8_matmul`` on
the same codes and scales, then their speed against mpcore's bfloat16 GEMM. One JSON line per
result on stdout, a summary line last; exit status 1 when a check fails::

    MPCORE_BACKEND=cuda python -m mpcore_cuda.fp8_check              # correctness and speed
    python -m mpcore_cuda.fp8_check --no-speed                        # correctness only

Correctness, for the forward GEMM (``x @ w``), dgrad (``g @ w^T``) and wgrad (``x^T @ g``), in
the HYBRID formats (e4m3 operands, e5m2 gradient), float32 and bfloat16 outputs, with
power-of-two and other scales, at shapes that are multiples of 16 (native) and some that are
not (they must take the emulated route and agree bit for bit). The emulated GEMM decodes the
codes exactly, so every product is exact in float32 and the two routes differ only in how the
K products are summed. Tolerance per element (:func:`bound`)::

    |native - emulated| <= (2 K 2^-24 + 2^-12) * (|A| @ |B|) * s + r * |emulated|

``2 K 2^-24 (|A| @ |B|)`` bounds the difference of two float32 sums of the same K terms in any
order; ``2^-12`` covers the FP8 tensor cores' partial sums, which keep about 14 bits before
cuBLASLt promotes them to float32 (DeepSeek-V3's measurement on Hopper; FAST_ACCUM is off);
``r`` is one rounding of the output (2^-23 float32, 2^-7 bfloat16: a sum that differs in its
last bits may round to the neighbouring value). Each line reports the worst ratio to the bound
and to the float32-order term alone, so the run shows which term the tensor cores need.

Speed: 8192 x 4096 x 4096 (the issue's target: FP8 >= 1.6x bfloat16; Transformer Engine reports
1.92x raw), medians of CUDA-event timings: the raw cuBLASLt GEMM (codes already K-contiguous,
FAST_ACCUM off and on), the whole ``fp8_matmul`` kernel (with the kernel's transpose and the
scale), the transpose alone, and ``matmul`` on bfloat16 arrays.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial
from typing import Any

import numpy as np

from .fp8_gemm import tn_operands

F32_ORDER = 2 * 2.0 ** -24
TENSOR_CORE = 2.0 ** -12
OUTPUT_ROUNDING = {"float32": 2.0 ** -23, "bfloat16": 2.0 ** -7}
#: (M, K, N): native shapes, then shapes cuBLASLt must not take (emulated route).
SHAPES = ((256, 512, 384), (1024, 768, 512), (512, 4096, 1024), (96, 80, 48), (128, 784, 10),
          (100, 64, 48))
GEMMS = {"forward": ("x", "w", False, False), "dgrad": ("g", "w", False, True),
         "wgrad": ("x", "g", True, False)}
ENV = "MPCORE_CUDA_FP8_GEMM"


def bound(k: int, abs_product: np.ndarray, scale: float, emulated: np.ndarray,
          out: str) -> np.ndarray:
    """The largest difference allowed per element (module docstring)."""
    return ((F32_ORDER * k + TENSOR_CORE) * abs_product * scale
            + OUTPUT_ROUNDING[out] * np.abs(emulated))


def native_dims(m: int, k: int, n: int) -> bool:
    return not (m % 16 or k % 16 or n % 16)


def _with_route(route: str, fn: Any) -> Any:
    old = os.environ.get(ENV)
    os.environ[ENV] = route
    try:
        return fn()
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


def compare(be: Any, m: int, k: int, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Every GEMM of one Dense shape (x (m, k), w (k, n), g (m, n)), native against emulated."""
    cp = be.cp
    rng = np.random.default_rng(seed)
    data = {"x": rng.standard_normal((m, k)), "w": rng.standard_normal((k, n)) * 0.05,
            "g": rng.standard_normal((m, n)) * 1e-3}
    fmts = {"x": "e4m3", "w": "e4m3", "g": "e5m2"}
    results = []
    for scales in ("power of two", "other"):
        q = {}
        for name, value in data.items():
            top = 448.0 if fmts[name] == "e4m3" else 57344.0
            s = top / float(np.abs(value).max())
            s = 2.0 ** np.floor(np.log2(s)) if scales == "power of two" else s * 0.93
            scale = cp.asarray(np.float32(s))
            codes, _ = be.quantize_fp8(cp.asarray(value, dtype=np.float32), scale, fmts[name])
            q[name] = (codes, scale)
        for gemm, (left, right, ta, tb) in GEMMS.items():
            (a, sa), (b, sb) = q[left], q[right]
            args = (a, b, sa, sb, fmts[left], fmts[right], ta, tb)
            tn = tn_operands(a.shape, b.shape, ta, tb)
            mm, kk, nn = tn.m, tn.k, tn.n
            decoded = [cp.abs(be._fp8_decode(c, f)) for c, f in ((a, fmts[left]),
                                                                 (b, fmts[right]))]
            absprod = cp.asnumpy(be.matmul(*decoded, ta, tb)).astype(np.float64)
            s = float(cp.asnumpy((1 / sa.astype(np.float32)) * (1 / sb.astype(np.float32))))
            for out in ("float32", "bfloat16"):
                route = _with_route("cublaslt", partial(be._fp8_route, mm, kk, nn, fmts[left],
                                                        fmts[right]))
                got = _with_route("cublaslt", partial(be.fp8_matmul, *args, out))
                want = _with_route("emulated", partial(be.fp8_matmul, *args, out))
                got64 = cp.asnumpy(got.astype(np.float32)).astype(np.float64)
                want64 = cp.asnumpy(want.astype(np.float32)).astype(np.float64)
                diff = np.abs(got64 - want64)
                allowed = bound(kk, absprod, s, want64, out)
                f32 = F32_ORDER * kk * absprod * s + OUTPUT_ROUNDING[out] * np.abs(want64)
                ok = bool(np.all(diff <= allowed)) and route.native == native_dims(mm, kk, nn)
                if not route.native:
                    ok = ok and bool(np.array_equal(got64, want64, equal_nan=True))
                results.append({
                    "check": "fp8 gemm", "gemm": gemm, "m": mm, "k": kk, "n": nn,
                    "out": out, "scales": scales, "native": route.native, "ok": ok,
                    "worst_vs_bound": float(np.max(diff / np.maximum(allowed, 1e-300))),
                    "worst_vs_f32_order": float(np.max(diff / np.maximum(f32, 1e-300))),
                    "max_abs_diff": float(diff.max()), "route": route.reason[:120]})
    for name in ("x", "g"):
        codes = q[name][0]
        same = bool(cp.array_equal(be.fp8_transpose(codes), codes.T))
        results.append({"check": "fp8 transpose", "shape": list(codes.shape), "ok": same})
    return results


def _median_ms(cp: Any, fn: Any, reps: int) -> float:
    fn()
    fn()
    times = []
    for _ in range(reps):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def speed(be: Any, m: int = 8192, k: int = 4096, n: int = 4096, reps: int = 20) -> dict[str, Any]:
    """Medians in milliseconds and the speedups over the bfloat16 GEMM."""
    from mpcore_xp import DTYPES

    from .cublaslt import device_gemm

    cp = be.cp
    x = cp.random.standard_normal((m, k), dtype=np.float32)
    w = cp.random.standard_normal((k, n), dtype=np.float32) * 0.05
    one = cp.ones((), dtype=np.float32)
    qx, _ = be.quantize_fp8(x, one * 64, "e4m3")
    qw, _ = be.quantize_fp8(w, one * 1024, "e4m3")
    wt = be.fp8_transpose(qw)
    scale = cp.asarray(np.float32(1 / (64 * 1024)))
    gemm = device_gemm(cp)
    xb, wb = x.astype(DTYPES["bfloat16"]), w.astype(DTYPES["bfloat16"])
    sx, sw = one * 64, one * 1024
    kernel = partial(be.fp8_matmul, qx, qw, sx, sw, "e4m3", "e4m3", False, False)
    ms = {
        "bf16_matmul": _median_ms(cp, partial(be.matmul, xb, wb, False, False), reps),
        "fp8_raw": _median_ms(cp, partial(gemm, qx, wt, scale, "e4m3", "e4m3", "bfloat16"),
                              reps),
        "fp8_raw_fast_accum": _median_ms(
            cp, partial(gemm, qx, wt, scale, "e4m3", "e4m3", "bfloat16", True), reps),
        "fp8_kernel_bf16": _with_route("cublaslt", partial(
            _median_ms, cp, partial(kernel, "bfloat16"), reps)),
        "fp8_kernel_f32": _with_route("cublaslt", partial(
            _median_ms, cp, partial(kernel, "float32"), reps)),
        "fp8_emulated_f32": _with_route("emulated", partial(
            _median_ms, cp, partial(kernel, "float32"), 3)),
        "transpose_x": _median_ms(cp, partial(be.fp8_transpose, qx), reps),
        "transpose_x_cupy": _median_ms(cp, lambda: cp.ascontiguousarray(qx.T), reps),
    }
    flops = 2.0 * m * k * n
    base = ms["bf16_matmul"]
    return {"check": "fp8 speed", "m": m, "k": k, "n": n, "median_ms": ms,
            "tflops": {key: round(flops / v / 1e9, 1) for key, v in ms.items()
                       if not key.startswith("transpose")},
            "speedup_raw": round(base / ms["fp8_raw"], 3),
            "speedup_raw_fast_accum": round(base / ms["fp8_raw_fast_accum"], 3),
            "speedup_kernel": round(base / ms["fp8_kernel_bf16"], 3), "target": 1.6,
            "ok": base / ms["fp8_raw"] >= 1.6}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-speed", action="store_true", help="correctness only")
    ap.add_argument("--reps", type=int, default=20, help="timed runs per median (default 20)")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    import mpcore as mp

    from .cublaslt import library

    be = mp.get_backend("cuda")
    be.kernels()
    lib = library()
    dev = be.device()
    print(json.dumps({"check": "fp8 setup", "device": dev.name, "cc": dev.capability,
                      "cublaslt": lib.path, "version": lib.version,
                      "verdict": be.policy_support("mixed_float8", dev).reason[:200]}),
          flush=True)
    results = []
    for i, shape in enumerate(SHAPES):
        for r in compare(be, *shape, seed=i):
            print(json.dumps(r), flush=True)
            results.append(r)
    summary: dict[str, Any] = {"fp8_checks": len(results),
                               "failed": sum(not r["ok"] for r in results)}
    if not a.no_speed:
        s = speed(be, reps=a.reps)
        print(json.dumps(s), flush=True)
        summary.update({k: s[k] for k in ("speedup_raw", "speedup_raw_fast_accum",
                                          "speedup_kernel", "target")})
        summary["failed"] += not s["ok"]
    print(json.dumps(summary), flush=True)
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
