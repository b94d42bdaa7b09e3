"""fit, evaluate and predict on Python generators, as a Keras 3 user writes them: the same
training as the arrays, batches prefetched ahead of the step, steps_per_epoch across epochs,
Keras 3's "ran out of data" warning, and one clear error for each bad input."""

from __future__ import annotations

import threading
import traceback
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from conftest import small_classifier

import mpcore as mp
from mpcore import layers

# Keras 3 warns that fit's default shuffle=True does not reorder a generator (tested below)
pytestmark = pytest.mark.filterwarnings("ignore:`shuffle=True` was passed")

RNG = np.random.default_rng(21)
X = RNG.random((96, 8), dtype=np.float32)
Y = RNG.integers(0, 3, 96).astype(np.int32)


def _model(seed: int = 5, jit_compile: bool | str = "auto") -> mp.Model:
    return small_classifier(seed, jit_compile)


def _batches(x: np.ndarray = X, y: np.ndarray | None = Y, size: int = 16,
             repeat: int = 1) -> Iterator[Any]:
    for _ in range(repeat):
        for lo in range(0, len(x), size):
            yield (x[lo:lo + size],) if y is None else (x[lo:lo + size], y[lo:lo + size])


class Counter(mp.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []
        self.epochs = 0
        self.steps_param: Any = "unset"

    def on_train_begin(self, logs: Any = None) -> None:
        self.steps_param = self.params["steps"]

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.batches.append(batch)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.epochs += 1


@pytest.mark.parametrize("jit_compile", [True, False])
def test_generator_fit_equals_array_fit(jit_compile: bool) -> None:
    arrays, gen = _model(jit_compile=jit_compile), _model(jit_compile=jit_compile)
    a = arrays.fit(X, Y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    g = gen.fit(_batches(), epochs=1, shuffle=False, verbose=0)
    for wa, wg in zip(arrays.get_weights(), gen.get_weights(), strict=True):
        np.testing.assert_array_equal(wa, wg)
    assert a.history["loss"] == g.history["loss"]
    assert a.history["accuracy"] == g.history["accuracy"]


def test_a_generator_is_one_stream_across_epochs_with_steps_per_epoch() -> None:
    # 12 batches, 3 epochs of 4: the epochs take batches 0-3, 4-7, 8-11 (as Keras 3)
    model, reference = _model(), _model()
    counter = Counter()
    model.fit(_batches(repeat=2), epochs=3, steps_per_epoch=4, callbacks=[counter], verbose=0)
    assert counter.batches == [0, 1, 2, 3] * 3 and counter.steps_param == 4
    reference.fit(_batches(repeat=2), epochs=1, verbose=0)  # the same 12 batches, one epoch
    for a, b in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_unknown_length_is_learned_in_the_first_epoch_then_the_data_runs_out() -> None:
    model, counter = _model(), Counter()
    with pytest.warns(UserWarning, match="Your input ran out of data; interrupting training"):
        history = model.fit(_batches(), epochs=3, callbacks=[counter], verbose=0)
    assert counter.steps_param is None        # unknown until the generator ends
    assert counter.batches == list(range(6)) and counter.epochs == 1
    assert history.epoch == [0] and len(history.history["loss"]) == 1


def test_steps_per_epoch_beyond_the_generator_is_one_clear_error() -> None:
    # issue 33's bad input (Keras 3 warns "Your input ran out of data" and stops instead)
    model, counter = _model(), Counter()
    with pytest.raises(ValueError, match=r"fit: the generator ran out of data after 6 "
                                         r"batch\(es\), at step 2 of an epoch of steps=4"):
        model.fit(_batches(), epochs=4, steps_per_epoch=4, callbacks=[counter], verbose=0)
    # 6 batches: 4 in the first epoch, 2 in the second, then the error
    assert counter.batches == [0, 1, 2, 3, 0, 1]


def test_evaluate_and_predict_on_generators_equal_the_arrays() -> None:
    model = _model()
    model.fit(X, Y, batch_size=32, epochs=1, verbose=0)
    on_arrays = model.evaluate(X, Y, batch_size=16, verbose=0, return_dict=True)
    on_gen = model.evaluate(_batches(), verbose=0, return_dict=True)
    assert on_gen == pytest.approx(on_arrays, rel=1e-6)
    np.testing.assert_array_equal(model.predict(_batches(y=None)),
                                  model.predict(X, batch_size=16))
    # predict takes x from (x, y) batches too, and steps limits the batches
    assert model.predict(_batches(), steps=2).shape == (32, 3)


def test_predict_generator_keras() -> None:
    # ported from keras/src/trainers/trainer_test.py::test_predict_generator
    def generate_batches() -> Iterator[Any]:
        for lo in range(0, 10, 2):
            yield (np.arange(lo, lo + 2, dtype=np.float32)[:, None],)

    inputs = mp.Input((1,))
    model = mp.Model(inputs, layers.Activation("linear")(inputs))  # Keras: Identity
    model.compile(loss="mse", optimizer="sgd")
    preds = model.predict(generate_batches(), verbose=0)
    np.testing.assert_array_equal(preds[:, 0], np.arange(10, dtype=np.float32))


def test_validation_data_infinite_generator_keras() -> None:
    # ported from keras/src/trainers/trainer_test.py::test_validation_data_infinite_generator
    # (validation batches counted in the generator: mp's callbacks have no on_test_batch_end)
    served = {"train": 0, "val": 0}

    def infinite_gen(kind: str) -> Iterator[Any]:
        while True:
            served[kind] += 1
            yield np.ones((2, 8), np.float32), np.ones((2,), np.int32)

    model, counter = _model(), Counter()
    history = model.fit(infinite_gen("train"), validation_data=infinite_gen("val"),
                        steps_per_epoch=3, validation_steps=4, epochs=1, shuffle=False,
                        callbacks=[counter], verbose=0)
    assert len(counter.batches) == 3 and "val_loss" in history.history
    # the prefetcher reads ahead, at most a queue's worth
    assert served["train"] >= 3 and served["val"] >= 4


def test_a_validation_generator_that_cannot_restart_needs_validation_steps() -> None:
    model = _model()
    with pytest.raises(ValueError, match="validation_steps"):
        model.fit(_batches(repeat=3), validation_data=_batches(), epochs=2, steps_per_epoch=3,
                  verbose=0)
    history = model.fit(_batches(repeat=3), validation_data=_batches(), epochs=2,
                        steps_per_epoch=3, validation_steps=3, verbose=0)
    assert len(history.history["val_loss"]) == 2


@pytest.mark.parametrize("prefetch", ["1", "0"])
def test_the_prefetcher_makes_the_next_batch_while_the_step_runs(
        prefetch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Observed with events: the generator is asked for batch 1 while step 0 is still in
    on_train_batch_begin (before its train step). Without prefetching it cannot be."""
    monkeypatch.setenv("MPCORE_PREFETCH", prefetch)
    made: list[threading.Event] = [threading.Event() for _ in range(6)]

    def gen() -> Iterator[Any]:
        for i, batch in enumerate(_batches()):
            made[i].set()
            yield batch

    class Watch(mp.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.ahead: list[bool] = []

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if batch + 1 < len(made):
                # prefetching: batch + 1 comes (a deadline, not a timing: the worker is free
                # to make it now); serial: it cannot come until this step returns
                self.ahead.append(made[batch + 1].wait(5.0 if prefetch == "1" else 0.05))

    watch = Watch()
    _model().fit(gen(), epochs=1, callbacks=[watch], verbose=0)
    assert watch.ahead == [prefetch == "1"] * 5


def test_an_error_in_the_generator_reaches_the_caller_with_its_traceback() -> None:
    def broken() -> Iterator[Any]:
        yield from _batches(size=16)
        raise KeyError("label file missing")

    with pytest.raises(KeyError, match="label file missing") as info:
        _model().fit(broken(), epochs=1, verbose=0)
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "broken" in frames   # the generator's own frame, from the worker thread


def test_bad_batches_are_one_clear_error() -> None:
    model = _model()
    four = (X[:16], Y[:16], np.ones(16), np.ones(16))
    with pytest.raises(ValueError, match="tuple of 4 elements"):
        model.fit(iter([four]), verbose=0)
    with pytest.raises(ValueError, match=r"batch 1 of the generator: x has shape \(16, 7\)"):
        model.fit(iter([(X[:16], Y[:16]), (X[16:32, :7], Y[16:32])]), verbose=0)
    with pytest.raises(ValueError, match="first batch held x, y"):
        model.fit(iter([(X[:16], Y[:16]), (X[16:32], Y[16:32], np.ones(16))]), verbose=0)
    with pytest.raises(ValueError, match="same number of samples"):
        model.fit(iter([(X[:16], Y[:8])]), verbose=0)
    with pytest.raises(ValueError, match="yielded no batch"):
        model.fit(iter([]), verbose=0)
    # ported from keras/src/trainers/data_adapters/generator_data_adapter_test.py::
    # test_empty_generator_raises_clear_error
    def generator() -> Iterator[Any]:
        if False:
            yield
    with pytest.raises(ValueError, match="the generator must yield at least one batch"):
        model.fit(generator(), verbose=0)
    with pytest.raises(ValueError, match="needs labels"):
        model.fit(_batches(y=None), verbose=0)


def test_what_does_not_go_with_a_generator() -> None:
    model = _model()
    with pytest.raises(ValueError, match="`y` should not be passed"):
        model.fit(_batches(), Y, verbose=0)
    with pytest.raises(ValueError, match="`sample_weight` should not be passed"):
        model.fit(_batches(), sample_weight=np.ones(96), verbose=0)
    with pytest.raises(ValueError, match="class_weight"):
        model.fit(_batches(), class_weight={0: 1.0}, verbose=0)
    with pytest.raises(ValueError, match="validation_split` is only supported for arrays"):
        model.fit(_batches(), validation_split=0.2, verbose=0)
    with pytest.raises(ValueError, match="steps_per_epoch must be an integer >= 1"):
        model.fit(_batches(), steps_per_epoch=0, verbose=0)


def test_shuffle_is_ignored_for_a_generator_with_keras_warning() -> None:
    model = _model()
    with pytest.warns(UserWarning, match="`shuffle=True` was passed, but will be ignored"):
        model.fit(_batches(), shuffle=True, verbose=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.fit(_batches(), shuffle=False, verbose=0)


def test_batch_size_with_a_generator_is_ignored_with_a_warning() -> None:
    with pytest.warns(UserWarning, match="batch_size=8 is ignored"):
        history = _model().fit(_batches(), batch_size=8, shuffle=False, verbose=0)
    assert len(history.history["loss"]) == 1


def test_validation_freq_and_validation_batch_size() -> None:
    model = _model()
    every_second = model.fit(X, Y, validation_data=(X[:32], Y[:32]), epochs=4,
                             validation_freq=2, verbose=0)
    assert len(every_second.history["val_loss"]) == 2
    listed = model.fit(X, Y, validation_data=(X[:32], Y[:32]), epochs=4,
                       validation_freq=[1, 4], validation_batch_size=5, verbose=0)
    assert len(listed.history["val_loss"]) == 2
    assert listed.history["val_loss"][-1] == pytest.approx(
        model.evaluate(X[:32], Y[:32], batch_size=5, verbose=0)[0], rel=1e-6)
    with pytest.raises(ValueError, match="validation_freq must be an integer >= 1 or a list"):
        model.fit(X, Y, validation_freq=0, verbose=0)


def test_the_progress_bar_of_an_unknown_length_counts_steps(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from mpcore.models import progress

    totals: list[Any] = []
    original = progress.progress_bar

    def recording(epoch: int, epochs: int, steps: int | None) -> Any:
        bar = original(epoch, epochs, steps)
        totals.append(bar.total)
        return bar

    monkeypatch.setattr(progress, "_terminal", lambda stream: True)   # tqdm draws here too
    monkeypatch.setattr(progress, "progress_bar", recording)
    _model().fit(_batches(), epochs=1, verbose=1)
    _model().fit(_batches(repeat=2), epochs=2, steps_per_epoch=6, verbose=1)
    assert totals == [None, 6, 6]
    assert "Epoch 1/1" in capsys.readouterr().out
