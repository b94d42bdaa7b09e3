"""What the Python-state check (mpcore.tracing.python_state) adds to tracing a step: a ResNet
with about as many layers as ResNet-50 (``--blocks 8``: 176), its training step traced (a kept
trace: the model and optimizer built first), timed with and without the check's two parts
(the snapshot before the step, the comparison after). Replays never take the snapshot.

    python benchmarks/trace_python_state.py [--blocks 8] [--repeats 5]

prints one JSON line: layers, owners watched, the fastest of the fresh traces with the check
and without it (alternated; on a loaded machine the spread of whole traces is wide), and the
median time the check itself took inside a trace (snapshot, around the calls kept whole,
comparison) with its share of the trace without it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_zoo import ResNetShape, resnet

import mpcore as mp
from mpcore.tracing import python_state as _python_state
from mpcore.tracing.python_state import StateWatch


class _Off:
    """No check: the trace as it was before mpcore.tracing.python_state."""

    def __init__(self, *args: Any) -> None:
        pass

    def before_whole(self, *args: Any) -> dict[int, Any]:
        return {}

    def after_whole(self, *args: Any) -> None:
        pass

    def refusal(self, *args: Any) -> None:
        return None


class _Timed(StateWatch):
    """The check, its time inside the trace counted (snapshot, calls kept whole, comparison)."""

    spent = 0.0
    owners = 0

    def __init__(self, *args: Any) -> None:
        start = time.perf_counter()
        super().__init__(*args)
        _Timed.spent += time.perf_counter() - start
        _Timed.owners = len(self.owners)

    def before_whole(self, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return super().before_whole(*args)
        finally:
            _Timed.spent += time.perf_counter() - start

    def after_whole(self, *args: Any) -> None:
        start = time.perf_counter()
        super().after_whole(*args)
        _Timed.spent += time.perf_counter() - start

    def refusal(self, *args: Any) -> str | None:
        start = time.perf_counter()
        try:
            return super().refusal(*args)
        finally:
            _Timed.spent += time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=2)
    a = parser.parse_args()
    model = resnet(ResNetShape(size=16, blocks=a.blocks))
    model.compile(optimizer="sgd", loss=mp.losses.SparseCategoricalCrossentropy(
        from_logits=True), jit_compile=True)
    rng = np.random.default_rng(0)
    x = rng.random((a.batch, 16, 16, 1)).astype(np.float32)
    y = rng.integers(0, 10, a.batch).astype(np.int32)
    model.fit(x, y, batch_size=a.batch, epochs=1, verbose=0)     # built: variables and slots
    xs, ys = mp.constant(x), mp.constant(y)
    times: dict[bool, list[float]] = {True: [], False: []}
    spent: list[float] = []
    for n in range(a.repeats):
        for on in ((True, False) if n % 2 else (False, True)):     # (alternated)
            _python_state.StateWatch = _Timed if on else _Off  # type: ignore[misc]
            try:
                step = mp.function(model._train_compute)
                _Timed.spent = 0.0
                start = time.perf_counter()
                step(xs, ys)                         # a fresh trace (kept: nothing to build)
                times[on].append(time.perf_counter() - start)
            finally:
                _python_state.StateWatch = StateWatch  # type: ignore[misc]
            assert step.tracing_count == 1 and step.eager_reason is None
            if on:
                spent.append(_Timed.spent)
    with_ms, without_ms = (min(times[on]) * 1e3 for on in (True, False))
    print(json.dumps({"bench": "trace_python_state", "layers": len(model.layers),
                      "owners": _Timed.owners, "trace_ms_min": round(with_ms, 2),
                      "trace_ms_min_without_check": round(without_ms, 2),
                      "check_ms": round(statistics.median(spent) * 1e3, 2),
                      "check_share": round(statistics.median(spent) * 1e3 / without_ms, 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
