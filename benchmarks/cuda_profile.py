"""Where the device time of a train step goes, kernel by kernel: the CUDA train-step
benchmark's model (``cuda_train_step.GuideLoop``: the guide's custom loop, eager) with every
kernel of the backend's table timed by a pair of CUDA events on the current stream.

    python benchmarks/cuda_profile.py --policy float32 mixed_float16 mixed_bfloat16
    python benchmarks/cuda_profile.py --backend cpu --units 64 --batch 128 --steps 3   # smoke

Prints one JSON line per policy: the step's wall time, the device time of each kernel of the
table (summed over its calls, per step, largest first) and what the table's kernels leave of
the step (casts and copies inside a kernel count as that kernel's). Before each kernel's
start event the GPU spins for ``--lead-us`` (not timed), so that the kernel is queued before
the GPU reaches that event: without it, a host-bound step would count the GPU's wait for the
launch as the kernel's time. The GEMMs' share next to
``gemm_ms_at_peak`` (the FLOPs at the dtype's peak rate, when ``--peak-tflops`` is given)
tells whether a gap to PyTorch is in the GEMMs or around them. A backend without CuPy is timed
by the host around a synchronize after each kernel (slower, the same breakdown).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mpcore as mp
from mpcore.core import backend as backend_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_train_step import POLICIES, GuideLoop, flops_per_step

GEMMS = frozenset({"matmul", "dense", "batched_matmul"})


SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {}
}
"""


class KernelTimer:
    """A kernel view (``mpcore.core.backend.set_kernel_view``) that times each kernel call."""

    def __init__(self, backend: mp.Backend, lead_us: float = 200.0) -> None:
        self.backend = backend
        self.cp = getattr(backend, "cp", None)
        self._spin: Any = None
        if self.cp is not None and lead_us > 0:
            khz = self.cp.cuda.Device().attributes["ClockRate"]
            self._cycles = int(lead_us * khz / 1e3)
            self._spin = self.cp.RawKernel(SPIN, "spin")
        self.pending: list[tuple[str, Any, Any]] = []
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._wrapped: dict[str, Callable[..., Any]] = {}

    def __call__(self, backend: mp.Backend, table: dict[str, Callable[..., Any]]
                 ) -> dict[str, Callable[..., Any]]:
        if backend is not self.backend:
            return table
        for name, fn in table.items():
            if name not in self._wrapped:
                self._wrapped[name] = self._timed(name, fn)
        return self._wrapped

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if self.cp is not None:
                if self._spin is not None:   # the lead: see the module's docstring
                    self._spin((1,), (1,), (self.cp.int64(self._cycles),))
                start, end = self.cp.cuda.Event(), self.cp.cuda.Event()
                start.record()
                out = fn(*args, **kwargs)
                end.record()
                self.pending.append((name, start, end))
                return out
            self.backend.synchronize()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.backend.synchronize()
            self.seconds[name] += time.perf_counter() - t0
            return out
        return call

    def collect(self) -> None:
        """Read the events (after a synchronize) into the sums."""
        for name, start, end in self.pending:
            self.seconds[name] += self.cp.cuda.get_elapsed_time(start, end) / 1e3
        self.pending.clear()


def profile(backend: mp.Backend, policy: str, units: int, batch: int, steps: int,
            warmup: int, peak_tflops: float | None, lead_us: float = 200.0) -> dict[str, Any]:
    record: dict[str, Any] = {"bench": "cuda_profile", "backend": backend.name,
                              "device": backend.device().name, "policy": policy,
                              "units": units, "batch": batch, "steps": steps}
    if not mp.check_policy(policy, backend).supported:
        return {**record, "skipped": mp.check_policy(policy, backend).reason}
    loop = GuideLoop(backend, policy, units, batch)
    for _ in range(warmup):
        loop.step()
    backend.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loop.step()
    backend.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    timer = KernelTimer(backend, lead_us)
    backend_module.set_kernel_view(timer)
    try:
        for _ in range(steps):
            loop.step()
        backend.synchronize()
    finally:
        backend_module.set_kernel_view(None)
    if timer.cp is not None:
        timer.collect()
    per_step = {n: s * 1e3 / steps for n, s in timer.seconds.items()}
    kernels_ms = sum(per_step.values())
    gemm_ms = sum(ms for n, ms in per_step.items() if n in GEMMS)
    record.update({
        "step_ms": round(wall_ms, 3),
        "kernels_ms": round(kernels_ms, 3),
        "gemm_ms": round(gemm_ms, 3),
        "outside_kernels_ms": round(wall_ms - kernels_ms, 3),
        "kernels": [{"kernel": n, "ms_per_step": round(ms, 4),
                     "calls_per_step": timer.calls[n] / steps}
                    for n, ms in sorted(per_step.items(), key=lambda kv: -kv[1])],
    })
    if peak_tflops:
        record["gemm_ms_at_peak"] = round(flops_per_step(batch, units) / peak_tflops / 1e9, 3)
    return record


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", nargs="+", choices=POLICIES, default=list(POLICIES))
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--units", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="the device's dense peak for the policy's GEMMs, for gemm_ms_at_peak")
    ap.add_argument("--lead-us", type=float, default=200.0,
                    help="GPU spin before each timed kernel, so its launch is queued in time "
                         "(0: none)")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        backend = mp.get_backend(a.backend)
    except (ValueError, mp.BackendUnavailableError) as exc:
        print(json.dumps({"bench": "cuda_profile", "backend": a.backend, "error": str(exc)}))
        return 0
    for policy in a.policy:
        print(json.dumps(profile(backend, policy, a.units, a.batch, a.steps, a.warmup,
                                 a.peak_tflops, a.lead_us)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
