"""GEMM GFLOP/s of the OpenCL backend (float32, float16-storage, bfloat16-storage) next to
NumPy's float32 matmul, on the same machine in the same run. Prints JSON.

    python benchmarks/gemm_opencl.py [--sizes 256 512 1024 2048] [--repeats 5]
        [--variant packed|tiled] [--op-overhead]

16-bit "storage" GEMMs keep their operands and result in 16 bits and accumulate in float32.
On a device with cl_khr_fp16, ``opencl_float16_native`` is the native-half GEMM (half tiles or
panels, float32 accumulation) next to ``opencl_float16`` (the convert kernels, whatever
MPCORE_OPENCL_HALF says), and ``elementwise`` adds the GB/s of a float16 multiply of 2**22
elements in both variants (two reads and a write). ``--op-overhead`` adds the host time of one
small op (``mp.ops.add`` on 8x8 float32 tensors, dispatch and launch, in microseconds) on the
opencl and cpu backends.
MPCORE_OPENCL_DEVICE=platform:device picks the device; the report names the GEMM shape
(its vector width as the kernel probe verified it) next to the width the device reports;
MPCORE_OPENCL_VECTOR_WIDTH=w times another width.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from typing import Any

import numpy as np
from mpcore_opencl.half import measure_half_variants
from mpcore_opencl.tiling import reported_width

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


def op_overhead_us(repeats: int, calls: int = 2000) -> dict[str, float]:
    """Microseconds per ``mp.ops.add`` of two 8x8 float32 tensors, queue drained, best of
    ``repeats`` runs of ``calls`` calls; backends take turns."""
    tensors = {}
    for name in ("opencl", "cpu"):
        be = mp.get_backend(name)
        x = np.ones((8, 8), np.float32)
        tensors[name] = (be, mp.constant(x, backend=be), mp.constant(x, backend=be))

    def run(name: str) -> None:
        be, a, b = tensors[name]
        for _ in range(calls):
            mp.ops.add(a, b)
        be.synchronize()

    times = best_times({name: lambda name=name: run(name) for name in tensors}, repeats)
    return {name: round(t / calls * 1e6, 2) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variant", choices=["packed", "tiled"], default=None,
                        help="GEMM kernel (default: packed on CPU devices, tiled on GPUs)")
    parser.add_argument("--op-overhead", action="store_true",
                        help="also time one small op (mp.ops.add, 8x8) on opencl and cpu")
    args = parser.parse_args()
    be = mp.get_backend("opencl")
    k = be.kernels()
    if args.variant:
        be.gemm_variant = args.variant
    fp16 = "cl_khr_fp16" in be.device().features
    rows = []
    for n in args.sizes:
        flops = 2.0 * n ** 3
        rng = np.random.default_rng(n)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        fns: dict[str, Any] = {"numpy_float32": lambda a=a, b=b: a @ b}
        for dtype, native in (("float32", None), ("float16", False), ("float16", True),
                              ("bfloat16", None)):
            if native and not fp16:
                continue
            da, db = k["asarray"](a, dtype), k["asarray"](b, dtype)

            def run(da: Any = da, db: Any = db, native: bool | None = native) -> None:
                be._matmul(da, db, False, False, native)
                be.synchronize()

            fns[f"opencl_{dtype}" + ("_native" if native else "")] = run
        times = best_times(fns, args.repeats)
        row: dict[str, Any] = {"n": n}
        for name, seconds in times.items():
            row[f"{name}_gflops"] = round(flops / seconds / 1e9, 2)
        row["float32_vs_numpy"] = round(row["opencl_float32_gflops"]
                                        / row["numpy_float32_gflops"], 3)
        rows.append(row)
    device = be.device()
    shape = be.packed_shape() if be._variant() == "packed" else be.tiled_shape()
    report: dict[str, Any] = {"benchmark": "gemm_opencl", "device": device.name,
                              "device_kind": device.kind, "gemm_variant": be._variant(),
                              "reported_vector_width": reported_width(device),
                              "gemm_shape_float32": shape.options(),
                              "probe": be._probe.summary() if be._probe else "skipped: "
                              "vector width fixed",
                              "cl_khr_fp16": fp16,
                              "host": platform.processor() or platform.machine(),
                              "numpy": np.__version__, "results": rows}
    if fp16:
        m = measure_half_variants(be, n=min(args.sizes), repeats=args.repeats)
        report["elementwise"] = {"op": "multiply float16", "elements": m.elements,
                                 "native_gbps": round(m.ew_native_gbps, 2),
                                 "convert_gbps": round(m.ew_convert_gbps, 2)}
        choice = be.half_choice()
        report["half_choice"] = {"mode": choice.mode, "gemm": choice.variant,
                                 "elementwise": "native" if choice.native_elementwise
                                 else "convert", "reason": choice.reason}
    if args.op_overhead:
        report["add_8x8_host_us"] = op_overhead_us(args.repeats)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
