"""Keras 3 <-> mpcore: ``.keras`` files written by Keras 3 (``data/``, made by
``make_keras_files.py`` with Keras' NumPy backend, which ran the convolutions and poolings
through jax) load in mpcore and predict Keras' numbers; files mpcore writes have Keras'
layout, and load in Keras 3 itself where it is importable (``saving_helpers.keras_python``).

Keras' NumPy backend has no gradients (no ``fit``): the Keras files' optimizers took two
steps of fixed gradients through ``optimizer.apply``, which is all the file records.
"""

from __future__ import annotations

import numpy as np
import pytest
from saving_helpers import (
    KERAS_FILES,
    KERAS_LOAD,
    as_array,
    config_of,
    example,
    run_keras,
    stored,
    weights_tree,
)
from test_saving_round_trip import nested_models

import mpcore as mp


def _tolerance(name: str) -> dict[str, float]:
    # mixed_state computes in float16 (Keras and mpcore round at different places)
    return {"rtol": 1e-2, "atol": 2e-3} if name == "mixed_state" else {"rtol": 1e-5,
                                                                       "atol": 1e-6}


@pytest.mark.parametrize("name", KERAS_FILES)
def test_keras_file_predicts_as_keras(name: str) -> None:
    path, x, y = example(name)
    model = mp.models.load_model(path)
    np.testing.assert_allclose(as_array(model.predict(x, verbose=0)), y, **_tolerance(name))


def test_multi_head_attention_weights_keep_keras_shapes() -> None:
    """EinsumDense kernels (dim, heads, key_dim) are mpcore's own shapes: read as stored."""
    path, _, _ = example("attention")
    model = mp.models.load_model(path)
    mha = model.get_layer("mha")
    for sub, group in (("_query_dense", "query_dense"), ("_key_dense", "key_dense"),
                       ("_value_dense", "value_dense"), ("_output_dense", "output_dense")):
        kernel, bias = stored(path, f"layers/multi_head_attention/{group}")
        np.testing.assert_array_equal(getattr(mha, sub).kernel.numpy(), kernel)
        np.testing.assert_array_equal(getattr(mha, sub).bias.numpy(), bias)


def test_batch_normalization_variable_order() -> None:
    path, _, _ = example("dense_block")
    bn = mp.models.load_model(path).get_layer("bn")
    gamma, beta, mean, variance = stored(path, "layers/batch_normalization")
    for var, value in ((bn.gamma, gamma), (bn.beta, beta), (bn.moving_mean, mean),
                       (bn.moving_variance, variance)):
        np.testing.assert_array_equal(var.numpy(), value)


@pytest.mark.parametrize(("name", "slots"), [("adam_state", ("m", "v")),
                                             ("sgd_state", ("momentum",)),
                                             ("rmsprop_state", ("velocity", "momentum"))])
def test_keras_optimizer_state_loads(name: str, slots: tuple[str, ...]) -> None:
    """optimizer/vars: iterations, learning rate, then the slots in Keras' order (Adam:
    momentum and velocity of each variable in turn; RMSprop: velocities, then momentums)."""
    path, _, _ = example(name)
    model = mp.models.load_model(path)
    opt = model.optimizer
    values = stored(path, "optimizer")
    assert opt.iterations == int(values[0]) == 2
    assert opt.learning_rate == pytest.approx(float(values[1]))
    variables = model.trainable_variables
    if name == "adam_state":
        expected = [(v, s) for v in variables for s in slots]
    else:
        expected = [(v, s) for s in slots for v in variables]
    assert len(values) == 2 + len(expected)
    for (var, slot), value in zip(expected, values[2:]):
        np.testing.assert_array_equal(opt.get_slot(var, slot).numpy(), value)


def test_keras_file_continues_training() -> None:
    path, x, _ = example("adam_state")
    model = mp.models.load_model(path)
    before = [w.copy() for w in model.get_weights()]
    model.fit(x, np.array([0, 1, 1]), epochs=1, batch_size=3, verbose=0)
    assert model.optimizer.iterations == 3
    assert all(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


def test_keras_mixed_file_in_a_float32_model_takes_the_inner_state() -> None:
    """Keras compiled the mixed_float16 model with a LossScaleOptimizer; the model's own
    policy is not in its config, so it loads (in Keras as here) as a float32 model compiled
    with Adam, which takes the inner optimizer's state."""
    path, _, _ = example("mixed_state")
    model = mp.models.load_model(path)
    assert type(model.optimizer).__name__ == "Adam"
    inner = stored(path, "optimizer/inner_optimizer")
    assert model.optimizer.iterations == int(inner[0]) == 2
    var = model.trainable_variables[0]
    np.testing.assert_array_equal(model.optimizer.get_slot(var, "m").numpy(), inner[2])
    assert model.get_layer("hidden").dtype_policy.name == "mixed_float16"


@pytest.mark.parametrize("name", KERAS_FILES)
def test_mpcore_writes_keras_layout(name: str, tmp_path) -> None:
    """Resaved by mpcore: the same h5 paths and shapes, and the same classes under the same
    Keras modules, as Keras wrote. (The mixed file's model loads compiled with Adam, see
    above: its optimizer is compared with a plain Adam's layout.)"""
    path, _, _ = example(name)
    out = tmp_path / f"{name}.keras"
    mp.models.load_model(path).save(out)
    ours, keras = weights_tree(out), weights_tree(path)
    if name == "mixed_state":
        keras = {k.replace("optimizer/inner_optimizer", "optimizer"): v for k, v in keras.items()
                 if not k.startswith("optimizer/vars")}
    assert {k: v[0] for k, v in ours.items()} == {k: v[0] for k, v in keras.items()}
    mine, theirs = config_of(out), config_of(path)
    assert (mine["module"], mine["class_name"]) == (theirs["module"], theirs["class_name"])
    assert ([(lyr["module"], lyr["class_name"]) for lyr in mine["config"]["layers"]]
            == [(lyr["module"], lyr["class_name"]) for lyr in theirs["config"]["layers"]])
    if theirs.get("compile_config"):
        assert (mine["compile_config"]["optimizer"]["class_name"]
                == theirs["compile_config"]["optimizer"]["class_name"])


def _native_models() -> dict[str, tuple[mp.Model, np.ndarray]]:
    """Models made in mpcore (its own configs: initializer names, defaults left out), one
    mixed_float16 with the LossScaleOptimizer compile adds, trained a little."""
    L = mp.layers  # noqa: N806 - the guide's short name
    rng = np.random.default_rng(0)
    mp.set_global_policy("mixed_float16")
    inp = mp.Input((6,), name="x")
    h = L.Dense(8, activation="relu", name="h")(inp)
    h = L.BatchNormalization(name="bn")(h)
    h = L.Dropout(0.2)(h)
    out = L.Activation("softmax", dtype="float32", name="probs")(L.Dense(3, name="logits")(h))
    mixed = mp.Model(inp, out)
    mixed.compile(optimizer=mp.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    x = rng.normal(size=(16, 6)).astype("float32")
    mixed.fit(x, rng.integers(0, 3, size=(16,)), epochs=1, batch_size=8, verbose=0)
    mp.set_global_policy("float32")
    seq = mp.Sequential([L.Conv2D(3, 3, input_shape=(6, 6, 2), activation="relu"),
                         L.AveragePooling2D(), L.Flatten(), L.Dense(2)])
    seq.compile(optimizer=mp.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    xs = rng.normal(size=(4, 6, 6, 2)).astype("float32")
    seq.fit(xs, rng.normal(size=(4, 2)).astype("float32"), epochs=1, batch_size=2, verbose=0)
    tokens = mp.Input((5,), dtype="int32")
    e = L.Embedding(12, 8)(tokens)
    a = L.MultiHeadAttention(2, 4)(e, e)
    pooled = L.GlobalMaxPooling1D()(L.LayerNormalization()(L.Add()([e, a])))
    attention = mp.Model(tokens, L.Dense(2)(pooled))
    nested, shared = nested_models()
    pair = [rng.normal(size=(2, 4)).astype("float32") for _ in range(2)]
    a, b = mp.Input((4,)), mp.Input((4,))
    reused = L.Dense(4, name="reused")
    twice = mp.Model([a, b], [reused(L.Dense(4)(a)), reused(b)])
    return {"mixed": (mixed, x[:4]), "sequential": (seq, xs[:2]),
            "attention": (attention, rng.integers(0, 12, size=(3, 5)).astype("int32")),
            "nested": (nested, pair), "nested_shared": (shared, pair), "reused": (twice, pair)}


def test_keras_loads_mpcore_files(tmp_path) -> None:
    """Keras 3 loads what mpcore saves: the same predictions, the optimizer and its state."""
    args, expected = [], {}
    models = {name: (mp.models.load_model(example(name)[0]), example(name)[1])
              for name in KERAS_FILES}
    models.update(_native_models())
    for name, (model, x) in models.items():
        path, x_path = tmp_path / f"{name}.keras", tmp_path / f"{name}.npz"
        model.save(path)
        np.savez(x_path, **{str(i): v for i, v in enumerate(x if isinstance(x, list) else [x])})
        args += [str(path), str(x_path)]
        opt = model.optimizer
        y = model.predict(x, verbose=0)
        y = ([np.asarray(v, "float64") for v in y] if isinstance(y, list)
             else np.asarray(y, "float64"))
        expected[str(path)] = (name, y, None if opt is None else opt.iterations)
    results = run_keras(KERAS_LOAD, *args)
    for path, (name, y, iterations) in expected.items():
        got = results[path]
        tolerance = {"rtol": 1e-2, "atol": 2e-3} if "mixed" in name else {"rtol": 1e-5,
                                                                          "atol": 1e-6}
        for got_y, want_y in zip(got["y"] if isinstance(y, list) else [got["y"]],
                                 y if isinstance(y, list) else [y]):
            np.testing.assert_allclose(np.asarray(got_y), want_y, **tolerance)
        assert got["iterations"] == iterations
    mixed = results[str(tmp_path / "mixed.keras")]
    assert mixed["optimizer"] == "LossScaleOptimizer"
    scale = models["mixed"][0].optimizer.loss_scale
    # Keras' LossScaleOptimizer variables: iterations, learning rate, step counter, scale
    assert mixed["variables"][2] == scale.num_good_steps
    assert mixed["variables"][3] == scale()
