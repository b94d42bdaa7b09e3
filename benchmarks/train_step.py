"""Train-step benchmark: the mixed precision guide's MLP (784-U-U-10, RMSprop, softmax
cross-entropy), per policy and backend. One JSON line per configuration.

    python benchmarks/train_step.py --policy float32 mixed_bfloat16 --units 1024 --batch 1024
    python benchmarks/train_step.py --path fit          # through mp.Model.fit
    python benchmarks/train_step.py --quick             # tiny sizes (a smoke run)

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
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

import mpcore as mp

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
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
                 seed: int = 0) -> None:
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

    def step(self) -> None:
        with mp.GradientTape() as tape:
            loss = self.forward()
            scaled = loss * self.loss_scale() if self.loss_scale is not None else loss
        grads = tape.gradient(scaled, self.variables)
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
                 seed: int = 0) -> None:
        mp.set_backend(backend.name)
        mp.set_global_policy(policy)
        inputs = mp.Input(shape=(784,), name="digits")
        x = mp.layers.Dense(units, activation="relu", name="dense_1")(inputs)
        x = mp.layers.Dense(units, activation="relu", name="dense_2")(x)
        x = mp.layers.Dense(10, name="dense_logits")(x)
        outputs = mp.layers.Activation("softmax", dtype="float32", name="predictions")(x)
        self.model = mp.Model(inputs=inputs, outputs=outputs)
        self.model.compile(loss="sparse_categorical_crossentropy",
                           optimizer=mp.optimizers.RMSprop())
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


def measure(backend: mp.Backend, path: str, policy: str, units: int, batch: int, steps: int,
            warmup: int) -> dict[str, Any]:
    record: dict[str, Any] = {"bench": "train_step", "path": path, "backend": backend.name,
                              "policy": policy, "units": units, "batch": batch}
    if path == "fit" and not hasattr(mp, "Model"):
        return {**record, "skipped": "mp.Model is not available yet (the training stack is "
                                     "not in this tree)"}
    try:
        device = backend.device().name
        backend.kernels()
    except Exception as exc:
        return {**record, "skipped": f"{type(exc).__name__}: {exc}"}
    record["device"] = device
    record["providers"] = [s.provider for s in backend.kernel_sets]
    if path == "loop":
        trainer = LoopTrainer(backend, policy, units, batch)
        for _ in range(warmup):
            trainer.step()
        backend.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            trainer.step()
        backend.synchronize()
        dt = (time.perf_counter() - t0) / steps
        record["update"] = "fused" if trainer.fused is not None else "ops"
        record["peak_traced_mb"] = round(peak_memory(trainer.step), 1)
        loss = trainer.loss_value()
        if trainer.skipped_steps:
            record["skipped_steps"] = trainer.skipped_steps
    else:
        fit = FitTrainer(backend, policy, units, batch, steps)
        try:
            fit.run(max(warmup, 1))
            backend.synchronize()
            t0 = time.perf_counter()
            fit.run(steps)
            backend.synchronize()
            dt = (time.perf_counter() - t0) / steps
            record["peak_traced_mb"] = round(peak_memory(lambda: fit.run(1)), 1)
            loss = fit.last_loss
        finally:
            fit.close()
    record.update({
        "ms_per_step": round(dt * 1e3, 3),
        "samples_per_s": round(batch / dt, 1),
        "gflops": round(flops_per_step(batch, units) / dt / 1e9, 2),
        "max_rss_mb": round(max_rss_mb(), 1),
        "steps": steps,
        "loss": round(loss, 5) if math.isfinite(loss) else None,
    })
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", nargs="+", choices=("loop", "fit"), default=["loop"])
    ap.add_argument("--policy", nargs="+", choices=POLICIES, default=list(POLICIES))
    ap.add_argument("--backend", action="append", default=None,
                    help="a backend name (repeatable; default: the current backend)")
    ap.add_argument("--units", type=int, default=None, help="hidden width (default 1024)")
    ap.add_argument("--batch", type=int, default=None, help="batch size (default 1024)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 20)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps (default 3)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    a = ap.parse_args(argv)
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
            for policy in a.policy:
                print(json.dumps(measure(backend, path, policy, units, batch, steps, warmup)),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
