"""Kernel throughput per backend: matmul GFLOP/s per dtype, GB/s of the multi-tensor
``unscale_and_check``, of the fused optimizer updates and of the ``cast`` kernel between
float32 and each 16-bit dtype (on the CPU beside NumPy's ``astype``, the reference that the
providers' conversions must beat to be used). One JSON line per measurement.

    python benchmarks/kernels.py                 # every available backend
    python benchmarks/kernels.py --quick         # tiny sizes (a smoke run)
    python benchmarks/kernels.py --backend cpu --dtypes bfloat16 --sizes 512 1024

Matmul FLOPs are 2*n^3; the memory-bound kernels count the bytes each must move (every array
read once and every array written once). Times are the best of ``--repeats`` after a warm-up,
with the backend synchronised around each run. Quote ratios between lines, not absolutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import mpcore as mp

DTYPES = ("float32", "float16", "bfloat16")


def best_time(backend: mp.Backend, fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up: compile, allocate, create primitives
    backend.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        backend.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def providers(backend: mp.Backend) -> list[str]:
    return [s.provider for s in backend.kernel_sets]


def bench_matmul(backend: mp.Backend, dtypes: list[str], sizes: list[int],
                 repeats: int) -> None:
    k = backend.kernels()
    for dtype in dtypes:
        for n in sizes:
            base = {"bench": "matmul", "backend": backend.name, "dtype": dtype, "n": n}
            try:
                a = k["random_uniform"]((n, n), dtype, 1, -1.0, 1.0)
                b = k["random_uniform"]((n, n), dtype, 2, -1.0, 1.0)
                t = best_time(backend, lambda a=a, b=b: k["matmul"](a, b, False, False), repeats)
            except Exception as exc:  # a dtype a backend cannot run is a result, not a crash
                emit({**base, "skipped": f"{type(exc).__name__}: {exc}"})
                continue
            # 4 significant digits: a tiny --quick GEMM on a loaded machine is not 0.00
            emit({**base, "ms": round(t * 1e3, 4),
                  "gflops": float(f"{2.0 * n**3 / t / 1e9:.4g}"), "providers": providers(backend)})


def mlp_shapes(units: int) -> list[tuple[int, ...]]:
    """The guide's MLP's variables (784-U-U-10): what a training step unscales and updates."""
    return [(784, units), (units,), (units, units), (units,), (units, 10), (10,)]


def bench_memory_bound(backend: mp.Backend, units: int, repeats: int) -> None:
    k = backend.kernels()
    shapes = mlp_shapes(units)
    numel = sum(_prod(s) for s in shapes)

    def arrays(seed: int, lo: float = -1.0, hi: float = 1.0) -> list[Any]:
        return [k["random_uniform"](s, "float32", seed + i, lo, hi) for i, s in enumerate(shapes)]

    grads = arrays(10)
    base = {"backend": backend.name, "units": units, "elements": numel}

    t = best_time(backend, lambda: k["unscale_and_check"](grads, 1.0 / 1024), repeats)
    # reads every gradient, writes every unscaled gradient (float32 both ways)
    emit({"bench": "unscale_and_check", **base, "ms": round(t * 1e3, 4),
          "gbps": float(f"{2 * 4 * numel / t / 1e9:.4g}")})

    variables = arrays(20)
    slots = [arrays(30, 0.0, 1.0), arrays(40, 0.0, 1.0)]
    # Adam's (alpha, lr*wd) on the device (step 1), or unused where the backend lacks the kernel
    rates = (k["adam_rates"](k["asarray"](0, "int64"), 1e-3, 0.9, 0.999, 0.0)
             if "adam_rates" in k else None)
    updates: dict[str, tuple[Callable[[int], tuple[Any, ...]], int]] = {
        # name -> (the arguments for tensor i, arrays moved per element: reads + writes)
        "sgd_update": (lambda i: (variables[i], grads[i], slots[0][i], 1e-3, 0.9, False, None),
                       5),
        "rmsprop_update": (lambda i: (variables[i], grads[i], slots[1][i], None, 1e-3, 0.9,
                                      0.0, 1e-7, None), 5),
        "adam_update": (lambda i: (variables[i], grads[i], slots[0][i], slots[1][i], rates, 0.9,
                                   0.999, 1e-7, 0.0, None), 7),
    }
    for name, (arguments, moved) in updates.items():
        if name not in k:
            emit({"bench": name, **base,
                  "skipped": f"backend {backend.name!r} has no fused {name} kernel"})
            continue
        calls = [(k[name], arguments(i)) for i in range(len(shapes))]
        record = {"bench": name, **base}
        # "bound": as a traced step replays them (each call bound to its operands, where
        # the backend binds it)
        bound = [(backend.bind_kernel(name, kernel, args) or kernel, args)
                 for kernel, args in calls]
        for label, chosen in (("", calls), ("bound_", bound)):
            def run(chosen: list[tuple[Any, tuple[Any, ...]]] = chosen) -> None:
                for kernel, args in chosen:
                    kernel(*args)

            t = best_time(backend, run, repeats)
            record.update({f"{label}ms": round(t * 1e3, 4),
                           f"{label}gbps": float(f"{moved * 4 * numel / t / 1e9:.4g}")})
        emit(record)


def bench_casts(backend: mp.Backend, sizes: list[int], repeats: int) -> None:
    k = backend.kernels()
    for low in ("bfloat16", "float16"):
        for n in sizes:
            wide = k["random_uniform"]((n,), "float32", 3, -1.0, 1.0)
            narrow = k["cast"](wide, low)
            for src, dst, x in (("float32", low, wide), (low, "float32", narrow)):
                record = {"bench": "cast", "backend": backend.name, "from": src, "to": dst,
                          "elements": n}
                for label, fn in _cast_runs(backend, k, x, dst):
                    t = best_time(backend, fn, repeats)
                    record[f"{label}_us"] = t * 1e6
                    record[f"{label}_gb_s"] = n * (x.dtype.itemsize + (4 if dst == "float32"
                                                                       else 2)) / t / 1e9
                emit(record)


def _cast_runs(backend: mp.Backend, k: Any, x: Any, dst: str) -> list[tuple[str, Any]]:
    runs = [("kernel", lambda: k["cast"](x, dst))]
    if backend.name == "cpu":
        import numpy as np
        from mpcore_xp import DTYPES

        runs.append(("astype", lambda: np.asarray(x).astype(DTYPES[dst])))
    return runs


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", action="append", default=None,
                    help="a backend name (repeatable; default: every available backend)")
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    ap.add_argument("--sizes", nargs="+", type=int, default=None,
                    help="matmul sizes n (n x n @ n x n); default 256 512 1024")
    ap.add_argument("--units", type=int, default=None,
                    help="MLP width for the memory-bound kernels (default 1024)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    a = ap.parse_args(argv)
    sizes = a.sizes or ([32, 64] if a.quick else [256, 512, 1024])
    units = a.units or (64 if a.quick else 1024)
    repeats = a.repeats or (2 if a.quick else 5)
    if a.backend:
        chosen = [mp.get_backend(name) for name in a.backend]
    else:
        chosen = [b for b in mp.backends() if b.is_available()]
    for backend in chosen:
        try:
            device = backend.device()
            backend.kernels()
        except Exception as exc:
            emit({"bench": "backend", "backend": backend.name,
                  "skipped": f"{type(exc).__name__}: {exc}"})
            continue
        emit({"bench": "backend", "backend": backend.name, "device": device.name,
              "capability": device.capability, "providers": providers(backend)})
        bench_matmul(backend, a.dtypes, sizes, repeats)
        bench_memory_bound(backend, units, repeats)
        bench_casts(backend, [1 << 12] if a.quick else [1 << 15, 1 << 17, 1 << 18, 1 << 20],
                    repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
