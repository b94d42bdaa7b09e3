"""Prefetching a generator's batches while the step runs: ``Model.fit`` on a generator that
sleeps ``--sleep-ms`` per batch (a stand-in for reading and decoding data), a small MLP.

Three timings, the median ms per step over ``--epochs`` epochs of ``--steps`` steps each (the
first epoch, which traces the step, is left out):

- ``step_ms``: fit on the same batches as in-memory arrays (no loading): the step alone;
- ``serial_ms``: the generator loaded in the main thread (``MPCORE_PREFETCH=0``): about
  ``sleep + step``;
- ``prefetch_ms``: the generator loaded on the prefetch thread while the step runs: about
  ``max(sleep, step)``.

One JSON line. ``--prefetch off`` (or ``on``) runs only that mode.

    OMP_NUM_THREADS=1 python benchmarks/data_prefetch.py
    OMP_NUM_THREADS=1 python benchmarks/data_prefetch.py --sleep-ms 10 --units 512 --batch 512
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

import mpcore as mp
from mpcore import layers


def _model(units: int) -> mp.Model:
    mp.random.set_seed(0)
    inputs = mp.Input((784,))
    x = layers.Dense(units, activation="relu")(inputs)
    x = layers.Dense(units, activation="relu")(x)
    model = mp.Model(inputs, layers.Dense(10, activation="softmax")(x))
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


class EpochTimer(mp.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.seconds.append(time.perf_counter() - self._start)


def _sleepy(xs: list[np.ndarray], ys: list[np.ndarray], sleep_s: float) -> Iterator[Any]:
    i = 0
    while True:
        time.sleep(sleep_s)          # the batch's loading time
        yield xs[i % len(xs)], ys[i % len(ys)]
        i += 1


def _per_step_ms(timer: EpochTimer, steps: int) -> float:
    return statistics.median(timer.seconds[1:]) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sleep-ms", type=float, default=5.0)
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--prefetch", choices=("both", "on", "off"), default="both")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    xs = [rng.random((args.batch, 784), dtype=np.float32) for _ in range(args.steps)]
    ys = [rng.integers(0, 10, args.batch).astype(np.int32) for _ in range(args.steps)]
    sleep_s = args.sleep_ms / 1e3
    out: dict[str, Any] = {"benchmark": "data_prefetch", "backend": mp.get_backend().name,
                           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                           "sleep_ms": args.sleep_ms, "units": args.units,
                           "batch": args.batch, "steps": args.steps, "epochs": args.epochs}
    timer = EpochTimer()
    _model(args.units).fit(np.concatenate(xs), np.concatenate(ys), batch_size=args.batch,
                           epochs=args.epochs, shuffle=False, callbacks=[timer], verbose=0)
    out["step_ms"] = round(_per_step_ms(timer, args.steps), 3)
    out["serial_sum_ms"] = round(args.sleep_ms + out["step_ms"], 3)
    modes = {"both": ("off", "on"), "on": ("on",), "off": ("off",)}[args.prefetch]
    for mode in modes:
        os.environ["MPCORE_PREFETCH"] = "1" if mode == "on" else "0"
        timer = EpochTimer()
        _model(args.units).fit(_sleepy(xs, ys, sleep_s), steps_per_epoch=args.steps,
                               epochs=args.epochs, shuffle=False, callbacks=[timer],
                               verbose=0)
        out["prefetch_ms" if mode == "on" else "serial_ms"] = round(
            _per_step_ms(timer, args.steps), 3)
    if "prefetch_ms" in out:
        out["prefetch_vs_serial_sum"] = round(out["prefetch_ms"] / out["serial_sum_ms"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
