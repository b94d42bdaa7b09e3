"""Which float16 kernel variant runs on a device: "native" (``cl_khr_fp16``: elementwise ops
compute in half, GEMM tiles and panels stay half) or "convert" (``vload_half``/``vstore_half``
around float32 arithmetic, on any device).

``MPCORE_OPENCL_HALF=auto|native|convert`` (default auto) asks for one. ``auto`` runs convert on a
device without ``cl_khr_fp16``; on one with it, :func:`measure_half_variants` times both variants
once per device and process and the choice is made per kernel family: the elementwise programs
run native where the multiply is faster native, the GEMM and every other program where the GEMM
is. They can disagree: on a CPU without float16 arithmetic, half loads and stores vectorise where
``vload_half`` does not, while a half GEMM pays a conversion per multiply-add. The choice and its
figures go into the float16 verdict's reason (``check_policy``, ``mpcore info``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpcore.core.backend import Device
from mpcore.plugins.settings import env_choice

from .rules import FP16

HALF_MODES = ("auto", "native", "convert")
#: ``auto`` runs a kernel family native when its measured speedup exceeds this (a gain within
#: timing noise is not worth a second set of kernels).
MIN_NATIVE_GAIN = 1.05


def half_mode() -> str:
    """The float16 kernel variant asked for by ``MPCORE_OPENCL_HALF`` (default ``auto``)."""
    return env_choice("MPCORE_OPENCL_HALF", HALF_MODES)


@dataclass(frozen=True)
class HalfMeasurement:
    """float16 speed of the native-half and the convert kernels on one device: a GEMM
    (GFLOP/s) and an elementwise multiply (GB/s moved: two reads and a write)."""

    device: str
    gemm_n: int
    gemm_native_gflops: float
    gemm_convert_gflops: float
    elements: int
    ew_native_gbps: float
    ew_convert_gbps: float
    seconds: float

    @property
    def gemm_speedup(self) -> float:
        return self.gemm_native_gflops / self.gemm_convert_gflops

    @property
    def ew_speedup(self) -> float:
        return self.ew_native_gbps / self.ew_convert_gbps

    @property
    def gemm_native(self) -> bool:
        """Whether the GEMM (and the kernel families that follow it) should run native."""
        return self.gemm_speedup > MIN_NATIVE_GAIN

    @property
    def elementwise_native(self) -> bool:
        """Whether the elementwise kernels should run native."""
        return self.ew_speedup > MIN_NATIVE_GAIN

    def __str__(self) -> str:
        return (f"native vs convert half kernels: float16 GEMM n={self.gemm_n} "
                f"{self.gemm_native_gflops:.1f} vs {self.gemm_convert_gflops:.1f} GFLOP/s "
                f"({self.gemm_speedup:.2f}x), multiply of {self.elements} elements "
                f"{self.ew_native_gbps:.1f} vs {self.ew_convert_gbps:.1f} GB/s "
                f"({self.ew_speedup:.2f}x)")


@dataclass(frozen=True)
class HalfChoice:
    """The float16 kernel variants the backend runs on its device, and why: ``variant`` for
    the GEMMs and every program but the elementwise ones, which run ``elementwise``."""

    variant: str  # "native" or "convert"
    elementwise: str  # "native" or "convert"
    mode: str  # MPCORE_OPENCL_HALF
    reason: str
    measured: HalfMeasurement | None = None

    @property
    def native(self) -> bool:
        return self.variant == "native"

    @property
    def native_elementwise(self) -> bool:
        return self.elementwise == "native"


def measure_half_variants(backend: Any, n: int = 512, elements: int = 1 << 22,
                          repeats: int = 3) -> HalfMeasurement:
    """Time the native-half and the convert float16 kernels on ``backend``'s device (an
    :class:`~mpcore_opencl.backend.OpenCLBackend` whose device must have cl_khr_fp16): an
    n x n GEMM (the device's GEMM variant) and a multiply of ``elements`` values, best of
    ``repeats`` after a warm-up, the variants taking turns so that a load change hits both."""
    device = backend.device()
    if FP16 not in device.features:
        raise ValueError(f"{device.name} ({device.index}) lacks {FP16}: it has no native-half "
                         "kernels to measure")
    start = time.perf_counter()
    rng = np.random.default_rng(0)
    ga, gb = (backend.asarray(rng.uniform(-1, 1, (n, n)).astype(np.float16), "float16")
              for _ in range(2))
    ea, eb = (backend.asarray(rng.uniform(-1, 1, elements).astype(np.float16), "float16")
              for _ in range(2))
    eo = backend._empty((elements,), "float16")
    rt = backend.runtime

    def gemm(native: bool) -> None:
        backend._matmul(ga, gb, False, False, native)

    def multiply(native: bool) -> None:
        kernel = backend._elementwise("float16", "float16", native)["k_multiply"]
        rt.launch(kernel, elements, np.int32(elements), ea.data, eb.data, eo.data)

    best: dict[tuple[str, bool], float] = {}
    for round_ in range(repeats + 1):  # round 0 warms up: builds programs, allocates
        for name, fn in (("gemm", gemm), ("ew", multiply)):
            for native in (True, False):
                t0 = time.perf_counter()
                fn(native)
                rt.finish()
                elapsed = time.perf_counter() - t0
                if round_:
                    best[name, native] = min(best.get((name, native), math.inf), elapsed)
    flops, moved = 2.0 * n ** 3, 3.0 * 2 * elements
    return HalfMeasurement(
        device.name, n, flops / best["gemm", True] / 1e9, flops / best["gemm", False] / 1e9,
        elements, moved / best["ew", True] / 1e9, moved / best["ew", False] / 1e9,
        time.perf_counter() - start)


def unmeasured_half_choice(mode: str, device: Device) -> HalfChoice | None:
    """The float16 variants ``MPCORE_OPENCL_HALF=mode`` settles on ``device`` without
    measuring, or None where ``auto`` has to measure (a device with cl_khr_fp16)."""
    if mode != "auto":
        return HalfChoice(mode, mode, mode, f"MPCORE_OPENCL_HALF={mode}")
    if FP16 not in device.features:
        where = f"{device.name} ({device.index})" if device.index else device.name
        return HalfChoice("convert", "convert", mode,
                          f"MPCORE_OPENCL_HALF=auto: {where} lacks {FP16}, so the convert "
                          "kernels run")
    return None


def choose_half(backend: Any) -> HalfChoice:
    """The float16 variants on ``backend``'s device: by ``MPCORE_OPENCL_HALF`` (native needs
    cl_khr_fp16), else convert on a device without cl_khr_fp16, else per kernel family by
    :func:`measure_half_variants`."""
    mode = half_mode()
    device = backend.device()
    if mode == "native" and FP16 not in device.features:
        found = [f"{d.index} = {d.name}" for d in backend.devices() if FP16 in d.features]
        raise ValueError(
            f"MPCORE_OPENCL_HALF=native needs {FP16}, which the OpenCL device "
            f"{device.name} ({device.index}) lacks; use MPCORE_OPENCL_HALF=auto or convert, or "
            "pick a device that has it with MPCORE_OPENCL_DEVICE ("
            + ("; ".join(found) or f"none here has {FP16}; pip install intel-opencl-rt "
                                    "intel-cmplr-lib-rt adds a CPU device with it")
            + ")")
    choice = unmeasured_half_choice(mode, device)
    if choice is not None:
        return choice
    m = measure_half_variants(backend)
    gemm = "native" if m.gemm_native else "convert"
    ew = "native" if m.elementwise_native else "convert"
    return HalfChoice(gemm, ew, mode, f"MPCORE_OPENCL_HALF=auto measured {m}: "
                      f"{gemm} GEMM kernels and {ew} elementwise kernels run", m)


def planned_half(device: Device) -> tuple[bool, str]:
    """(native half GEMMs would run on a described ``device``, why), without measuring it:
    what ``MPCORE_OPENCL_HALF`` settles, else what ``auto``'s measurement is expected to find
    (native on GPUs, convert on CPUs)."""
    plan = unmeasured_half_choice(half_mode(), device)
    if plan is not None:  # (native without cl_khr_fp16 is ignored by the rules)
        return plan.native, plan.reason
    if device.kind != "cpu":
        return True, ("MPCORE_OPENCL_HALF=auto, assuming the measurement made once when the "
                      "device is used finds the native GEMM faster")
    return False, ("MPCORE_OPENCL_HALF=auto, assuming the measurement made once when the "
                   "device is used finds the native GEMM no faster, as on CPUs without "
                   "AVX512-FP16")
