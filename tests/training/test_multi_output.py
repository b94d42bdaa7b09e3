"""Models of several outputs (issue 33, item 4): ``loss``, ``loss_weights`` and ``metrics`` as
lists or dicts keyed by output name, ``y`` as a list or a dict, Keras 3's history keys, traced
as eagerly, and clear errors for structures that do not match the outputs."""

from __future__ import annotations

import numpy as np
import pytest

import mpcore as mp
from mpcore import layers

RNG = np.random.default_rng(8)
X = RNG.random((64, 5)).astype(np.float32)
Y_CLASS = (X[:, 0] > 0.5).astype(np.int32)
Y_VALUE = X.sum(1, keepdims=True).astype(np.float32)


def _two_headed() -> mp.Model:
    mp.random.set_seed(2)
    inp = mp.Input((5,), name="features")
    h = layers.Dense(8, activation="relu")(inp)
    cls = layers.Dense(2, name="cls")(h)
    reg = layers.Dense(1, name="reg")(h)
    return mp.Model(inp, [cls, reg])


SPARSE = mp.losses.SparseCategoricalCrossentropy(from_logits=True)


def test_loss_list_weights_and_history_keys() -> None:
    model = _two_headed()
    assert model.output_names == ["cls", "reg"]
    model.compile(optimizer=mp.optimizers.SGD(0.05), loss=[SPARSE, "mse"],
                  loss_weights=[1.0, 0.5], metrics=[["accuracy"], []])
    history = model.fit(X, [Y_CLASS, Y_VALUE], batch_size=16, epochs=2, verbose=0,
                        validation_split=0.25)
    keys = set(history.history) - {"time_per_sample"}
    assert keys == {"loss", "cls_loss", "reg_loss", "cls_accuracy", "val_loss",
                    "val_cls_loss", "val_reg_loss", "val_cls_accuracy"}
    h = history.history
    for i in range(2):   # the total is the weighted sum of the outputs' losses
        assert np.isclose(h["loss"][i], h["cls_loss"][i] + 0.5 * h["reg_loss"][i], rtol=1e-5)
    logs = model.evaluate(X, [Y_CLASS, Y_VALUE], verbose=0, return_dict=True)
    assert set(logs) == {"loss", "cls_loss", "reg_loss", "cls_accuracy"}
    preds = model.predict(X)
    assert [p.shape for p in preds] == [(64, 2), (64, 1)]


def test_dicts_by_output_name_traced_equal_eager() -> None:
    runs = []
    for jit in (False, True):
        model = _two_headed()
        model.compile(optimizer=mp.optimizers.Adam(0.01), loss={"cls": SPARSE, "reg": "mse"},
                      loss_weights={"reg": 2.0}, metrics={"cls": "accuracy"},
                      jit_compile=jit)
        history = model.fit(X, {"reg": Y_VALUE, "cls": Y_CLASS}, batch_size=16, epochs=2,
                            verbose=0, shuffle=False)
        runs.append(({k: v for k, v in history.history.items() if k != "time_per_sample"},
                     model.get_weights()))
    assert runs[0][0] == runs[1][0]
    for a, b in zip(runs[0][1], runs[1][1]):
        np.testing.assert_array_equal(a, b)
    assert set(runs[0][0]) == {"loss", "cls_loss", "reg_loss", "cls_accuracy"}


def test_one_loss_for_every_output_and_an_output_without_loss() -> None:
    model = _two_headed()
    model.compile(optimizer="sgd", loss="mse")
    logs = model.evaluate(X, [np.eye(2, dtype=np.float32)[Y_CLASS], Y_VALUE], verbose=0,
                          return_dict=True)
    assert set(logs) == {"loss", "cls_loss", "reg_loss"}
    assert np.isclose(logs["loss"], logs["cls_loss"] + logs["reg_loss"], rtol=1e-5)
    model.compile(optimizer="sgd", loss=[SPARSE, None])
    logs = model.evaluate(X, [Y_CLASS, Y_VALUE], verbose=0, return_dict=True)
    assert set(logs) == {"loss", "cls_loss"} and np.isclose(logs["loss"], logs["cls_loss"])


def test_structures_that_do_not_match_the_outputs_are_errors() -> None:
    model = _two_headed()
    with pytest.raises(ValueError, match="loss has 3 entries but the model has 2 outputs"):
        model.compile(loss=["mse", "mse", "mse"])
    with pytest.raises(ValueError, match=r"loss names outputs \['nope'\]; the model's outputs "
                                         r"are \['cls', 'reg'\]"):
        model.compile(loss={"nope": "mse"})
    with pytest.raises(ValueError, match="loss_weights must be a list or a dict"):
        model.compile(loss="mse", loss_weights=0.5)
    model.compile(optimizer="sgd", loss=[SPARSE, "mse"])
    with pytest.raises(ValueError, match=r"y lacks outputs \['reg'\]"):
        model.fit(X, {"cls": Y_CLASS}, epochs=1, verbose=0)
    with pytest.raises(ValueError, match="one array per output"):
        model.fit(X, Y_CLASS, epochs=1, verbose=0)


def test_one_metric_object_for_every_output_is_refused() -> None:
    model = _two_headed()
    with pytest.raises(ValueError, match="is one object for every output"):
        model.compile(loss=[SPARSE, "mse"], metrics=[mp.metrics.Mean()])
    model.compile(loss=[SPARSE, "mse"], metrics={"reg": [mp.metrics.Mean()]})
    assert model.metrics_names == ["loss", "cls_loss", "reg_loss", "reg_mean"]
