"""Device time of each OpenCL kernel in the guide's training step, from OpenCL profiling events.

Trains the guide's model (``Model.fit``, eager, so that every launch goes through the runtime)
on a profiling-enabled queue and sums each kernel's device time (event end - start) per step;
GEMMs are listed per shape. Prints one JSON line, the largest first. Where a traced step is
device-bound (PoCL on a CPU), this says which kernels to make faster.

    python benchmarks/opencl_step_profile.py                      # 784-64-64-10, batch 128
    python benchmarks/opencl_step_profile.py --units 1024 --batch 1024 --steps 5
    MPCORE_OPENCL_DEVICE=1:0 python benchmarks/opencl_step_profile.py
"""

from __future__ import annotations

import argparse
import collections
import json
from typing import Any

import numpy as np
import pyopencl as cl

import mpcore as mp
from mpcore.cli.demo import build_model


def _watch(rt: Any, events: list[tuple[str, Any]]) -> None:
    """Route the runtime's launches through a profiling queue and keep each launch's event."""
    rt.queue = cl.CommandQueue(rt.queue.context,
                               properties=cl.command_queue_properties.PROFILING_ENABLE)

    def launch(kernel: Any, n: int, *args: Any) -> None:
        if n > 0:
            local = rt.local
            events.append((kernel.function_name,
                           kernel(rt.queue, ((n + local - 1) // local * local,), (local,),
                                  *args)))

    def launch_nd(kernel: Any, global_size: Any, local_size: Any, *args: Any) -> None:
        name = kernel.function_name
        if name.startswith("gemm"):
            name += f" m,n,k={[int(a) for a in args[:3]]}"
        events.append((name, kernel(rt.queue, global_size, local_size, *args)))

    rt.launch, rt.launch_nd = launch, launch_nd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=64)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--policy", default="float32")
    a = ap.parse_args(argv)
    mp.set_backend("opencl")
    backend = mp.get_backend()
    events: list[tuple[str, Any]] = []
    _watch(backend.runtime, events)
    rng = np.random.default_rng(0)
    x = rng.random((a.batch * a.steps, 784), dtype=np.float32)
    y = rng.integers(0, 10, a.batch * a.steps).astype(np.int32)
    with mp.policy_scope(a.policy):
        model = build_model(a.units)
    model.compile(loss="sparse_categorical_crossentropy", optimizer=mp.optimizers.RMSprop(),
                  metrics=["accuracy"], jit_compile=False)
    model.fit(x, y, batch_size=a.batch, epochs=1, verbose=0)      # compile kernels, warm up
    events.clear()
    model.fit(x, y, batch_size=a.batch, epochs=1, verbose=0)
    backend.runtime.queue.finish()
    total: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter[str] = collections.Counter()
    for name, event in events:
        total[name] += (event.profile.end - event.profile.start) / 1e3
        count[name] += 1
    kernels = [{"kernel": k, "launches_per_step": count[k] / a.steps,
                "device_us_per_step": round(total[k] / a.steps, 1)}
               for k in sorted(total, key=lambda k: -total[k])]
    print(json.dumps({"bench": "opencl_step_profile", "device": backend.device().name,
                      "policy": a.policy, "units": a.units, "batch": a.batch,
                      "device_us_per_step": round(sum(total.values()) / a.steps, 1),
                      "launches_per_step": len(events) / a.steps, "kernels": kernels}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
