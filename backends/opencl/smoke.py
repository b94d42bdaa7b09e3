"""The kernel probe's smoke test, run inside the probe's subprocess (:mod:`mpcore_opencl.probe`):
a few calls of each kernel family, on the device and GEMM vector width the environment names,
checked against NumPy. It returns the problems it found; a driver that crashes ends the
subprocess instead, which is what the probe is for."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from .rules import FP16

# (batch, m, k, n, transpose_a, transpose_b): odd sizes, so edges and padding are exercised
GEMMS = ((None, 37, 29, 45, False, False), (None, 33, 70, 17, True, False),
         (None, 19, 23, 40, False, True), (2, 9, 13, 11, True, True))
STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
           "float64": np.float64}
#: Relative error allowed against a float64 GEMM of the rounded inputs (float32 accumulation).
GEMM_RTOL = 1e-4


def run_smoke() -> list[str]:
    """Run every check; a list of what failed (empty: all passed)."""
    import mpcore as mp

    backend = mp.get_backend("opencl")
    problems: list[str] = []
    try:
        backend.kernels()
    except Exception as exc:
        return [f"activation: {type(exc).__name__}: {exc}"]
    checks: list[tuple[str, Callable[[], None]]] = []
    variants = ("packed", "tiled") if backend.device().kind == "cpu" else ("tiled",)
    natives = (False, True) if FP16 in backend.device().features else (False,)
    dtypes = [d for d in STORAGE if d != "float64" or "cl_khr_fp64" in backend.device().features]
    for variant in variants:
        for dtype in dtypes:
            for native in natives if dtype == "float16" else (False,):
                label = f"{variant} GEMM {dtype}" + (" native half" if native else "")
                checks.append((label, lambda v=variant, d=dtype, n=native:
                               _gemms(backend, v, d, n)))
    for dtype in dtypes:
        checks.append((f"elementwise and reductions {dtype}",
                       lambda d=dtype: _elementwise(backend, d)))
    checks.append(("softmax, loss scaling and an SGD update", lambda: _training(backend)))
    for label, check in checks:
        try:
            check()
        except Exception as exc:
            problems.append(f"{label}: {type(exc).__name__}: {str(exc).strip()[:400]}")
    return problems


def _gemms(be: Any, variant: str, dtype: str, native: bool) -> None:
    saved = be.gemm_variant
    be.gemm_variant = variant
    try:
        rng = np.random.default_rng(0)
        for batch, m, k, n, ta, tb in GEMMS:
            lead = () if batch is None else (batch,)
            a = rng.uniform(-1, 1, (*lead, *((k, m) if ta else (m, k)))).astype(STORAGE[dtype])
            b = rng.uniform(-1, 1, (*lead, *((n, k) if tb else (k, n)))).astype(STORAGE[dtype])
            got = be.to_host(be._matmul(be.asarray(a, dtype), be.asarray(b, dtype), ta, tb,
                                        native))
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            want = np.swapaxes(a64, -1, -2) if ta else a64
            want = want @ (np.swapaxes(b64, -1, -2) if tb else b64)
            got64 = got.astype(np.float64)
            rounding = {"float16": 1e-3, "bfloat16": 8e-3}.get(dtype, 0.0)
            err = np.max(np.abs(got64 - want)) / max(np.max(np.abs(want)), 1e-30)
            if not err <= GEMM_RTOL + rounding:
                raise AssertionError(f"(batch {batch}, {m}x{k} @ {k}x{n}, transposes {ta}, {tb}):"
                                     f" relative error {err:.3g}")
    finally:
        be.gemm_variant = saved


def _elementwise(be: Any, dtype: str) -> None:
    k = be.kernels()
    x = np.array([[1.5, -2.0, np.nan], [np.inf, -np.inf, 0.25]], dtype=STORAGE[dtype])
    y = np.array([0.5, 4.0, -1.0], dtype=STORAGE[dtype])
    dx, dy = k["asarray"](x, dtype), k["asarray"](y, dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        expected = {
            "add": (k["add"](dx, dy), x + y),
            "relu": (k["relu"](dx), np.where(np.isnan(x) | (x > 0), x, 0).astype(x.dtype)),
            "exp": (k["exp"](dy), np.exp(y.astype(np.float32)).astype(x.dtype)),
            "sum": (k["sum"](dy, (0,), False), np.sum(y.astype(np.float32)).astype(x.dtype)),
        }
    for name, (got, want) in expected.items():
        got = np.asarray(k["to_host"](got), dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if not np.allclose(got, want, rtol=1e-2, atol=1e-2, equal_nan=True):
            raise AssertionError(f"{name} gave {got.tolist()}, expected {want.tolist()}")


def _training(be: Any) -> None:
    k = be.kernels()
    logits = k["asarray"](np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], np.float32), "float32")
    probs = k["to_host"](k["softmax"](logits, 1))
    if not np.allclose(probs.sum(axis=1), 1.0, atol=1e-5):
        raise AssertionError(f"softmax rows sum to {probs.sum(axis=1).tolist()}")
    grads = [k["asarray"](np.array([2.0, np.inf], np.float32), "float32")]
    _, flag = k["unscale_and_check"](grads, 0.5)
    if bool(np.asarray(k["to_host"](flag)).reshape(-1)[0]):
        raise AssertionError("unscale_and_check called a gradient with Inf finite")
    var = k["asarray"](np.ones(4, np.float32), "float32")
    grad = k["asarray"](np.full(4, 2.0, np.float32), "float32")
    k["sgd_update"](var, grad, None, 0.25, 0.0, False, None)
    if not np.allclose(k["to_host"](var), 0.5):
        raise AssertionError(f"SGD update gave {k['to_host'](var).tolist()}, expected 0.5")


if __name__ == "__main__":
    found = run_smoke()
    print(json.dumps({"ok": not found, "problems": found}), flush=True)
    sys.exit(1 if found else 0)
