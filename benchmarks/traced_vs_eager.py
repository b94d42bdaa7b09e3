"""Traced steps against eager ones: the guide's model trained by ``Model.fit`` with
``jit_compile=True`` and with ``jit_compile=False``, both built in one process (the same
weights, data and shuffles) and timed in alternating rounds (the order reversed every other
round). One JSON line per configuration: the median ms per step of each, the median and range
of the per-round ratios (eager time / traced time), the traced program's length (its steps:
kernel calls and whole calls), per program step the traced step's time and the time the
replay saves (eager - traced), and the peak of Python-allocated memory (NumPy arrays included)
of one epoch of each, measured after the timed rounds.

    python benchmarks/traced_vs_eager.py                               # 784-64-64-10, batch 128
    python benchmarks/traced_vs_eager.py --units 1024 --batch 1024 --rounds 5
    MPCORE_BACKEND=opencl python benchmarks/traced_vs_eager.py --policy float32
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc
from typing import Any

import numpy as np

import mpcore as mp
from mpcore.cli.demo import build_model

STEPS = 40


def _trainers(policy: str, units: int, batch: int) -> tuple[dict[bool, Any], Any, Any]:
    rng = np.random.default_rng(0)
    x = rng.random((batch * STEPS, 784), dtype=np.float32)
    y = rng.integers(0, 10, batch * STEPS).astype(np.int32)
    models = {}
    for jit in (False, True):
        mp.random.set_seed(0)
        with mp.policy_scope(policy):
            model = build_model(units)
        model.compile(loss="sparse_categorical_crossentropy", optimizer=mp.optimizers.RMSprop(),
                      metrics=["accuracy"], jit_compile=jit)
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0)       # warm-up, the trace
        models[jit] = model
    return models, x, y


def _epoch(model: Any, x: Any, y: Any, batch: int) -> float:
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
    return (time.perf_counter() - start) / STEPS


def _peak_mb(model: Any, x: Any, y: Any, batch: int) -> float:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        _epoch(model, x, y, batch)
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def measure(policy: str, units: int, batch: int, rounds: int) -> dict[str, Any]:
    models, x, y = _trainers(policy, units, batch)
    times: dict[bool, list[float]] = {False: [], True: []}
    ratios = []
    for r in range(rounds):
        for jit in ((False, True) if r % 2 == 0 else (True, False)):
            times[jit].append(_epoch(models[jit], x, y, batch))
        ratios.append(times[False][-1] / times[True][-1])
    traced = models[True].train_function
    program = traced.graph if traced is not None else None
    length = None if program is None else len(program.steps)
    eager_ms = statistics.median(times[False]) * 1e3
    traced_ms = statistics.median(times[True]) * 1e3
    return {"bench": "traced_vs_eager", "backend": mp.get_backend().name, "policy": policy,
            "units": units, "batch": batch, "steps_per_round": STEPS, "rounds": rounds,
            "eager_ms_per_step": eager_ms, "traced_ms_per_step": traced_ms,
            "traced_vs_eager_median": statistics.median(ratios),
            "traced_vs_eager_range": [min(ratios), max(ratios)],
            "program_steps": length,
            "traced_us_per_program_step": None if not length else traced_ms * 1e3 / length,
            "saved_us_per_program_step": (None if not length
                                          else (eager_ms - traced_ms) * 1e3 / length),
            "peak_traced_mb": {"eager": _peak_mb(models[False], x, y, batch),
                               "traced": _peak_mb(models[True], x, y, batch)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", nargs="+", default=["float32", "mixed_bfloat16"],
                        choices=("float32", "mixed_float16", "mixed_bfloat16"))
    parser.add_argument("--units", type=int, default=64)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    for policy in args.policy:
        print(json.dumps(measure(policy, args.units, args.batch, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
