"""fit, evaluate and predict on ``mp.utils.PyDataset`` subclasses, as a Keras 3 user writes
them: the same training as the arrays, on_epoch_end each epoch, workers threads in order,
Keras 3's shuffled batch order, steps_per_epoch, class_weight, and clear errors."""

from __future__ import annotations

import math
import random
import threading
import time
from typing import Any

import numpy as np
import pytest
from conftest import small_classifier

import mpcore as mp
from mpcore import layers

RNG = np.random.default_rng(22)
X = RNG.random((80, 8), dtype=np.float32)
Y = RNG.integers(0, 3, 80).astype(np.int32)


def _model(seed: int = 5, jit_compile: bool | str = "auto") -> mp.Model:
    return small_classifier(seed, jit_compile)


class Batches(mp.utils.PyDataset):
    """Keras' example: ``x``/``y`` in batches of ``batch_size``; records what was asked."""

    def __init__(self, x: Any, y: Any, batch_size: int = 16, delay: float = 0.0,
                 sample_weight: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.x, self.y, self.batch_size, self.delay = x, y, batch_size, delay
        self.sample_weight = sample_weight
        self.asked: list[int] = []
        self.threads: set[int] = set()
        self.epochs_ended = self.epochs_begun = 0

    def __len__(self) -> int:
        return math.ceil(len(self.x) / self.batch_size)

    def __getitem__(self, index: int) -> Any:
        self.asked.append(index)
        self.threads.add(threading.get_ident())
        time.sleep(self.delay)
        lo, hi = index * self.batch_size, (index + 1) * self.batch_size
        if self.y is None:
            return self.x[lo:hi]
        if self.sample_weight is not None:
            return self.x[lo:hi], self.y[lo:hi], self.sample_weight[lo:hi]
        return self.x[lo:hi], self.y[lo:hi]

    def on_epoch_begin(self) -> None:
        self.epochs_begun += 1

    def on_epoch_end(self) -> None:
        self.epochs_ended += 1


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_py_dataset_fit_equals_array_fit(workers: int) -> None:
    arrays, model = _model(), _model()
    dataset = Batches(X, Y, workers=workers)
    a = arrays.fit(X, Y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    p = model.fit(dataset, epochs=3, shuffle=False, verbose=0)
    for wa, wp in zip(arrays.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(wa, wp)
    assert a.history["loss"] == p.history["loss"]
    assert dataset.epochs_begun == dataset.epochs_ended == 3   # once around each epoch
    assert dataset.asked == list(range(5)) * 3
    if workers:
        assert threading.get_ident() not in dataset.threads   # loaded on worker threads


def test_on_epoch_end_changes_the_data_between_epochs() -> None:
    class Growing(Batches):
        def on_epoch_end(self) -> None:
            super().on_epoch_end()
            self.x = self.x * 0.0     # the next epoch sees the new data

    dataset = Growing(X, Y)
    model = _model()
    model.fit(dataset, epochs=2, shuffle=False, verbose=0)
    assert dataset.epochs_ended == 2
    np.testing.assert_array_equal(model.predict(dataset), model.predict(np.zeros_like(X)))


def test_shuffle_reorders_the_batches_as_keras_3() -> None:
    dataset = Batches(X, Y)
    _model().fit(dataset, epochs=2, shuffle=True, verbose=0)
    orders = [dataset.asked[:5], dataset.asked[5:]]
    for epoch, order in enumerate(orders):
        expected = list(range(5))
        random.Random(epoch).shuffle(expected)    # Keras 3's PyDatasetAdapter order
        assert order == expected
    assert orders[0] != list(range(5))


def test_steps_per_epoch_goes_on_across_epochs_then_starts_a_new_pass() -> None:
    dataset = Batches(X, Y, workers=0)   # 5 batches, loaded when asked (no read-ahead)
    with pytest.warns(UserWarning, match="ran out of data after 2 of the 3 steps"):
        history = _model().fit(dataset, epochs=3, steps_per_epoch=3, shuffle=False,
                               verbose=0)
    # Keras 3's: 0-2, then 3-4 (cut short: the pass ended), then a new pass 0-2
    assert dataset.asked == [0, 1, 2, 3, 4, 0, 1, 2]
    assert history.epoch == [0, 1, 2]


@pytest.mark.parametrize("case", ["match_one_epoch", "match_multi_epoch", "not_match_too_low",
                                  "not_match_but_high_enough"])
def test_steps_per_epoch_keras(case: str) -> None:
    # ported from keras/src/trainers/trainer_test.py::test_steps_per_epoch (on arrays)
    batch_size, epochs, num_batches = 8, 4, 10
    data_size = num_batches * batch_size
    steps_per_epoch = {"match_one_epoch": num_batches,
                       "match_multi_epoch": num_batches // (epochs // 2),
                       "not_match_too_low": num_batches - 1,
                       "not_match_but_high_enough": num_batches + 1}[case]
    x, y = np.ones((data_size, 4), np.float32), np.ones((data_size, 1), np.float32)

    class StepObserver(mp.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.begin_count = self.end_count = self.epoch_begin_count = 0
            self.epoch_end_count = 0

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.begin_count += 1

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.end_count += 1

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch_begin_count += 1

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.epoch_end_count += 1

    def example_model() -> mp.Model:
        mp.random.set_seed(1)
        inputs = mp.Input((4,))
        model = mp.Model(inputs, layers.Dense(1)(inputs))
        model.compile(loss="mse", optimizer="sgd")
        return model

    model, observer = example_model(), StepObserver()
    with pytest.warns() if case == "not_match_too_low" or case.endswith("high_enough") \
            else _no_warning():
        model.fit(x, y, batch_size=batch_size, epochs=epochs, steps_per_epoch=steps_per_epoch,
                  callbacks=[observer], verbose=0)
    if case != "not_match_too_low":
        count = epochs * min(steps_per_epoch, num_batches)
    else:
        cycles = [num_batches // steps_per_epoch * steps_per_epoch,
                  num_batches % steps_per_epoch] * epochs
        count = sum(cycles[:epochs])
    assert observer.begin_count == observer.end_count == count
    assert observer.epoch_begin_count == observer.epoch_end_count == epochs
    if case != "not_match_too_low":
        model_2 = example_model()
        model_2_epochs = (epochs // (num_batches // steps_per_epoch)
                          if case == "match_multi_epoch" else epochs)
        model_2.fit(x, y, batch_size=batch_size, epochs=model_2_epochs, verbose=0)
        for a, b in zip(model.get_weights(), model_2.get_weights(), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6)


class _no_warning:  # noqa: N801 - used as a context manager beside pytest.warns
    def __enter__(self) -> None:
        import warnings
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("error", UserWarning)

    def __exit__(self, *exc: Any) -> None:
        self._catch.__exit__(*exc)


def test_class_weight_keras() -> None:
    # ported from keras/src/trainers/data_adapters/py_dataset_adapter_test.py::
    # test_class_weight, through fit: the weights equal the matching sample weights'
    class_w = {0: 2.0, 1: 1.0, 2: 3.0}
    weights = np.array([class_w[int(c)] for c in Y], np.float32)
    by_class, by_sample = _model(), _model()
    by_class.fit(Batches(X, Y), class_weight=class_w, shuffle=False, verbose=0)
    by_sample.fit(Batches(X, Y, sample_weight=weights), shuffle=False, verbose=0)
    for a, b in zip(by_class.get_weights(), by_sample.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="class_weight"):
        _model().fit(Batches(X, Y, sample_weight=weights), class_weight=class_w, verbose=0)


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_exception_reported_keras(workers: int) -> None:
    # ported from keras/src/trainers/data_adapters/py_dataset_adapter_test.py::
    # test_exception_reported
    class ExceptionPyDataset(mp.utils.PyDataset):
        @property
        def num_batches(self) -> int:
            return 4

        def __getitem__(self, index: int) -> Any:
            if index < 2:
                return X[:8], Y[:8]
            raise ValueError("Expected exception")

    with pytest.raises(ValueError, match="Expected exception"):
        _model().fit(ExceptionPyDataset(workers=workers, max_queue_size=2), shuffle=False,
                     verbose=0)


def test_workers_load_ahead_in_parallel_and_in_order() -> None:
    """Two workers: both threads load (a batch waits for the other's start: events, not
    timings), and the batches arrive in index order."""
    started = [threading.Event() for _ in range(5)]

    class Paired(Batches):
        def __getitem__(self, index: int) -> Any:
            started[index].set()
            if index % 2 == 0 and index + 1 < 5:   # needs its neighbour to run at once
                assert started[index + 1].wait(10.0), "the second worker never started"
            return super().__getitem__(index)

    dataset = Paired(X, Y, workers=2)
    model, reference = _model(), _model()
    model.fit(dataset, shuffle=False, verbose=0)
    reference.fit(X, Y, batch_size=16, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(dataset.threads) == 2


def test_evaluate_and_predict_on_a_py_dataset() -> None:
    model = _model()
    dataset = Batches(X, Y, workers=2)
    assert model.evaluate(dataset, verbose=0) == pytest.approx(
        model.evaluate(X, Y, batch_size=16, verbose=0), rel=1e-6)
    np.testing.assert_array_equal(model.predict(Batches(X, None)),
                                  model.predict(X, batch_size=16))
    assert model.predict(Batches(X, None), steps=2).shape == (32, 3)
    assert dataset.epochs_ended == 1


def test_py_dataset_as_validation_data() -> None:
    model = _model()
    val = Batches(X[:32], Y[:32])
    history = model.fit(X, Y, validation_data=val, epochs=2, verbose=0)
    assert len(history.history["val_loss"]) == 2 and val.epochs_ended == 2
    assert history.history["val_loss"][-1] == pytest.approx(
        model.evaluate(X[:32], Y[:32], batch_size=16, verbose=0)[0], rel=1e-6)


def test_an_endless_py_dataset_needs_steps_per_epoch() -> None:
    class Endless(mp.utils.PyDataset):
        @property
        def num_batches(self) -> None:
            return None

        def __getitem__(self, index: int) -> Any:
            lo = index % 5 * 16
            return X[lo:lo + 16], Y[lo:lo + 16]

    with pytest.raises(ValueError, match=r"endless.*steps_per_epoch"):
        _model().fit(Endless(), verbose=0)
    history = _model().fit(Endless(), steps_per_epoch=7, epochs=2, verbose=0)
    assert history.epoch == [0, 1]


def test_bad_py_datasets_are_one_clear_error() -> None:
    model = _model()
    with pytest.raises(ValueError, match=r"use_multiprocessing=True.*not supported"):
        model.fit(Batches(X, Y, use_multiprocessing=True), verbose=0)
    with pytest.raises(ValueError, match=r"workers=...\) must be an integer >= 0"):
        model.fit(Batches(X, Y, workers=-1), verbose=0)
    with pytest.raises(ValueError, match="`y` should not be passed"):
        model.fit(Batches(X, Y), Y, verbose=0)
    with pytest.raises(ValueError, match="validation_split"):
        model.fit(Batches(X, Y), validation_split=0.5, verbose=0)
    with pytest.raises(ValueError, match="has no batches"):
        model.fit(Batches(X[:0], Y[:0]), verbose=0)

    class Wrong(Batches):
        def __getitem__(self, index: int) -> Any:
            return X[:16], Y[:16], np.ones(16), np.ones(16)

    with pytest.raises(ValueError, match="tuple of 4 elements"):
        model.fit(Wrong(X, Y), verbose=0)


def test_super_init_not_called_warns_as_keras() -> None:
    class NoSuper(mp.utils.PyDataset):
        def __init__(self) -> None:
            pass

        def __len__(self) -> int:
            return 5

        def __getitem__(self, index: int) -> Any:
            return X[index * 16:(index + 1) * 16], Y[index * 16:(index + 1) * 16]

    with pytest.warns(UserWarning, match=r"should call `super\(\).__init__"):
        _model().fit(NoSuper(), verbose=0)


def test_mp_utils_names() -> None:
    assert mp.utils.Sequence is mp.utils.PyDataset
    assert mp.utils.unpack_x_y_sample_weight((X, Y)) == (X, Y, None)
    assert mp.utils.pack_x_y_sample_weight(X, Y)[1] is Y
    dataset = Batches(X, Y)
    assert dataset.num_batches == 5 and len(list(dataset)) == 5
    assert (dataset.workers, dataset.use_multiprocessing, dataset.max_queue_size) == (1, False,
                                                                                      10)


def test_a_py_dataset_may_change_its_length_between_epochs() -> None:
    class Shrinking(Batches):
        def on_epoch_end(self) -> None:
            super().on_epoch_end()
            self.x, self.y = self.x[:48], self.y[:48]    # 3 batches from the next epoch on

    dataset = Shrinking(X, Y, workers=0)
    history = _model().fit(dataset, epochs=2, shuffle=False, verbose=0)
    assert dataset.asked == [0, 1, 2, 3, 4, 0, 1, 2] and history.epoch == [0, 1]
