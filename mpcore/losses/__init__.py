"""Losses (``mp.losses``, Keras' ``keras.losses``): the classes and functions of
:mod:`mpcore.losses.losses`."""

from __future__ import annotations

from mpcore.losses.losses import (
    EPSILON,
    REDUCTIONS,
    BinaryCrossentropy,
    CategoricalCrossentropy,
    Loss,
    LossFunctionWrapper,
    MeanSquaredError,
    SparseCategoricalCrossentropy,
    binary_crossentropy,
    categorical_crossentropy,
    get,
    mean_squared_error,
    sparse_categorical_crossentropy,
)

__all__ = ["EPSILON", "REDUCTIONS", "BinaryCrossentropy", "CategoricalCrossentropy", "Loss",
           "LossFunctionWrapper", "MeanSquaredError", "SparseCategoricalCrossentropy",
           "binary_crossentropy", "categorical_crossentropy", "get", "mean_squared_error",
           "sparse_categorical_crossentropy"]
