"""The mixed precision graph rewrite's traced training step against the float32 traced step
(and the mixed_bfloat16 policy's), side by side in one process: the guide's MLP (784-U-U-10,
RMSprop) through ``Model.fit`` with traced steps, the same float32 model with and without
``enable_mixed_precision_graph_rewrite``. One JSON line per configuration.

    python benchmarks/amp_rewrite.py --units 1024 --batch 1024 --rounds 7 --steps 8
    python benchmarks/amp_rewrite.py --quick

Rounds alternate (the order reversed every other round); each round times ``--steps`` steps of
each configuration, so every ratio pairs runs of the same minute. ``ms_per_step`` is the median
over rounds, with the range; ``vs_float32_paired`` the median of the per-round speed ratios to
the float32 traced step (> 1: faster), with their range; ``vs_float32_best`` the ratio of
the fastest rounds (steadier where other processes share the cores). The rewrite is on only
around its own configuration's steps (its traced steps are cached under the rewrite's
signature, the float32 ones under theirs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

import mpcore as mp
from mpcore.cli.demo import build_model

CONFIGS = ("float32", "rewrite", "mixed_bfloat16")


class Trainer:
    """One configuration: the guide's model, compiled with traced steps."""

    def __init__(self, config: str, units: int, batch: int, steps: int, dtype: str | None,
                 optimizer: str = "rmsprop", seed: int = 0) -> None:
        self.config, self.dtype = config, dtype
        mp.set_global_policy("mixed_bfloat16" if config == "mixed_bfloat16" else None)
        mp.random.set_seed(seed)
        self.model = build_model(units)
        mp.set_global_policy(None)
        opt: Any = mp.optimizers.get(optimizer)
        if config == "rewrite":
            opt = self._enable(opt)
        self.model.compile(loss="sparse_categorical_crossentropy", optimizer=opt,
                           jit_compile=True)
        self._disable()
        rng = np.random.default_rng(seed)
        self.batch = batch
        self.x = rng.random((batch * steps, 784), dtype=np.float32)
        self.y = rng.integers(0, 10, batch * steps).astype(np.int32)

    def _enable(self, opt: Any) -> Any:
        if self.config != "rewrite":
            return opt
        return mp.mixed_precision.enable_mixed_precision_graph_rewrite(opt, dtype=self.dtype)

    def _disable(self) -> None:
        mp.mixed_precision.disable_mixed_precision_graph_rewrite()

    def run(self, steps: int) -> None:
        # the rewrite is global, as TF's: on around this configuration's steps only (enabling
        # it again with the same lists and dtype finds the same traced programs)
        self._enable(mp.optimizers.SGD())
        try:
            with mp.policy_scope(self.config if self.config == "mixed_bfloat16" else "float32"):
                n = self.batch * steps
                self.model.fit(self.x[:n], self.y[:n], batch_size=self.batch, epochs=1,
                               verbose=0, shuffle=False)
        finally:
            self._disable()

    def timed(self, steps: int) -> float:
        t0 = time.perf_counter()
        self.run(steps)
        return (time.perf_counter() - t0) / steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps (traces included)")
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default=None,
                    help="the rewrite's 16-bit dtype (default: the device's fast one)")
    ap.add_argument("--optimizer", choices=("rmsprop", "sgd"), default="rmsprop",
                    help="the guide's RMSprop, or SGD (an update that costs less next to the "
                         "matmuls)")
    ap.add_argument("--config", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    a = ap.parse_args(argv)
    if a.quick:
        a.units, a.batch, a.steps, a.rounds, a.warmup = 32, 16, 2, 2, 2
    configs = ["float32", *(c for c in a.config if c != "float32")]
    backend = mp.get_backend()
    trainers = {c: Trainer(c, a.units, a.batch, a.steps, a.dtype, a.optimizer) for c in configs}
    for trainer in trainers.values():
        trainer.run(a.warmup)
    times: dict[str, list[float]] = {c: [] for c in configs}
    for r in range(a.rounds):
        for c in configs if r % 2 == 0 else configs[::-1]:
            times[c].append(trainers[c].timed(a.steps))
    for c in configs:
        ratios = [f / t for f, t in zip(times["float32"], times[c])]
        record: dict[str, Any] = {
            "bench": "amp_rewrite", "config": c, "backend": backend.name,
            "device": backend.device().name, "optimizer": a.optimizer, "units": a.units,
            "batch": a.batch,
            "steps": a.steps, "rounds": a.rounds,
            "ms_per_step": round(statistics.median(times[c]) * 1e3, 3),
            "ms_per_step_range": [round(min(times[c]) * 1e3, 3), round(max(times[c]) * 1e3, 3)],
            "vs_float32_paired": round(statistics.median(ratios), 3),
            "vs_float32_range": [round(min(ratios), 3), round(max(ratios), 3)],
            "vs_float32_rounds": [round(x, 3) for x in ratios],
            # the fastest round of each against float32's: on a shared machine the rounds
            # another process slowed down drop out
            "vs_float32_best": round(min(times["float32"]) / min(times[c]), 3),
        }
        if c == "rewrite":
            graph = str(trainers[c].model._traced["train"].graph)
            record["rewrite"] = next(line for line in graph.splitlines()
                                     if line.startswith("mixed precision graph rewrite"))
        print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
