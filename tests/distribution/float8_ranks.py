"""The program of the 2-rank FP8 test (``mpiexec -n 2 python -m mpi4py float8_ranks.py OUT``):
``mixed_float8`` training with other data on each rank, under current and delayed scaling,
eagerly in the guide's loop and in traced ``fit`` steps. Each rank writes, per run, its weights,
its FP8 state after each step, and (in the loop) its own state before the ranks reconciled it,
to ``OUT/<run>.rank<r>.npz``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

import mpcore as mp
from mpcore.mixed_precision import CurrentScaling, DelayedScaling

SEED, FEATURES, UNITS, CLASSES, BATCH, STEPS = 4, 16, 32, 16, 32, 4
STATE = ("inputs", "kernel", "outputs_grad")
RECIPES = {"current": CurrentScaling(), "delayed": DelayedScaling(amax_history_len=3)}


def build(recipe: Any, jit: bool = False) -> Any:
    mp.random.set_seed(SEED)
    with mp.policy_scope(mp.Policy("mixed_float8", float8_recipe=recipe)):
        inputs = mp.Input(shape=(FEATURES,))
        x = mp.layers.Dense(UNITS, activation="relu", name="hidden")(inputs)
        x = mp.layers.Dense(CLASSES, name="logits")(x)
        outputs = mp.layers.Activation("softmax", dtype="float32")(x)
        model = mp.Model(inputs=inputs, outputs=outputs)
    model.compile(loss="sparse_categorical_crossentropy", jit_compile=jit,
                  optimizer=mp.optimizers.RMSprop(learning_rate=0.01))
    return model


def state(model: Any) -> list[np.ndarray]:
    """Every FP8 layer's scales and amax histories, in layer order."""
    out = []
    for name in ("hidden", "logits"):
        layer = model.get_layer(name)
        for prefix in STATE:
            out += [getattr(layer, f"{prefix}_scale").numpy().reshape(1),
                    getattr(layer, f"{prefix}_amax_history").numpy()]
    return out


def shard(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's own batch: other values and another magnitude on each rank, so the
    ranks' amaxes differ at every step."""
    rng = np.random.default_rng(100 * rank + step)
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32) * np.float32(1 + 3 * rank)
    return x, rng.integers(0, CLASSES, size=BATCH).astype(np.int64)


def loop(recipe: Any, rank: int) -> dict[str, np.ndarray]:
    model = build(recipe)
    loss_object = mp.losses.SparseCategoricalCrossentropy()
    opt = model.optimizer
    local, kept = [], []
    for step in range(STEPS):
        x, y = shard(rank, step)
        with mp.GradientTape() as tape:
            loss = loss_object(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        local += state(model)            # this rank's own amaxes rolled in
        opt.apply_gradients(zip(grads, model.trainable_variables))
        kept += state(model)             # after the ranks reconciled them
    return {"weights": np.concatenate([w.ravel() for w in model.get_weights()]),
            "local": np.concatenate(local), "kept": np.concatenate(kept)}


def fit(recipe: Any, rank: int) -> dict[str, np.ndarray]:
    model = build(recipe, jit=True)
    xs, ys = zip(*(shard(r, s) for s in range(STEPS) for r in range(2)))
    # global batches of 2 * BATCH: each rank's contiguous half is its own shard
    model.fit(np.concatenate(xs), np.concatenate(ys), batch_size=2 * BATCH, epochs=2,
              shuffle=False, verbose=0)
    return {"weights": np.concatenate([w.ravel() for w in model.get_weights()]),
            "kept": np.concatenate(state(model))}


def main() -> None:
    out = Path(sys.argv[1])
    mp.set_backend("cpu")
    mp.distribution.set_distribution(mp.distribution.DataParallel())
    rank = mp.distribution.rank()
    for name, recipe in RECIPES.items():
        np.savez(out / f"loop_{name}.rank{rank}.npz", **loop(recipe, rank))
        np.savez(out / f"fit_{name}.rank{rank}.npz", **fit(recipe, rank))


if __name__ == "__main__":
    main()
