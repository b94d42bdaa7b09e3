"""Data-parallel benchmark: ``mp.distribution.DataParallel`` on N ranks of 1 thread each
against 1 process of 1 thread, the guide's MLP (784-U-U-10, RMSprop) trained with
``Model.fit`` at one global batch size. One JSON line per round and configuration, then a
summary line.

    python benchmarks/data_parallel.py                       # units 1024, batch 1024, 2 ranks
    python benchmarks/data_parallel.py --rounds 7 --steps 24
    python benchmarks/data_parallel.py --quick               # tiny sizes (a smoke run)

Rounds alternate (one process, N ranks, then N independent processes; the order reversed
every other round), so each ratio pairs runs of the same minute on a VM whose speed drifts.
Each run trains ``--epochs`` epochs of ``--steps`` global batches on random MNIST-shaped
data and times the last epoch (the first ones warm up). Reported per run: samples/s; under N
ranks, each rank's all-reduce share of the step (time inside the engine's collectives: the
per-step header, the gradient buckets and the finite flag, over the epoch's time); each
process's max RSS, and its RSS before the data and the model existed (the MPI runtime's share
is the difference there); and the peak of the memory allocated through Python's allocators
(NumPy arrays included, MPI's buffers not) during one more step (``train_on_batch`` on the
rank's rows) under tracemalloc, after the timed epochs. The third configuration, N
independent processes of batch B/N side by side with no communication, is the ceiling this
machine allows (cores, memory bandwidth, the other workers' load), so the speedup can be read
against it; a rank's peak less that process's (the same local batch) is what the gradient
buckets add, to be read against ``gradient_mb``, the gradients' size. Where the buckets go
through MPI-3 shared memory (``shared_memory_buckets``: every rank on this node), that peak
is near 0: the window is MPI's memory, not Python's, and shows in the max RSS instead (the
pages a rank touches: its staging row, the others' rows' parts it sums, the sums).
The summary holds the medians and ranges over the rounds, ``speedup`` being the
median of the per-round ratios, and the machine's load average when it started and ended.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from typing import Any

import numpy as np

import mpcore as mp
from mpcore.cli.demo import build_model
from mpcore.distribution import launch
from mpcore.distribution.sharding import rows_of


class TimedEngine:
    """The engine of a distribution, with the time spent in its collectives added up."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._engine, name)
        if name not in ("allreduce", "allreduce_buckets", "allreduce_values",
                        "allgather_values", "broadcast", "broadcast_values", "barrier"):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return timed


def build(units: int) -> Any:
    model = build_model(units)
    model.compile(loss="sparse_categorical_crossentropy", optimizer=mp.optimizers.RMSprop(),
                  metrics=["accuracy"])
    return model


def worker(args: argparse.Namespace) -> None:
    """One run (one process, or one rank of a job): prints its JSON line."""
    mp.set_backend("cpu")
    mp.set_global_policy(args.policy)
    timed = None
    if args.distributed:
        dist = mp.distribution.DataParallel()
        timed = dist.engine = TimedEngine(dist.engine)  # type: ignore[assignment]
        mp.distribution.set_distribution(dist)
    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    mp.random.set_seed(0)
    rng = np.random.default_rng(0)
    n = args.batch * args.steps
    x = rng.random((n, 784), dtype=np.float32)
    y = rng.integers(0, 10, size=n).astype(np.int64)
    model = build(args.units)
    seconds = []
    for _ in range(args.epochs):
        before = timed.seconds if timed is not None else 0.0
        start = time.perf_counter()
        model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, shuffle=True)
        seconds.append((time.perf_counter() - start,
                        (timed.seconds - before) if timed is not None else 0.0))
    epoch_s, collective_s = seconds[-1]
    # one step on this rank's rows of a global batch (moved to the backend before the trace)
    lo, hi = rows_of(0, args.batch, mp.distribution.rank(), mp.distribution.world_size())
    xb, yb = mp.constant(x[lo:hi]), mp.constant(y[lo:hi])
    tracemalloc.start()
    model.train_on_batch(xb, yb)
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    mine = [epoch_s, collective_s, rss_start,
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, peak]
    gradient_mb = sum(v.size * 4 for v in model.trainable_variables) / 2**20
    # rank 0 prints every rank's line (lines of several ranks would interleave)
    rows = timed.allgather_values(mine) if timed is not None else [mine]
    if mp.distribution.rank() != 0:
        return
    # whether the gradient buckets went through MPI-3 shared memory (None: one process)
    shared = getattr(getattr(timed, "shared", None), "on_one_node", None)
    for rank, (epoch_s, collective_s, rss_start, rss_max, peak) in enumerate(rows):
        print(json.dumps({"rank": rank, "ranks": len(rows), "epoch_s": epoch_s,
                          "samples_per_s": n / epoch_s,
                          "allreduce_share": collective_s / epoch_s,
                          "rss_at_start_mb": rss_start, "max_rss_mb": rss_max,
                          "peak_step_mb": peak, "gradient_mb": gradient_mb,
                          "shared_memory_buckets": shared}), flush=True)


def run(args: argparse.Namespace, config: str) -> list[dict[str, Any]]:
    """``config``: "single" (1 process, the global batch), "ranks" (N ranks of one job) or
    "ceiling" (N independent processes of batch B/N at once)."""
    batch = args.batch // args.ranks if config == "ceiling" else args.batch
    script = [os.path.abspath(__file__), "--worker", "--units", str(args.units), "--batch",
              str(batch), "--steps", str(args.steps), "--epochs", str(args.epochs),
              "--policy", args.policy]
    env = launch.environment(threads=1)
    if config == "ranks":
        cmds = [launch.command(args.ranks, [*script, "--distributed"])]
    else:
        cmds = [[sys.executable, *script]] * (args.ranks if config == "ceiling" else 1)
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for cmd in cmds]
    records = []
    for cmd, proc in zip(cmds, procs):
        out, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-3000:]}")
        records += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return sorted(records, key=lambda r: r["rank"])


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=1024, help="the global batch size")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16, help="global batches per epoch")
    parser.add_argument("--epochs", type=int, default=3, help="the last one is timed")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--policy", default="float32")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--distributed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.units, args.batch, args.steps, args.epochs, args.rounds = 32, 64, 4, 2, 1
    if args.worker:
        worker(args)
        return
    load_start = os.getloadavg()
    ratios, ceilings, shares, single_rss, rank_rss, added = [], [], [], [], [], []
    for r in range(args.rounds):
        order = ("single", "ranks", "ceiling")
        results = {c: run(args, c) for c in (order if r % 2 == 0 else order[::-1])}
        one, many = results["single"][0], results["ranks"]
        speed = min(x["samples_per_s"] for x in many)  # the job is as fast as its slowest rank
        ratios.append(speed / one["samples_per_s"])
        ceilings.append(args.ranks * min(x["samples_per_s"] for x in results["ceiling"])
                        / one["samples_per_s"])
        shares.append(many[0]["allreduce_share"])
        single_rss.append(one["max_rss_mb"])
        rank_rss.append(max(x["max_rss_mb"] for x in many))
        added.append(max(x["peak_step_mb"] for x in many)
                     - max(x["peak_step_mb"] for x in results["ceiling"]))
        print(json.dumps({"round": r, "single": one, "ranks": many, "speedup": ratios[-1],
                          "ceiling": results["ceiling"], "ceiling_speedup": ceilings[-1]}),
              flush=True)
    print(json.dumps({
        "bench": "data_parallel", "units": args.units, "global_batch": args.batch,
        "ranks": args.ranks, "threads_per_process": 1, "policy": args.policy,
        "rounds": args.rounds, "speedup": summary(ratios),
        "ceiling_speedup": summary(ceilings),
        "allreduce_share_rank0": summary(shares),
        "max_rss_mb_single": summary(single_rss), "max_rss_mb_per_rank": summary(rank_rss),
        "bucket_peak_added_mb": summary(added), "gradient_mb": one["gradient_mb"],
        "shared_memory_buckets": many[0]["shared_memory_buckets"],
        "loadavg_start": load_start, "loadavg_end": os.getloadavg()}), flush=True)


if __name__ == "__main__":
    main()
