"""GEMM GFLOP/s of the OpenCL backend (float32, float16-storage, bfloat16-storage) next to
NumPy's float32 matmul, on the same machine in the same run. Prints JSON.

    python benchmarks/gemm_opencl.py [--sizes 256 512 1024 2048] [--repeats 5]
        [--variant register|tiled]

16-bit "storage" GEMMs keep their operands and result in 16 bits and accumulate in float32.
MPCORE_OPENCL_DEVICE=platform:device picks the device.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from typing import Any

import numpy as np

import mpcore as mp


def best_times(fns: dict[str, Any], repeats: int) -> dict[str, float]:
    """Best wall time of each function. The functions take turns within every repeat, so a
    load change on a shared machine hits NumPy and OpenCL alike."""
    for fn in fns.values():
        fn()  # warm-up: compile, allocate
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variant", choices=["register", "tiled"], default=None,
                        help="GEMM kernel (default: register on CPU devices, tiled on GPUs)")
    args = parser.parse_args()
    be = mp.get_backend("opencl")
    k = be.kernels()
    if args.variant:
        be.gemm_variant = args.variant
    rows = []
    for n in args.sizes:
        flops = 2.0 * n ** 3
        rng = np.random.default_rng(n)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        fns: dict[str, Any] = {"numpy_float32": lambda a=a, b=b: a @ b}
        for dtype in ("float32", "float16", "bfloat16"):
            da, db = k["asarray"](a, dtype), k["asarray"](b, dtype)

            def run(da: Any = da, db: Any = db) -> None:
                k["matmul"](da, db, False, False)
                be.synchronize()

            fns[f"opencl_{dtype}"] = run
        times = best_times(fns, args.repeats)
        row: dict[str, Any] = {"n": n}
        for name, seconds in times.items():
            row[f"{name}_gflops"] = round(flops / seconds / 1e9, 2)
        row["float32_vs_numpy"] = round(row["opencl_float32_gflops"]
                                        / row["numpy_float32_gflops"], 3)
        rows.append(row)
    device = be.device()
    print(json.dumps({"benchmark": "gemm_opencl", "device": device.name,
                      "device_kind": device.kind, "gemm_variant": be._variant(),
                      "host": platform.processor() or platform.machine(),
                      "numpy": np.__version__, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
