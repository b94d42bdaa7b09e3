"""CUDA train-step benchmark: the mixed precision guide's model (784-4096-4096-10, batch 8192,
RMSprop, softmax cross-entropy) trained with the guide's custom training loop, per policy, side
by side with the PyTorch peer (``torch_mlp.py --device cuda``) in the same run.

    python benchmarks/cuda_train_step.py                       # float32 and mixed_float16
    python benchmarks/cuda_train_step.py --policy float32 mixed_float16 mixed_bfloat16
    python benchmarks/cuda_train_step.py --backend cpu --units 64 --batch 128 --no-peer  # smoke
    python benchmarks/cuda_train_step.py --jit --units 64 --batch 128 --no-peer   # mp.function
    MPCORE_CUDA_GRAPHS=0 python benchmarks/cuda_train_step.py --jit ...   # without CUDA graphs

The loop uses the public API only: Variables read in the compute dtype (``read_as``), ops
(``matmul``, ``bias_add``, ``relu``, ``sparse_softmax_cross_entropy`` in float32), a
GradientTape, ``mp.optimizers.RMSprop`` wrapped in ``mp.LossScaleOptimizer`` for
mixed_float16 (``get_scaled_loss``, ``get_unscaled_gradients``, ``apply_gradients``). Input is
random MNIST-shaped data, as the peer's. Prints one JSON line per configuration, then a summary
line with the ratios the CUDA issue asks for (mixed_float16 vs float32, vs PyTorch AMP).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

import mpcore as mp

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
PEER_PATHS = (".device/torch_mlp.py", "../shared/peers/torch_mlp.py")


def flops_per_step(batch: int, units: int) -> int:
    return 6 * batch * (784 * units + units * units + units * 10)


class GuideLoop:
    """The guide's custom training loop over 784-units-units-10 Dense layers."""

    def __init__(self, backend: mp.Backend, policy: str, units: int, batch: int,
                 seed: int = 0, jit: bool = False) -> None:
        self.policy = mp.Policy(policy)
        self.compute = self.policy.compute_dtype
        rng = np.random.default_rng(seed)
        self.variables: list[mp.Variable] = []
        for i, (fan_in, fan_out) in enumerate(itertools.pairwise([784, units, units, 10])):
            limit = math.sqrt(6.0 / (fan_in + fan_out))  # Glorot uniform, as Keras' Dense
            kernel = rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)
            self.variables.append(mp.Variable(kernel, name=f"kernel_{i}", backend=backend))
            self.variables.append(mp.Variable(np.zeros(fan_out, np.float32), name=f"bias_{i}",
                                              backend=backend))
        optimizer = mp.optimizers.RMSprop()
        self.optimizer = (mp.LossScaleOptimizer(optimizer) if self.policy.loss_scale is not None
                          else optimizer)
        self.scaled = self.policy.loss_scale is not None
        # A layer casts its floating input to the compute dtype; the batch is reused, so once.
        x = mp.constant(rng.random((batch, 784), dtype=np.float32), backend=backend)
        self.x = mp.ops.cast(x, self.compute)
        self.y = mp.constant(rng.integers(0, 10, batch).astype(np.int32), backend=backend)
        self.loss: mp.Tensor | None = None
        self.applied = 0
        self.flags: list[Any] = []
        self.steps = 0
        # traced: the step's kernels replayed (on CUDA, runs of them as CUDA graphs)
        self.traced = mp.function(self.traced_step) if jit else None

    def forward(self) -> mp.Tensor:
        h = self.x
        layers = len(self.variables) // 2
        for i in range(layers):
            kernel, bias = self.variables[2 * i], self.variables[2 * i + 1]
            h = mp.ops.bias_add(mp.ops.matmul(h, kernel.read_as(self.compute)),
                                bias.read_as(self.compute))
            if i < layers - 1:
                h = mp.ops.relu(h)
        # the guide's float32 output: softmax (fused with the loss) in float32
        return mp.ops.mean(mp.ops.sparse_softmax_cross_entropy(self.y, mp.ops.cast(h, "float32")))

    def update(self) -> tuple[mp.Tensor, Any]:
        """Forward, backward and update: the loss and what ``apply_gradients`` returned (with
        loss scaling, a bool: the step's one device-to-host read, the loss-scale decision)."""
        with mp.GradientTape() as tape:
            loss = self.forward()
            target = self.optimizer.get_scaled_loss(loss) if self.scaled else loss
        grads = tape.gradient(target, self.variables)
        if self.scaled:
            grads = self.optimizer.get_unscaled_gradients(grads)
        return loss, self.optimizer.apply_gradients(zip(grads, self.variables))

    def traced_step(self) -> mp.Tensor:
        """The step for ``mp.function``: its Python side effects happen at the trace only,
        so it returns the loss and counts nothing."""
        return self.update()[0]

    def step(self) -> None:
        if self.traced is not None:
            self.loss = self.traced()
            self.steps += 1
            return
        loss, applied = self.update()
        if isinstance(applied, bool):
            self.applied += applied
        else:
            # a plain optimizer returns its device flag: reading it now would add a host sync
            # per step (the peer's loop makes none), so the flags are read after the timing
            self.flags.append(applied)
        self.steps += 1
        self.loss = loss

    def applied_steps(self) -> int | None:
        if self.traced is not None:
            return None              # the replays' flags stay on the device
        count = self.applied + sum(bool(flag) for flag in self.flags)
        self.applied, self.flags = count, []
        return count


def measure(backend: mp.Backend, policy: str, units: int, batch: int, steps: int,
            warmup: int, jit: bool = False) -> dict[str, Any]:
    record: dict[str, Any] = {"bench": "cuda_train_step", "backend": backend.name,
                              "policy": policy, "units": units, "batch": batch}
    if jit:
        record["jit"] = True
        record["cuda_graphs"] = os.environ.get("MPCORE_CUDA_GRAPHS", "") not in ("0", "off",
                                                                                 "false", "no")
    try:
        record["device"] = backend.device().name
        verdict = mp.check_policy(policy, backend)
        record["verdict"] = "fast" if verdict.fast else (
            "supported" if verdict.supported else "unsupported")
        if not verdict.supported:
            return {**record, "skipped": verdict.reason}
    except Exception as exc:
        return {**record, "skipped": f"{type(exc).__name__}: {exc}"}
    loop = GuideLoop(backend, policy, units, batch, jit=jit)
    for _ in range(warmup):
        loop.step()
    backend.synchronize()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loop.step()
        backend.synchronize()
        times.append(time.perf_counter() - t0)
    dt = statistics.median(times)
    loss = float(loop.loss) if loop.loss is not None else math.nan
    record.update({"ms_per_step": round(dt * 1e3, 3), "samples_per_s": round(batch / dt, 1),
                   "gflops": round(flops_per_step(batch, units) / dt / 1e9, 1),
                   "steps": steps, "applied_steps": loop.applied_steps(), "all_steps": loop.steps,
                   "loss": round(loss, 5) if math.isfinite(loss) else None})
    return record


def run_peer(path: str, device: str, policy: str, units: int, batch: int, steps: int,
             warmup: int) -> dict[str, Any]:
    cmd = [sys.executable, path, "--device", device, "--policy", policy, "--units", str(units),
           "--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
        return {"bench": "torch_peer", **json.loads(out.stdout.strip().splitlines()[-1])}
    except Exception as exc:
        stderr = getattr(exc, "stderr", "") or ""
        return {"bench": "torch_peer", "policy": policy,
                "skipped": f"{type(exc).__name__}: {exc} {stderr.strip()[-300:]}"}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", nargs="+", choices=POLICIES,
                    default=["float32", "mixed_float16"])
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--units", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peer", default=None, help="path of torch_mlp.py (default: "
                                                  + " or ".join(PEER_PATHS) + ")")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--jit", action="store_true",
                    help="trace the step with mp.function (the graph plans go to stderr)")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.jit:
        logging.basicConfig(stream=sys.stderr, format="%(name)s: %(message)s")
        logging.getLogger("mpcore_cuda.graphs").setLevel(logging.INFO)
    try:
        backend = mp.get_backend(a.backend)
        backend.kernels()
    except Exception as exc:
        print(json.dumps({"bench": "cuda_train_step", "backend": a.backend,
                          "skipped": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 0
    ours: dict[str, dict[str, Any]] = {}
    for policy in a.policy:
        ours[policy] = measure(backend, policy, a.units, a.batch, a.steps, a.warmup, a.jit)
        print(json.dumps(ours[policy]), flush=True)
    peer_path = a.peer or next((p for p in PEER_PATHS if os.path.exists(p)), None)
    peers: dict[str, dict[str, Any]] = {}
    if not a.no_peer and peer_path is not None:
        device = "cuda" if backend.name == "cuda" else "cpu"
        for policy in a.policy:
            peers[policy] = run_peer(peer_path, device, policy, a.units, a.batch, a.steps,
                                     a.warmup)
            print(json.dumps(peers[policy]), flush=True)

    def rate(r: dict[str, Any] | None) -> float | None:
        return r.get("samples_per_s") if r else None

    summary: dict[str, Any] = {"bench": "cuda_train_step_summary", "backend": backend.name,
                               "device": ours[a.policy[0]].get("device"),
                               "units": a.units, "batch": a.batch}
    base = rate(ours.get("float32"))
    for policy in a.policy:
        mine = rate(ours[policy])
        if mine and base and policy != "float32":
            summary[f"{policy}_vs_float32"] = round(mine / base, 2)
        theirs = rate(peers.get(policy))
        if mine and theirs:
            summary[f"{policy}_vs_torch"] = round(mine / theirs, 2)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
