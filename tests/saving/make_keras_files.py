"""Writes the Keras 3 ``.keras`` files the interoperability tests load (``tests/saving/data``).

Run with a Python that has Keras 3 and a backend (Keras' NumPy backend imports jax, which is
too heavy for the project's test environment, so the files are made once and committed):

    KERAS_BACKEND=numpy python tests/saving/make_keras_files.py

Each model is saved as ``<name>.keras`` next to ``<name>.json``: the input batch and Keras'
own prediction for it, which mpcore must reproduce after loading the file.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "numpy")

import keras
import numpy as np

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
L = keras.layers


def dense_block() -> tuple[keras.Model, np.ndarray]:
    inp = keras.Input((8,), name="features")
    h = L.Dense(6, activation="relu", name="hidden")(inp)
    h = L.BatchNormalization(name="bn")(h)
    a = L.Dense(6, activation="tanh", name="branch")(h)
    h = L.Add(name="add")([h, a])
    h = L.LayerNormalization(name="ln")(h)
    h = L.Dropout(0.3, name="drop")(h)
    h = L.Dense(4, name="logits")(h)
    out = L.Activation("softmax", name="probs")(h)
    model = keras.Model(inp, out, name="dense_block")
    bn = model.get_layer("bn")   # statistics away from their initial values
    bn.moving_mean.assign(np.linspace(-0.5, 0.5, 6).astype("float32"))
    bn.moving_variance.assign(np.linspace(0.5, 2.0, 6).astype("float32"))
    bn.gamma.assign(np.linspace(0.8, 1.2, 6).astype("float32"))
    bn.beta.assign(np.linspace(-0.1, 0.1, 6).astype("float32"))
    return model, np.random.default_rng(0).normal(size=(5, 8)).astype("float32")


def conv_stack() -> tuple[keras.Model, np.ndarray]:
    model = keras.Sequential([
        keras.Input((8, 8, 3)),
        L.Conv2D(4, 3, padding="same", activation="relu", name="conv"),
        L.MaxPooling2D(name="max_pool"),
        L.Conv2D(5, (2, 2), strides=(1, 1), name="conv_b"),
        L.AveragePooling2D(pool_size=(2, 2), strides=1, name="avg_pool"),
        L.Flatten(name="flat"),
        L.Dense(3, name="dense"),
    ], name="conv_stack")
    return model, np.random.default_rng(1).normal(size=(2, 8, 8, 3)).astype("float32")


def global_pools() -> tuple[keras.Model, np.ndarray]:
    inp = keras.Input((6, 6, 2), name="image")
    c = L.Conv2D(3, 3, name="conv")(inp)
    g1 = L.GlobalAveragePooling2D(name="gap")(c)
    g2 = L.GlobalMaxPooling2D(name="gmp")(c)
    r = L.Reshape((16, 4), name="as_seq")(L.Conv2D(4, 1, name="pointwise")(c))
    g3 = L.GlobalAveragePooling1D(name="gap1")(r)
    g4 = L.GlobalMaxPooling1D(name="gmp1")(r)
    out = L.Concatenate(name="concat")([g1, g2, g3, g4])
    return (keras.Model(inp, out, name="global_pools"),
            np.random.default_rng(2).normal(size=(3, 6, 6, 2)).astype("float32"))


def attention() -> tuple[keras.Model, np.ndarray]:
    inp = keras.Input((5,), dtype="int32", name="tokens")
    e = L.Embedding(20, 8, name="embed")(inp)
    a = L.MultiHeadAttention(num_heads=2, key_dim=4, name="mha")(e, e)
    h = L.LayerNormalization(name="ln")(L.Add(name="residual")([e, a]))
    h = L.GlobalAveragePooling1D(name="pool")(h)
    out = L.Dense(3, name="head")(h)
    x = np.random.default_rng(3).integers(0, 20, size=(4, 5)).astype("int32")
    return keras.Model(inp, out, name="attention"), x


def shapes_and_merges() -> tuple[keras.Model, np.ndarray]:
    inp = keras.Input((12,), name="x")
    r = L.Reshape((3, 4), name="reshape")(inp)
    p = L.Permute((2, 1), name="permute")(r)
    s = L.Softmax(axis=-1, name="softmax")(p)
    f = L.Flatten(name="flatten")(s)
    d = L.Dense(12, name="dense")(f)
    merged = [L.Subtract(name="sub")([d, inp]), L.Multiply(name="mul")([d, inp]),
              L.Average(name="avg")([d, inp]), L.Maximum(name="max")([d, inp]),
              L.Minimum(name="min")([d, inp])]
    out = L.Concatenate(axis=-1, name="cat")(merged)
    return (keras.Model(inp, out, name="shapes_and_merges"),
            np.random.default_rng(4).normal(size=(2, 12)).astype("float32"))


def operators() -> tuple[keras.Model, list[np.ndarray]]:
    """Operators on symbolic tensors: Keras writes them as operations of keras.src.ops."""
    a, b = keras.Input((4, 3), name="a"), keras.Input((4, 3), name="b")
    y = -(2.0 - (a + b) * 0.5)
    y = (y[:, -1] / 3.0) ** 2.0
    out = L.Dense(2, name="dense")(y)
    rng = np.random.default_rng(6)
    return (keras.Model([a, b], out, name="operators"),
            [rng.normal(size=(2, 4, 3)).astype("float32") for _ in range(2)])


def nested() -> tuple[keras.Model, list[np.ndarray]]:
    """Functional models as layers: one called once, one shared by two inputs."""
    def sub(units: int, name: str) -> keras.Model:
        inputs = keras.Input((4,))
        return keras.Model(inputs, L.Dense(units, activation="relu")(inputs), name=name)

    a, b = keras.Input((4,), name="a"), keras.Input((4,), name="b")
    shared = sub(3, "shared")
    out = L.Concatenate(name="cat")([sub(2, "once")(a), shared(a), shared(b)])
    rng = np.random.default_rng(7)
    return (keras.Model([a, b], [out, shared(b)], name="nested"),
            [rng.normal(size=(2, 4)).astype("float32") for _ in range(2)])


def trained(optimizer: keras.optimizers.Optimizer, name: str, policy: str = "float32"
            ) -> tuple[keras.Model, np.ndarray]:
    """A compiled model whose optimizer has taken two steps (Keras' NumPy backend has no
    gradients: the steps apply fixed gradients, which is all the file records)."""
    keras.config.set_dtype_policy(policy)
    try:
        inp = keras.Input((4,), name="x")
        h = L.Dense(5, activation="relu", name="hidden")(inp)
        out = L.Dense(2, name="out", dtype="float32")(h)
        model = keras.Model(inp, out, name=name)
        model.compile(optimizer=optimizer,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["sparse_categorical_accuracy"])
        variables = model.trainable_variables
        opt = model.optimizer
        opt.build(variables)
        for step in range(2):
            grads = [np.full(v.shape, 0.1 * (step + 1), "float32")
                     + np.arange(np.prod(v.shape), dtype="float32").reshape(v.shape) * 0.01
                     for v in variables]
            opt.apply(grads, variables)
    finally:
        keras.config.set_dtype_policy("float32")
    return model, np.random.default_rng(5).normal(size=(3, 4)).astype("float32")


MODELS = {
    "dense_block": dense_block, "conv_stack": conv_stack, "global_pools": global_pools,
    "attention": attention, "shapes_and_merges": shapes_and_merges, "operators": operators,
    "nested": nested,
    "adam_state": lambda: trained(keras.optimizers.Adam(0.01), "adam_state"),
    "sgd_state": lambda: trained(keras.optimizers.SGD(0.05, momentum=0.9), "sgd_state"),
    "rmsprop_state": lambda: trained(keras.optimizers.RMSprop(0.01, momentum=0.5),
                                     "rmsprop_state"),
    "mixed_state": lambda: trained(keras.optimizers.Adam(0.01), "mixed_state",
                                   "mixed_float16"),
}


def main() -> None:
    keras.utils.set_random_seed(0)
    names = sys.argv[1:] or list(MODELS)
    for name in names:
        model, x = MODELS[name]()
        y = model.predict(x, verbose=0)
        y = np.stack(y) if isinstance(y, list) and y[0].shape == y[-1].shape else (
            np.concatenate(y, axis=-1) if isinstance(y, list) else np.asarray(y))
        model.save(os.path.join(HERE, f"{name}.keras"))
        inputs = x if isinstance(x, list) else [x]
        with open(os.path.join(HERE, f"{name}.json"), "w") as f:
            json.dump({"keras_version": keras.__version__,
                       "x": [v.tolist() for v in inputs] if isinstance(x, list) else x.tolist(),
                       "several": isinstance(x, list), "x_dtype": str(inputs[0].dtype),
                       "y": y.astype("float64").tolist()}, f)
        print("wrote", name)


if __name__ == "__main__":
    main()
