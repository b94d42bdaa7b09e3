"""Device time of the OpenCL packed GEMM (CPU devices) per shape, for several packed shapes
(register block, work-group, in-place limits) side by side. Prints one JSON line per shape
and configuration.

    python benchmarks/packed_gemm_opencl.py                       # the guide's step + squares
    python benchmarks/packed_gemm_opencl.py --config rows=4 --config group=4x4
    python benchmarks/packed_gemm_opencl.py --shapes 128x784x64 t784x128x64 --rounds 200
    python benchmarks/packed_gemm_opencl.py --config a=0,b=0      # pack both operands
    MPCORE_OPENCL_DEVICE=0:0 python benchmarks/packed_gemm_opencl.py

A shape is MxKxN, op(A) (M x K) @ op(B) (K x N), float32; a leading ``t`` transposes A (A is
stored K x M, as in a weight gradient x^T @ dz) and a trailing ``t`` transposes B. Each
``--config`` changes the device's shape (:func:`mpcore_opencl.tiling.packed_shape`) in
``rows``, ``vectors``, ``width`` (lanes a vector), ``group`` (columns x rows of blocks), ``a``
and ``b`` (the largest operand, in bytes, read in place); the device's own shape always runs
first. Times are OpenCL profiling events, the GEMM and its packing kernels separately, summed
per call, one call per configuration and shape in turn each round (so that a load change on
a shared machine hits every configuration alike), reported as the median and range over the
rounds. This is what chose the packed shape's constants in ``tiling.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from typing import Any

import numpy as np
import pyopencl as cl
from mpcore_opencl.tiling import PackedShape

import mpcore as mp

SHAPES = ["128x784x64", "t784x128x64", "128x64x64", "128x64x64t", "256x256x256",
          "512x512x512", "t512x512x512", "1024x1024x1024"]
FIELDS = {"rows": "rows", "vectors": "vectors", "width": "vector_width", "group": "group",
          "a": "in_place_a_bytes", "b": "in_place_b_bytes"}


def parse_shape(text: str) -> tuple[int, int, int, bool, bool]:
    ta, tb = text.startswith("t"), text.endswith("t")
    m, k, n = (int(v) for v in text.strip("t").split("x"))
    return m, k, n, ta, tb


def parse_config(text: str, base: PackedShape) -> PackedShape:
    changes: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key not in FIELDS:
            raise SystemExit(f"--config: unknown key {key!r}; valid keys: {', '.join(FIELDS)}")
        changes[FIELDS[key]] = (tuple(int(v) for v in value.split("x")) if key == "group"
                                else int(value))
    if "vector_width" in changes and "vectors" not in changes:
        raise SystemExit("--config: a width needs its vectors (vectors=...)")
    return dataclasses.replace(base, **changes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=SHAPES)
    parser.add_argument("--config", action="append", default=[],
                        help="key=value[,key=value...]: rows, vectors, width, group (GXxGY), "
                             "a, b (bytes)")
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    be = mp.get_backend("opencl")
    be.kernels()
    be.gemm_variant = "packed"
    rt = be.runtime
    rt.queue = cl.CommandQueue(rt.queue.context,
                               properties=cl.command_queue_properties.PROFILING_ENABLE)
    events: list[tuple[str, Any]] = []

    def launch_nd(kernel: Any, global_size: Any, local_size: Any, *kargs: Any) -> None:
        events.append((kernel.function_name, kernel(rt.queue, global_size, local_size, *kargs)))

    rt.launch_nd = launch_nd
    device_shape = be.packed_shape()
    configs = {"device": device_shape}
    for text in args.config:
        configs[text] = parse_config(text, device_shape)
    rng = np.random.default_rng(0)
    operands = {}
    for text in args.shapes:
        m, k, n, ta, tb = parse_shape(text)
        a = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
        want = (a.T if ta else a) @ (b.T if tb else b)
        operands[text] = (be.asarray(a, "float32"), be.asarray(b, "float32"), ta, tb, want)
    times = {(c, s): {"gemm": [], "pack": []} for c in configs for s in operands}

    def call(config: str, shape: str) -> Any:
        a, b, ta, tb, _ = operands[shape]
        be.packed_shape = lambda dtype="float32", cfg=configs[config]: cfg
        events.clear()
        out = be._matmul(a, b, ta, tb)
        rt.queue.finish()
        for kind in ("gemm", "pack"):
            times[config, shape][kind].append(sum(
                (event.profile.end - event.profile.start) / 1e3 for name, event in events
                if (name == "pack_k") == (kind == "pack")))
        return out

    for config in configs:  # warm-up (builds), and every configuration computes correctly
        for shape, (*_, want) in operands.items():
            got = be.to_host(call(config, shape))
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
    for per_call in times.values():
        per_call["gemm"].clear()
        per_call["pack"].clear()
    for _ in range(args.rounds):
        for config in configs:
            for shape in operands:
                call(config, shape)
    for (config, shape), t in times.items():
        m, k, n, _, _ = parse_shape(shape)
        total = [g + p for g, p in zip(t["gemm"], t["pack"], strict=True)]
        cfg = configs[config]
        print(json.dumps({
            "bench": "packed_gemm_opencl", "device": be.device().name, "shape": shape,
            "config": config, "packed_shape": [
                *cfg.options(), f"group={cfg.group[0]}x{cfg.group[1]}",
                f"a={cfg.in_place_a_bytes}", f"b={cfg.in_place_b_bytes}"],
            "us_median": round(statistics.median(total), 1),
            "us_range": [round(min(total), 1), round(max(total), 1)],
            "gemm_us_median": round(statistics.median(t["gemm"]), 1),
            "pack_us_median": round(statistics.median(t["pack"]), 1),
            "gflops_median": round(2.0 * m * k * n / statistics.median(total) / 1e3, 1)}))


if __name__ == "__main__":
    main()
