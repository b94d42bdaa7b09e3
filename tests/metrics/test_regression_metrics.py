"""Keras 3's regression metrics: MeanSquaredError, MeanAbsoluteError, RootMeanSquaredError and
the compile strings "mse"/"mae" (history keys as written). Cases ported from Keras 3's
keras/src/metrics/regression_metrics_test.py (test_unweighted / test_weighted of each)."""

from __future__ import annotations

import numpy as np
import pytest

import mpcore as mp
from mpcore import layers

Y_TRUE = np.array([[0, 1, 0, 1, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 0], [0, 0, 0, 0, 1]],
                  np.float32)
Y_PRED = np.array([[0, 0, 1, 1, 0], [1, 1, 1, 1, 1], [0, 1, 0, 1, 0], [1, 1, 1, 1, 1]],
                  np.float32)
SAMPLE_WEIGHT = np.array([1.0, 1.5, 2.0, 2.5], np.float32)


@pytest.mark.parametrize("cls", [mp.metrics.MeanSquaredError, mp.metrics.MeanAbsoluteError])
def test_unweighted(cls: type) -> None:
    # MeanSquaredErrorTest/MeanAbsoluteErrorTest.test_unweighted: 0.5 (0/1 values: squares
    # and absolute values agree)
    metric = cls()
    metric.update_state(Y_TRUE, Y_PRED)
    assert metric.result() == pytest.approx(0.5, abs=1e-6)


@pytest.mark.parametrize("cls", [mp.metrics.MeanSquaredError, mp.metrics.MeanAbsoluteError])
def test_weighted(cls: type) -> None:
    # test_weighted of both: the per-sample means (0.4, 0.8, 0.4, 0.8) weighted -> 0.54286
    metric = cls()
    metric.update_state(Y_TRUE, Y_PRED, sample_weight=SAMPLE_WEIGHT)
    assert metric.result() == pytest.approx(0.54285, abs=1e-5)


def test_root_mean_squared_error() -> None:
    # RootMeanSquaredErrorTest.test_unweighted and test_weighted
    rmse = mp.metrics.RootMeanSquaredError()
    rmse.update_state(np.array([2, 4, 6], np.float32), np.array([1, 3, 2], np.float32))
    assert rmse.result() == pytest.approx(np.sqrt(6.0), rel=1e-6)
    rmse = mp.metrics.RootMeanSquaredError()
    rmse.update_state(np.array([2, 4, 6, 8], np.float32), np.array([1, 3, 2, 3], np.float32),
                      sample_weight=np.array([0, 1, 0, 1], np.float32))
    assert rmse.result() == pytest.approx(np.sqrt(13.0), rel=1e-6)
    rmse.reset_state()
    assert rmse.result() == 0.0


def test_names_and_configs() -> None:
    assert mp.metrics.MeanSquaredError().name == "mean_squared_error"
    assert mp.metrics.MeanAbsoluteError().name == "mean_absolute_error"
    assert mp.metrics.get("mae").name == "mae" and mp.metrics.get("mse").name == "mse"
    assert isinstance(mp.metrics.get("mean_absolute_error"), mp.metrics.MeanAbsoluteError)
    config = mp.metrics.RootMeanSquaredError(name="rmse").get_config()
    assert mp.metrics.RootMeanSquaredError.from_config(config).name == "rmse"


@pytest.mark.parametrize("jit_compile", [False, True])
def test_compile_strings_give_keras_history_keys(jit_compile: bool) -> None:
    mp.random.set_seed(3)
    inputs = mp.Input((5,))
    model = mp.Model(inputs, layers.Dense(5)(inputs))
    model.compile(optimizer="sgd", loss="mse", jit_compile=jit_compile,
                  metrics=["mae", "mse", mp.metrics.RootMeanSquaredError()])
    history = model.fit(Y_TRUE, Y_PRED, batch_size=2, epochs=2, verbose=0)
    assert {"loss", "mae", "mse", "root_mean_squared_error"} <= set(history.history)
    logs = model.evaluate(Y_TRUE, Y_PRED, batch_size=4, verbose=0, return_dict=True)
    pred = model.predict(Y_TRUE)
    err = pred - Y_PRED
    assert logs["mae"] == pytest.approx(np.abs(err).mean(), rel=1e-5)
    assert logs["mse"] == pytest.approx(logs["loss"], rel=1e-5)
    assert logs["root_mean_squared_error"] == pytest.approx(np.sqrt((err ** 2).mean()),
                                                            rel=1e-5)
