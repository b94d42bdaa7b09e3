"""The program the 2-rank tests launch (``mpiexec -n 2 python -m mpi4py ranks.py SCENARIO
OUT``), and the model and data they share with the single-process references.

Scenarios: ``train`` (fit under float32, traced float32, mixed_float16, float32 with
gradient accumulation and bfloat16; float32 again with the buckets through MPI's all-reduce
instead of shared memory; the engine's buckets of several dtypes both ways; the guide's custom
loop with an Inf in rank 1's shard; a checkpoint resumed; the NCCL unique-id bootstrap over
MPI), ``warn`` (every rank warns), ``shared_off`` (shared memory turned off on rank 1 only), and
the faults ``raise``, ``stall``, ``stall_buckets``
(during a shared-memory exchange), ``mismatch``, ``scale``, ``apart`` (different calls) and
``rewrite`` (on one rank). Each rank writes what it ended with to ``OUT/<name>.rank<r>.npz``.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

import mpcore as mp

SEED, N, FEATURES, CLASSES, BATCH, EPOCHS = 3, 64, 8, 4, 16, 2
# name, policy, traced steps, gradient accumulation steps
RUNS = (("fit_float32", "float32", False, None), ("fit_float32_jit", "float32", True, None),
        ("fit_mixed_float16", "mixed_float16", False, None),
        ("fit_float32_accumulate", "float32", False, 2))


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.normal(size=(N, FEATURES)).astype(np.float32),
            rng.integers(0, CLASSES, size=N).astype(np.int64))


def build(policy: str, units: int = 16, jit: bool = False, accumulate: int | None = None) -> Any:
    mp.random.set_seed(SEED)
    with mp.policy_scope(policy):
        inputs = mp.Input(shape=(FEATURES,))
        x = mp.layers.Dense(units, activation="relu")(inputs)
        x = mp.layers.Dense(CLASSES)(x)
        outputs = mp.layers.Activation("softmax", dtype="float32")(x)
        model = mp.Model(inputs=inputs, outputs=outputs)
    model.compile(loss="sparse_categorical_crossentropy", jit_compile=jit,
                  optimizer=mp.optimizers.RMSprop(learning_rate=0.01,
                                                  gradient_accumulation_steps=accumulate),
                  metrics=["accuracy"])
    return model


def fit(policy: str, jit: bool = False, accumulate: int | None = None
        ) -> tuple[Any, dict[str, Any]]:
    x, y = data()
    model = build(policy, jit=jit, accumulate=accumulate)
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0)
    return model, history.history


def custom_loop(shards: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    """The guide's loop under mixed_float16, one batch per step; returns what it saw."""
    model = build("mixed_float16")
    loss_object = mp.losses.SparseCategoricalCrossentropy()
    opt = mp.LossScaleOptimizer(mp.optimizers.SGD(0.1), mp.DynamicLossScale(1024.0))
    applied, scales, weights = [], [], []
    for xb, yb in shards:
        with mp.GradientTape() as tape:
            loss = loss_object(yb, model(xb))
            scaled_loss = opt.get_scaled_loss(loss)
        grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss,
                                                         model.trainable_variables))
        applied.append(bool(opt.apply_gradients(zip(grads, model.trainable_variables))))
        scales.append(opt.loss_scale())
        weights.append(model.get_weights())
    return {"applied": applied, "scales": scales, "weights": weights,
            "nonfinite": opt.last_nonfinite}


def buckets(rank: int) -> list[list[Any]]:
    """Buckets of two dtypes (float32 in two of them), rank-dependent values."""
    rng = np.random.default_rng(rank)
    return [[mp.constant(rng.normal(size=(5, 3)).astype(np.float32)),
             mp.constant(rng.normal(size=7).astype(np.float32))],
            [mp.constant(rng.normal(size=(2, 4)))],  # float64
            [mp.constant(rng.normal(size=9).astype(np.float32)),
             mp.constant(rng.normal(size=4).astype(np.float32))]]


def save(out: Path, name: str, arrays: list[np.ndarray], **info: Any) -> None:
    rank = mp.distribution.rank()
    np.savez(out / f"{name}.rank{rank}.npz", *arrays)
    (out / f"{name}.rank{rank}.json").write_text(json.dumps(info))


def train(out: Path) -> None:
    rank, size = mp.distribution.rank(), mp.distribution.world_size()
    for name, policy, jit, accumulate in RUNS:
        model, history = fit(policy, jit, accumulate)
        save(out, name, model.get_weights(), history=history,
             scale=getattr(model.optimizer, "loss_scale", lambda: 0.0)())
    # the same fit with every bucket through MPI's all-reduce, not shared memory
    engine = mp.distribution.distribution().engine
    engine.shared.enabled = False
    model, history = fit("float32")
    engine.shared.enabled = True
    save(out, "fit_float32_allreduce", model.get_weights(), history=history,
         on_one_node=engine.shared.on_one_node)
    # the engine's buckets of several dtypes, both ways
    sums = []
    for shared in (True, False):
        engine.shared.enabled = shared
        sums += [t.numpy() for bucket in engine.allreduce_buckets(buckets(rank), 0.5, "dtypes")
                 for t in bucket]
    engine.shared.enabled = True
    save(out, "buckets", sums)
    # dropout: each rank its own masks; initial weights: the same on every rank
    mask = mp.ops.dropout_mask((256,), 0.5).numpy()
    save(out, "streams", [mask, *build("float32").get_weights()])
    # replicas that differ before fit (rank 1's weights moved): evaluate takes rank 0's
    x, y = data()
    model = build("float32")
    if rank == 1:
        model.set_weights([w + 1.0 for w in model.get_weights()])
    score = model.evaluate(x, y, batch_size=BATCH, verbose=0)
    save(out, "evaluate", model.get_weights(), score=score)
    # a pure 16-bit policy: its gradients are averaged in float32 (MPI has no bfloat16 sum)
    model, history = fit("bfloat16")
    save(out, "fit_bfloat16", [w.astype(np.float32) for w in model.get_weights()],
         history=history)
    # the guide's loop: each rank its half of each batch; an Inf in rank 1's at step 2
    x, y = data()
    steps = []
    for step in range(3):
        lo = step * BATCH + rank * BATCH // size
        xb, yb = x[lo:lo + BATCH // size].copy(), y[lo:lo + BATCH // size]
        if step == 1 and rank == 1:
            xb[0, 0] = np.inf
        steps.append((xb, yb))
    seen = custom_loop(steps)
    save(out, "custom", [w for ws in seen["weights"] for w in ws], applied=seen["applied"],
         scales=seen["scales"], nonfinite=seen["nonfinite"])
    # a checkpoint: 1 epoch, save, 1 epoch; a fresh model restored from it, 1 epoch
    xs, ys = data()
    first = build("mixed_float16")
    first.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0)
    path = out / "resume.ckpt"
    first.save_checkpoint(str(path))
    first.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0)
    second = build("mixed_float16", units=16)
    second.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0)  # other weights and state
    second.load_checkpoint(str(path))
    second.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0)
    save(out, "resume", [*first.get_weights(), *second.get_weights()],
         files=sorted(p.name for p in out.glob("*.ckpt*")))
    # NCCL's bootstrap: rank 0's unique id reaches every rank over MPI
    from mpcore_nccl.bootstrap import share_unique_id

    engine = mp.distribution.distribution().engine
    uid = share_unique_id(rank, lambda: tuple(range(-64, 64)), engine.broadcast_values)
    save(out, "nccl_uid", [np.asarray(uid)])


def faults(scenario: str, out: Path) -> None:
    rank = mp.distribution.rank()
    if scenario == "raise":
        x, y = data()
        model = build("float32")
        if rank == 1:
            raise RuntimeError("rank 1 fails on purpose")
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    elif scenario == "stall":
        if rank == 1:
            time.sleep(120)  # stuck, not dead: only the deadline ends the job
        mp.distribution.distribution().engine.barrier("the stall test")
    elif scenario == "stall_buckets":  # rank 1 stuck between two exchanges
        engine = mp.distribution.distribution().engine
        engine.allreduce_buckets(buckets(rank), 0.5, "stall")
        if rank == 1:
            time.sleep(120)
        engine.allreduce_buckets(buckets(rank), 0.5, "stall")
    elif scenario == "shared_off":  # MPCORE_MPI_SHARED_MEMORY=0 on rank 1 only
        engine = mp.distribution.distribution().engine
        if rank == 1:
            engine.shared.enabled = False
        model, _ = fit("float32")
        save(out, "shared_off", model.get_weights(),
             enabled=engine.shared.enabled)
    elif scenario == "warn":  # every rank warns: rank 0 alone shows it
        warnings.warn("every rank warns", UserWarning, stacklevel=1)
        mp.distribution.distribution().engine.barrier("the warning test")
    elif scenario == "mismatch":
        x, y = data()
        model = build("float32", units=16 if rank == 0 else 12)
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    elif scenario == "scale":  # the same variables, another loss scale on rank 1
        x, y = data()
        model = build("mixed_float16")
        model.optimizer.loss_scale.load_state_dict(
            {"current_loss_scale": 2048.0 * (1 + rank), "num_good_steps": 0})
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    elif scenario == "apart":  # `if rank() == 0: model.evaluate(...)`, then fit on both
        x, y = data()
        model = build("float32")
        if rank == 0:
            model.evaluate(x, y, batch_size=BATCH, verbose=0)
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    elif scenario == "rewrite":  # the graph rewrite on rank 0 only
        x, y = data()
        model = build("float32", jit=True)
        if rank == 0:
            opt = mp.mixed_precision.enable_mixed_precision_graph_rewrite(
                mp.optimizers.RMSprop(learning_rate=0.01))
        else:
            opt = mp.mixed_precision.LossScaleOptimizer(mp.optimizers.RMSprop(0.01))
        model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, jit_compile=True)
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    else:
        raise ValueError(f"unknown scenario {scenario!r}; valid: train, warn, shared_off, raise, "
                         "stall, stall_buckets, mismatch, scale, apart, rewrite")


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    mp.set_backend("cpu")
    if scenario == "train":  # a communicator given (a copy of the world), the engine named
        from mpi4py import MPI

        dist = mp.distribution.DataParallel(communicator=MPI.COMM_WORLD.Dup(), engine="mpi")
    else:  # every rank of the world, the engine chosen for the backend
        dist = mp.distribution.DataParallel()
    mp.distribution.set_distribution(dist)
    if scenario == "train":
        train(out)
    else:
        faults(scenario, out)


if __name__ == "__main__":
    main()
