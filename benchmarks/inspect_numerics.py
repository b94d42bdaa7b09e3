"""What the numerics inspector costs: ``mp.debugging.inspect_numerics`` on the guide's model
against one training step (``Model.train_step``, eager) of the same model and batch, timed in
alternating rounds in one process. One JSON line per configuration, with the median and range
of each and the median of the per-round ratios.

    python benchmarks/inspect_numerics.py           # 64 units, batch 128: the guide's CPU size
    python benchmarks/inspect_numerics.py --units 1024 --batch 1024 --rounds 5
    python benchmarks/inspect_numerics.py --dtypes float16 bfloat16
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import mpcore as mp
from mpcore.cli.demo import build_model
from mpcore.debugging import DEFAULT_DTYPES, FORMATS


def _seconds(fn: Callable[[], Any], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def measure(units: int, batch: int, policy: str, dtypes: tuple[str, ...], rounds: int,
            repeat: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    x = mp.constant(rng.random((batch, 784), dtype=np.float32))
    y = mp.constant(rng.integers(0, 10, batch).astype(np.int32))
    with mp.policy_scope(policy):
        model = build_model(units)
    model.compile(loss="sparse_categorical_crossentropy", optimizer=mp.optimizers.RMSprop())
    step = lambda: model.train_step(x, y)                               # noqa: E731
    inspect = lambda: mp.debugging.inspect_numerics(model, x, y, dtypes=dtypes)  # noqa: E731
    step(), inspect()                                                   # warm-up
    steps, inspections, ratios = [], [], []
    for r in range(rounds):
        pair = [(steps, step), (inspections, inspect)]
        for times, fn in (pair if r % 2 == 0 else pair[::-1]):
            times.append(_seconds(fn, repeat))
        ratios.append(inspections[-1] / steps[-1])
    return {"benchmark": "inspect_numerics", "backend": mp.get_backend().name,
            "units": units, "batch": batch, "policy": policy, "dtypes": list(dtypes),
            "rounds": rounds, "repeat": repeat,
            "train_step_ms": _summary(steps), "inspect_ms": _summary(inspections),
            "inspect_vs_step_median": statistics.median(ratios),
            "inspect_vs_step_range": [min(ratios), max(ratios)]}


def _summary(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1e3 for s in seconds]
    return {"median": statistics.median(ms), "min": min(ms), "max": max(ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, nargs="+", default=[64])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--policy", default="mixed_bfloat16",
                        choices=("float32", "mixed_float16", "mixed_bfloat16"))
    parser.add_argument("--dtypes", nargs="+", default=list(DEFAULT_DTYPES),
                        choices=list(FORMATS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=5, help="calls timed per round")
    args = parser.parse_args()
    for units in args.units:
        print(json.dumps(measure(units, args.batch, args.policy, tuple(args.dtypes),
                                 args.rounds, args.repeat)), flush=True)


if __name__ == "__main__":
    main()
