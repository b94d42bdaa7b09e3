"""Profile training steps of the train-step benchmark's MLP with cProfile: where a step's time
goes outside the GEMMs. Prints the top entries (by own time and by cumulative time) as text,
then one JSON line with the same entries.

    python benchmarks/profile_step.py --path loop fit --policy float32 mixed_float16 \\
        --units 1024 --batch 1024 --steps 10 --top 25

The models, data and steps are those of ``benchmarks/train_step.py`` (``LoopTrainer`` and
``FitTrainer``), so a profile explains a benchmark line. cProfile adds a few microseconds per
Python call: compare the shares of the time, not the absolute times, with the benchmark's.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path
from typing import Any

import mpcore as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step import POLICIES, FitTrainer, LoopTrainer


def _entries(stats: pstats.Stats, key: str, top: int, total: float) -> list[dict[str, Any]]:
    rows = []
    raw = stats.stats  # type: ignore[attr-defined]
    order = sorted(raw.items(), key=lambda kv: kv[1][2 if key == "tottime" else 3], reverse=True)
    for (filename, line, func), (_cc, ncalls, tottime, cumtime, _callers) in order[:top]:
        where = filename if filename.startswith("~") else f"{Path(filename).name}:{line}"
        rows.append({"function": f"{where}({func})", "calls": ncalls,
                     "tottime_ms": round(tottime * 1e3, 2), "cumtime_ms": round(cumtime * 1e3, 2),
                     "tottime_share": round(tottime / total, 4) if total else None})
    return rows


def profile(backend: mp.Backend, path: str, policy: str, units: int, batch: int, steps: int,
            warmup: int, top: int) -> dict[str, Any]:
    profiler = cProfile.Profile()
    if path == "loop":
        trainer = LoopTrainer(backend, policy, units, batch)
        for _ in range(warmup):
            trainer.step()

        def run() -> None:
            for _ in range(steps):
                trainer.step()
    else:
        fit = FitTrainer(backend, policy, units, batch, steps)
        fit.run(max(warmup, 1))

        def run() -> None:
            fit.run(steps)
    t0 = time.perf_counter()
    profiler.runcall(run)
    backend.synchronize()
    wall = time.perf_counter() - t0
    if path == "fit":
        fit.close()
    stats = pstats.Stats(profiler)
    total = stats.total_tt  # type: ignore[attr-defined]
    return {"bench": "profile_step", "path": path, "policy": policy, "backend": backend.name,
            "units": units, "batch": batch, "steps": steps,
            "ms_per_step_profiled": round(wall / steps * 1e3, 2),
            "by_tottime": _entries(stats, "tottime", top, total),
            "by_cumtime": _entries(stats, "cumtime", top, total)}


def _print(record: dict[str, Any]) -> None:
    print(f"\n== {record['path']} {record['policy']} ({record['backend']}, units="
          f"{record['units']}, batch={record['batch']}): {record['ms_per_step_profiled']} "
          "ms/step under cProfile ==")
    for key in ("by_tottime", "by_cumtime"):
        print(f"-- {key} (ms over {record['steps']} steps) --")
        print(f"{'calls':>8}{'tottime':>10}{'cumtime':>10}{'share':>8}  function")
        for row in record[key]:
            print(f"{row['calls']:>8}{row['tottime_ms']:>10.1f}{row['cumtime_ms']:>10.1f}"
                  f"{row['tottime_share']:>8.1%}  {row['function']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", nargs="+", choices=("loop", "fit"), default=["loop", "fit"])
    ap.add_argument("--policy", nargs="+", choices=POLICIES, default=list(POLICIES))
    ap.add_argument("--backend", default=None, help="a backend name (default: the current one)")
    ap.add_argument("--units", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json-only", action="store_true", help="print only the JSON lines")
    a = ap.parse_args(argv)
    backend = mp.get_backend(a.backend) if a.backend else mp.get_backend()
    for path in a.path:
        for policy in a.policy:
            record = profile(backend, path, policy, a.units, a.batch, a.steps, a.warmup, a.top)
            if not a.json_only:
                _print(record)
            print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
