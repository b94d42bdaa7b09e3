"""Issue 35: checkpoints resume exactly under ``mixed_float8``. N training steps equal k steps,
a save (``save_checkpoint`` or a ``.keras`` file), a fresh model restored from it, and N-k
steps, bit for bit: weights, optimizer state and the FP8 scales and amax histories (delayed
scaling's history decides the next scales, so a lost or reordered entry would show)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mpcore as mp
from mpcore.mixed_precision import CurrentScaling, DelayedScaling

RNG = np.random.default_rng(35)
X = RNG.standard_normal((96, 16)).astype(np.float32)
Y = RNG.integers(0, 4, 96)
RECIPES = {"current": CurrentScaling(), "delayed": DelayedScaling(amax_history_len=4),
           "delayed_recent": DelayedScaling(amax_history_len=3,
                                            amax_compute_algo="most_recent", margin=1)}


def make_model(seed: int, recipe: Any, jit: bool = False) -> mp.Model:
    mp.random.set_seed(seed)
    with mp.policy_scope(mp.Policy("mixed_float8", float8_recipe=recipe)):
        inputs = mp.Input((16,))
        x = mp.layers.Dense(32, activation="relu", name="hidden")(inputs)
        x = mp.layers.Dropout(0.2)(x)
        x = mp.layers.Dense(16, name="top")(x)
        outputs = mp.layers.Activation("softmax", dtype="float32")(x)
        model = mp.Model(inputs, outputs)
    model.compile(loss="sparse_categorical_crossentropy", optimizer=mp.optimizers.Adam(0.01),
                  jit_compile=jit)
    return model


def _batches(n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(X[(8 * i) % 96:(8 * i) % 96 + 8], Y[(8 * i) % 96:(8 * i) % 96 + 8])
            for i in range(n)]


def _fp8_state(model: mp.Model) -> list[np.ndarray]:
    return [getattr(model.get_layer(name), f"{prefix}_{kind}").numpy()
            for name in ("hidden", "top") for prefix in ("inputs", "kernel", "outputs_grad")
            for kind in ("scale", "amax_history")]


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.atleast_1d(x).view(np.uint8),
                                      np.atleast_1d(y).view(np.uint8))


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("how", ["checkpoint", "keras", "checkpoint_traced"])
def test_resumed_training_equals_uninterrupted(tmp_path: Path, recipe: str, how: str) -> None:
    n, k = 10, 4
    jit = how.endswith("traced")
    batches = _batches(n)
    full = make_model(0, RECIPES[recipe], jit)
    for xb, yb in batches:
        full.train_on_batch(xb, yb)

    part = make_model(0, RECIPES[recipe], jit)
    for xb, yb in batches[:k]:
        part.train_on_batch(xb, yb)
    state_at_k = _fp8_state(part)
    if how == "keras":
        path = tmp_path / "run.keras"
        part.save(str(path))
        # a .keras file holds the model and optimizer, not the process's random stream
        # (neither does Keras'): the dropout masks resume with mp.random's state kept aside
        stream = mp.random.get_state()
        mp.random.set_seed(999)   # whatever happens in between must not matter
        resumed = mp.models.load_model(path)
        mp.random.set_state(stream)
        assert resumed.get_layer("hidden").dtype_policy == part.get_layer("hidden").dtype_policy
    else:
        path = tmp_path / "run.mpck"
        part.save_checkpoint(str(path))
        mp.random.set_seed(999)
        resumed = make_model(123, RECIPES[recipe], jit)   # other weights, fresh state
        resumed.load_checkpoint(str(path))
    _same(_fp8_state(resumed), state_at_k)
    if recipe != "current":   # the history holds k real amaxes (older entries still zero)
        history = _fp8_state(resumed)[1]
        assert np.count_nonzero(history) == min(k, history.size)
    for xb, yb in batches[k:]:
        resumed.train_on_batch(xb, yb)
    _same(resumed.get_weights(), full.get_weights())
    _same(_fp8_state(resumed), _fp8_state(full))
    _same([np.asarray(v.numpy()) for v in resumed.optimizer.variables()],
          [np.asarray(v.numpy()) for v in full.optimizer.variables()])
