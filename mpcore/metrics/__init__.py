"""Metrics (``mp.metrics``, Keras' ``keras.metrics``): the classes and functions of
:mod:`mpcore.metrics.metrics`."""

from __future__ import annotations

from mpcore.metrics.metrics import (
    Accuracy,
    BinaryAccuracy,
    CategoricalAccuracy,
    Mean,
    MeanAbsoluteError,
    MeanMetricWrapper,
    MeanSquaredError,
    Metric,
    RootMeanSquaredError,
    SparseCategoricalAccuracy,
    accuracy,
    binary_accuracy,
    categorical_accuracy,
    get,
    matched_accuracy,
    mean_absolute_error,
    mean_squared_error,
    sparse_categorical_accuracy,
    updates_by_contribution,
)

__all__ = ["Accuracy", "BinaryAccuracy", "CategoricalAccuracy", "Mean", "MeanAbsoluteError",
           "MeanMetricWrapper", "MeanSquaredError", "Metric", "RootMeanSquaredError",
           "SparseCategoricalAccuracy", "accuracy", "binary_accuracy", "categorical_accuracy",
           "get", "matched_accuracy", "mean_absolute_error", "mean_squared_error",
           "sparse_categorical_accuracy", "updates_by_contribution"]
