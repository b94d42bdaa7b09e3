"""Train-step benchmark: the mixed precision guide's MLP (784-U-U-10, RMSprop, softmax
cross-entropy), per policy and backend. One JSON line per configuration.

    python benchmarks/train_step.py --policy float32 mixed_bfloat16 --units 1024 --batch 1024
    python benchmarks/train_step.py --path fit          # through mp.Model.fit
    python benchmarks/train_step.py --quick             # tiny sizes (a smoke run)
    python benchmarks/train_step.py --interleave 8 --policy float32 mixed_float16
    python benchmarks/train_step.py --path fit --jit     # traced steps (mp.function)
    python benchmarks/train_step.py --path fit --interleave 7 --policy mixed_bfloat16 mixed_float8

``--interleave ROUNDS`` builds every policy's trainer in one process and times them in turn,
round after round (the order reversed every other round), so each policy's speed against
float32 is paired with a float32 run of the same minute: ``vs_float32_paired``, the median of
the per-round ratios, is the steadier figure on a VM whose speed drifts (``compare.py``'s runs
of one policy are separate processes, minutes apart).

``mixed_float8`` (FP8 GEMMs in the hidden Dense layers, the output layer in mixed_bfloat16, as
``mpcore demo`` builds it) runs with ``--path fit`` only: FP8 lives in the Dense layer, which
the hand-written loop does not use. With ``--interleave``, every policy's ratio to the first
policy given (not float32) is reported too (``vs_first_rounds``, ``vs_first_paired``).

``--path loop`` is the guide's custom training loop written with the core API: GradientTape,
``mp.ops.dense`` (the Dense layer's fused matmul + bias + relu),
``sparse_softmax_cross_entropy`` in float32, loss scaling with ``unscale_and_check`` for
mixed_float16, and an RMSprop update (the backend's fused ``rmsprop_update`` kernel where it
has one, else ops). ``--path fit`` trains the same model through ``mp.Model.fit``. The input
is random MNIST-shaped data, as in the PyTorch peer (``shared/peers/torch_mlp.py``), and
GFLOP/s counts the same 6 * batch * weights FLOPs. Both paths time their steps as the peer
does: all of them in one stretch, divided by their number (a mean; a median of per-step times
would drop the slow steps that the peer's figure keeps).

Peak memory: ``peak_traced_mb`` is the peak of memory allocated through Python's allocators
(NumPy arrays included) during one extra step run under tracemalloc, after the timed steps (so
tracing never slows them); ``max_rss_mb`` is the process's peak resident set size.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import resource
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

import mpcore as mp
from mpcore.cli.demo import build_model

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16", "mixed_float8")
#: What runs without --policy (mixed_float8 is asked for: it needs --path fit).
DEFAULT_POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
#: Traced steps (``--jit``) for every trainer this process builds.
JIT = False
# Keras RMSprop defaults, as the guide uses them
LR, RHO, EPSILON = 1e-3, 0.9, 1e-7


def flops_per_step(batch: int, units: int) -> int:
    """Forward 2*B*W, backward 4*B*W (input and weight gradients) over the weights W."""
    return 6 * batch * (784 * units + units * units + units * 10)


def glorot(rng: np.random.Generator, fan_in: int, fan_out: int) -> np.ndarray:
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)


class LoopTrainer:
    """The guide's custom training loop, written with the core API only."""

    def __init__(self, backend: mp.Backend, policy: str, units: int, batch: int,
                 seed: int = 0, jit: bool = False) -> None:
        self.backend = backend
        self.policy = mp.Policy(policy)
        self.compute = self.policy.compute_dtype
        rng = np.random.default_rng(seed)
        sizes = [784, units, units, 10]
        self.variables: list[mp.Variable] = []
        for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
            self.variables.append(mp.Variable(glorot(rng, fan_in, fan_out), name=f"kernel_{i}",
                                              backend=backend))
            self.variables.append(mp.Variable(np.zeros(fan_out, np.float32), name=f"bias_{i}",
                                              backend=backend))
        self.ms = [mp.Variable(np.zeros(v.shape, np.float32), trainable=False, backend=backend)
                   for v in self.variables]
        # The input batch is data: cast to the compute dtype once, as a layer would per call.
        x = rng.random((batch, 784), dtype=np.float32)
        self.x = mp.ops.cast(mp.constant(x, backend=backend), self.compute)
        self.y = mp.constant(rng.integers(0, 10, batch).astype(np.int32), backend=backend)
        self.loss_scale = self.policy.loss_scale
        self.fused = backend.kernels().get("rmsprop_update")
        self.last_loss = float("nan")
        self.skipped_steps = 0
        self.traced = mp.function(self.loss_and_grads) if jit else self.loss_and_grads

    def forward(self) -> mp.Tensor:
        h = self.x
        last = len(self.variables) // 2 - 1
        for layer in range(last + 1):
            kernel, bias = self.variables[2 * layer], self.variables[2 * layer + 1]
            # the Dense layer's op: matmul, bias and relu fused where the backend can
            h = mp.ops.dense(h, kernel.read_as(self.compute), bias.read_as(self.compute),
                             "relu" if layer < last else None)
        # the guide's output layer: softmax in float32 (here fused into the loss)
        per_example = mp.ops.sparse_softmax_cross_entropy(self.y, mp.ops.cast(h, "float32"))
        return mp.ops.mean(per_example)

    def loss_and_grads(self, scale: mp.Tensor | None) -> tuple[mp.Tensor, list[Any]]:
        """Forward and backward: the part ``--jit`` traces (the scale is an input, so a replay
        uses the scale of its own step)."""
        with mp.GradientTape() as tape:
            loss = self.forward()
            scaled = loss * scale if scale is not None else loss
        return loss, tape.gradient(scaled, self.variables)

    def step(self) -> None:
        scale = (None if self.loss_scale is None
                 else mp.constant(self.loss_scale(), backend=self.backend))
        loss, grads = self.traced(scale)
        flag = None
        if self.loss_scale is not None:
            grads, flag = mp.ops.unscale_and_check(grads, 1.0 / self.loss_scale())
            if not self.loss_scale.update(flag):
                self.skipped_steps += 1
                return
        self.apply(grads, flag)
        self.last_loss = loss

    def apply(self, grads: list[Any], flag: Any) -> None:
        if self.fused is not None:
            flag_data = None if flag is None else flag.data
            for var, grad, ms in zip(self.variables, grads, self.ms):
                self.fused(var.data, grad.data, ms.data, None, LR, RHO, 0.0, EPSILON, flag_data)
                var.mark_updated()
                ms.mark_updated()
            return
        for var, grad, ms in zip(self.variables, grads, self.ms):
            ms.assign(ms * RHO + mp.ops.square(grad) * (1.0 - RHO))
            var.assign(var - grad * LR / mp.ops.sqrt(ms + EPSILON))

    def loss_value(self) -> float:
        return float(self.last_loss) if isinstance(self.last_loss, mp.Tensor) else math.nan


class FitTrainer:
    """The same model through ``mp.Model.fit`` (the guide's first half)."""

    def __init__(self, backend: mp.Backend, policy: str, units: int, batch: int, steps: int,
                 seed: int = 0, jit: bool = False) -> None:
        mp.set_backend(backend.name)
        mp.set_global_policy(policy)
        self.model = build_model(units)
        self.model.compile(loss="sparse_categorical_crossentropy",
                           optimizer=mp.optimizers.RMSprop(), jit_compile=jit)
        rng = np.random.default_rng(seed)
        self.batch = batch
        self.steps = steps
        self.x = rng.random((batch * steps, 784), dtype=np.float32)
        self.y = rng.integers(0, 10, batch * steps).astype(np.int32)
        self.last_loss = math.nan

    def run(self, steps: int) -> None:
        n = self.batch * steps
        history = self.model.fit(self.x[:n], self.y[:n], batch_size=self.batch, epochs=1,
                                 verbose=0, shuffle=False)
        losses = getattr(history, "history", {}).get("loss") or [math.nan]
        self.last_loss = float(losses[-1])

    def close(self) -> None:
        mp.set_global_policy(None)


def peak_memory(run_one: Callable[[], None]) -> float:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        run_one()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 2**20


def max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class Runner:
    """One configuration (path, policy) ready to time: ``timed(steps)`` runs that many steps in
    one stretch and returns seconds per step."""

    def __init__(self, backend: mp.Backend, path: str, policy: str, units: int, batch: int,
                 steps: int) -> None:
        self.backend = backend
        self.policy = policy
        self.loop = LoopTrainer(backend, policy, units, batch, jit=JIT) if path == "loop" else None
        self.fit = (FitTrainer(backend, policy, units, batch, steps, jit=JIT) if path == "fit"
                    else None)

    def run(self, steps: int) -> None:
        if self.loop is not None:
            for _ in range(steps):
                self.loop.step()
        else:
            assert self.fit is not None
            # the global policy as FitTrainer set it when it built the model, even when
            # another trainer was built since (interleaved runs)
            with mp.policy_scope(self.policy):
                self.fit.run(steps)

    def warm_up(self, steps: int) -> None:
        # fit's first call builds the optimizer's slots: never timed, whatever --warmup says
        self.run(max(steps, 1) if self.fit is not None else steps)

    def timed(self, steps: int) -> float:
        self.backend.synchronize()
        t0 = time.perf_counter()
        self.run(steps)
        self.backend.synchronize()
        return (time.perf_counter() - t0) / steps

    def finish(self, record: dict[str, Any]) -> None:
        """Peak memory, loss and the like into ``record``; releases the global policy."""
        try:
            record["peak_traced_mb"] = round(peak_memory(lambda: self.run(1)), 1)
            if self.loop is not None:
                record["update"] = "fused" if self.loop.fused is not None else "ops"
                loss = self.loop.loss_value()
                if self.loop.skipped_steps:
                    record["skipped_steps"] = self.loop.skipped_steps
            else:
                assert self.fit is not None
                loss = self.fit.last_loss
            record["loss"] = round(loss, 5) if math.isfinite(loss) else None
            if JIT:
                # the recorded program's length: step time / ops is the replay's cost per
                # recorded op, kernel included (compare with the same figure eagerly)
                traced = (self.loop.traced if self.loop is not None
                          else self.fit.model._traced.get("train"))  # type: ignore[union-attr]
                graph = getattr(traced, "graph", None)
                record["program_ops"] = len(graph.steps) if graph is not None else None
        finally:
            self.close()

    def close(self) -> None:
        if self.fit is not None:
            self.fit.close()


def _header(backend: mp.Backend, path: str, policy: str, units: int,
            batch: int) -> dict[str, Any]:
    """The record's identity, with ``skipped`` (why) where the configuration cannot run."""
    record: dict[str, Any] = {"bench": "train_step", "path": path, "backend": backend.name,
                              "policy": policy, "units": units, "batch": batch, "jit": JIT}
    if path == "fit" and not hasattr(mp, "Model"):
        return {**record, "skipped": "mp.Model is not available yet (the training stack is "
                                     "not in this tree)"}
    try:
        device = backend.device().name
        backend.kernels()
        verdict = mp.check_policy(policy, backend)
    except Exception as exc:
        return {**record, "skipped": f"{type(exc).__name__}: {exc}"}
    record["device"] = device
    record["providers"] = [s.provider for s in backend.kernel_sets]
    # whether the backend expects this policy to be fast here, and why (compare.py's targets
    # for 16-bit speed apply only where it does)
    record["fast"] = verdict.fast
    record["why"] = verdict.reason
    return record


def _speed(record: dict[str, Any], dt: float, batch: int, units: int, steps: int) -> None:
    record.update({
        "ms_per_step": round(dt * 1e3, 3),
        "samples_per_s": round(batch / dt, 1),
        "gflops": round(flops_per_step(batch, units) / dt / 1e9, 2),
        "max_rss_mb": round(max_rss_mb(), 1),
        "steps": steps,
    })
    if record.get("program_ops"):
        record["us_per_recorded_op"] = round(dt * 1e6 / record["program_ops"], 2)


def measure(backend: mp.Backend, path: str, policy: str, units: int, batch: int, steps: int,
            warmup: int) -> dict[str, Any]:
    record = _header(backend, path, policy, units, batch)
    if "skipped" in record:
        return record
    runner = Runner(backend, path, policy, units, batch, steps)
    try:
        runner.warm_up(warmup)
        dt = runner.timed(steps)
    except BaseException:
        runner.close()
        raise
    runner.finish(record)
    _speed(record, dt, batch, units, steps)
    return record


def interleaved(backend: mp.Backend, path: str, policies: list[str], units: int, batch: int,
                steps: int, warmup: int, rounds: int) -> list[dict[str, Any]]:
    """Every policy in one process, alternating: each round times ``steps`` steps of each
    (the order reversed every other round), so all policies see the machine of the same
    minute. Records as :func:`measure`'s, ``ms_per_step`` the median over rounds, plus the
    per-round times and, with float32 among the policies, the per-round speed ratios to it
    (``vs_float32_rounds``) and their median (``vs_float32_paired``)."""
    records = {p: _header(backend, path, p, units, batch) for p in policies}
    live = [p for p in policies if "skipped" not in records[p]]
    runners: dict[str, Runner] = {}
    times: dict[str, list[float]] = {p: [] for p in live}
    try:
        for p in live:
            runners[p] = Runner(backend, path, p, units, batch, steps)
            runners[p].warm_up(warmup)
        for r in range(rounds):
            for p in live if r % 2 == 0 else live[::-1]:
                times[p].append(runners[p].timed(steps))
    except BaseException:
        for runner in runners.values():
            runner.close()
        raise
    for p in live:
        record = records[p]
        runners[p].finish(record)
        _speed(record, statistics.median(times[p]), batch, units, steps)
        record["rounds"] = rounds
        record["ms_per_step_rounds"] = [round(t * 1e3, 3) for t in times[p]]
        if "float32" in times:
            ratios = [f / t for f, t in zip(times["float32"], times[p])]
            record["vs_float32_rounds"] = [round(x, 3) for x in ratios]
            record["vs_float32_paired"] = round(statistics.median(ratios), 3)
        first = live[0]
        if first != "float32":   # e.g. mixed_float8 against mixed_bfloat16, round by round
            ratios = [f / t for f, t in zip(times[first], times[p])]
            record["vs_first"] = first
            record["vs_first_rounds"] = [round(x, 3) for x in ratios]
            record["vs_first_paired"] = round(statistics.median(ratios), 3)
    return [records[p] for p in policies]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", nargs="+", choices=("loop", "fit"), default=["loop"])
    ap.add_argument("--policy", nargs="+", choices=POLICIES, default=list(DEFAULT_POLICIES))
    ap.add_argument("--backend", action="append", default=None,
                    help="a backend name (repeatable; default: the current backend)")
    ap.add_argument("--units", type=int, default=None, help="hidden width (default 1024)")
    ap.add_argument("--batch", type=int, default=None, help="batch size (default 1024)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 20)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps (default 3)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    ap.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                    help="time the policies in one process, alternating for ROUNDS rounds, "
                         "and report each one's speed against float32 round by round")
    ap.add_argument("--jit", action="store_true",
                    help="traced steps: fit with compile(jit_compile=True); the loop's forward "
                         "and backward through mp.function")
    a = ap.parse_args(argv)
    if "mixed_float8" in a.policy and "loop" in a.path:
        ap.error("mixed_float8 needs --path fit (its FP8 GEMMs live in the Dense layer; the "
                 "loop path multiplies with mp.ops.dense); valid paths for it: fit")
    global JIT
    JIT = a.jit
    units = a.units or (32 if a.quick else 1024)
    batch = a.batch or (16 if a.quick else 1024)
    steps = a.steps or (2 if a.quick else 20)
    warmup = a.warmup if a.warmup is not None else (1 if a.quick else 3)
    names = a.backend or [mp.get_backend().name]
    for name in names:
        try:
            backend = mp.get_backend(name)
        except Exception as exc:
            print(json.dumps({"bench": "train_step", "backend": name,
                              "skipped": f"{type(exc).__name__}: {exc}"}), flush=True)
            continue
        for path in a.path:
            if a.interleave:
                for record in interleaved(backend, path, a.policy, units, batch, steps, warmup,
                                          a.interleave):
                    print(json.dumps(record), flush=True)
                continue
            for policy in a.policy:
                print(json.dumps(measure(backend, path, policy, units, batch, steps, warmup)),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
