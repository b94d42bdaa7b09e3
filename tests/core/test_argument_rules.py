"""One rule for the arguments of Model's entry points, the optimizers and the callbacks (issue 15,
item 13): integers are Python/NumPy integers (no bool, float or string), numbers are finite
real numbers, both in range, checked before any work, with an error that names the argument and
its valid values. Property tests hold the rule itself; the others hold each entry point to it."""

from __future__ import annotations

import math
import numbers
import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpcore as mp
from mpcore import layers
from mpcore.core import arguments

RNG = np.random.default_rng(12)
X = RNG.standard_normal((8, 4)).astype(np.float32)
Y = RNG.integers(0, 3, 8)

# Anything a caller might pass where a count or a rate is expected.
ANYTHING = st.one_of(
    st.integers(-5, 100), st.booleans(), st.none(), st.floats(allow_nan=True),
    st.integers(-5, 100).map(np.int64), st.integers(0, 100).map(np.uint8),
    st.floats(-2, 2, width=32).map(np.float32), st.booleans().map(np.bool_),
    st.text(max_size=4), st.integers(0, 50).map(str), st.just([1]), st.just(10**400))


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


# --- the rule ------------------------------------------------------------------------------
@given(value=ANYTHING, minimum=st.integers(0, 2))
def test_integer_takes_exactly_the_integers_in_range(value: Any, minimum: int) -> None:
    if _is_int(value) and value >= minimum:
        got = arguments.integer("steps", value, minimum)
        assert type(got) is int and got == value
    else:
        with pytest.raises(ValueError, match=rf"steps must be an integer >= {minimum}, got"):
            arguments.integer("steps", value, minimum)


@given(value=ANYTHING, low_open=st.booleans(), high_open=st.booleans())
def test_number_takes_exactly_the_finite_reals_in_range(value: Any, low_open: bool,
                                                        high_open: bool) -> None:
    inside = _is_real(value) and (value > 0 if low_open else value >= 0) and (
        value < 1 if high_open else value <= 1)
    interval = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"
    if inside:
        assert arguments.number("rho", value, 0, 1, low_open=low_open,
                                high_open=high_open) == float(value)
    else:
        with pytest.raises(ValueError, match="rho must be a finite number in " +
                           re.escape(interval)):
            arguments.number("rho", value, 0, 1, low_open=low_open, high_open=high_open)


@given(value=ANYTHING)
def test_verbose_takes_0_1_2_and_auto(value: Any) -> None:
    if _is_int(value) and value in (0, 1, 2):
        assert arguments.verbose(value) == value
    else:
        with pytest.raises(ValueError, match=r"verbose must be 0 \(silent\), 1 \(progress bar\)"
                                             r", 2 \(one line\) or 'auto'"):
            arguments.verbose(value)
    assert arguments.verbose("auto") == 1


# --- Model's entry points -------------------------------------------------------------------
def _model() -> mp.Model:
    mp.random.set_seed(0)
    model = mp.Sequential([mp.Input(shape=(4,)), layers.Dense(3, activation="softmax")])
    model.compile(loss="sparse_categorical_crossentropy", optimizer="sgd")
    return model


@pytest.fixture(scope="module")
def shared_model() -> mp.Model:
    return _model()


@settings(max_examples=40, deadline=None)
@given(value=ANYTHING)
def test_every_batch_size_follows_the_integer_rule(shared_model: mp.Model, value: Any) -> None:
    """batch_size=2.7 used to be truncated, "32" parsed, and predict(batch_size=0) failed with
    "range() arg 3 must not be zero"."""
    ok = value is None or (_is_int(value) and value >= 1)
    model = shared_model
    calls = {"fit": lambda: model.fit(X, Y, batch_size=value, epochs=0, verbose=0),
             "evaluate": lambda: model.evaluate(X, Y, batch_size=value, verbose=0),
             "predict": lambda: model.predict(X, batch_size=value)}
    for name, call in calls.items():
        if ok:
            call()
        else:
            with pytest.raises(ValueError, match=r"batch_size must be an integer >= 1, got"):
                call()
                pytest.fail(f"{name} took batch_size={value!r}")


@pytest.mark.parametrize("kwargs, message", [
    ({"epochs": 2.0}, r"epochs must be an integer >= 0, got 2\.0"),
    ({"epochs": True}, r"epochs must be an integer >= 0, got True"),
    ({"initial_epoch": "1"}, r"initial_epoch must be an integer >= 0, got '1'"),
    ({"batch_size": 2.7}, r"batch_size must be an integer >= 1, got 2\.7"),
    ({"batch_size": "32"}, r"batch_size must be an integer >= 1, got '32'"),
    ({"verbose": "bogus"}, r"verbose must be 0 \(silent\).*'auto', got 'bogus'"),
    ({"shuffle": "batch"}, r"shuffle must be True or False, got 'batch'"),
    ({"validation_split": np.nan}, r"validation_split must be a finite number in \[0, 1\)"),
    ({"callbacks": mp.callbacks.History()}, r"callbacks must be a list of "
                                            r"mp\.callbacks\.Callback instances"),
    ({"callbacks": [print]}, r"callbacks must be a list of mp\.callbacks\.Callback"),
    # (x, y, sample_weight) is Keras 3's third form; a 4-tuple is none of them
    ({"validation_data": (X, Y, Y, Y)}, r"validation_data must be a tuple \(x_val, y_val\) or "
                                        r"\(x_val, y_val, val_sample_weight\).*got a tuple "
                                        r"of 4 element\(s\)"),
    ({"validation_data": [X]}, r"validation_data must be a tuple.*got a list of 1 element\(s\)"),
])
def test_fit_checks_every_argument_before_any_work(kwargs: dict[str, Any], message: str) -> None:
    model = _model()
    before = model.get_weights()
    with pytest.raises(ValueError, match=message):
        model.fit(X, Y, **{"epochs": 1, "verbose": 0, **kwargs})
    assert model.optimizer.iterations == 0
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_fit_takes_numpy_integers() -> None:
    history = _model().fit(X, Y, batch_size=np.int64(4), epochs=np.int32(2),
                           initial_epoch=np.uint8(1), verbose=np.int64(0))
    assert history.epoch == [1]


@pytest.mark.parametrize("call, message", [
    (lambda m: m.evaluate(X, Y, verbose="bogus"), r"verbose must be 0"),
    (lambda m: m.evaluate(X, Y, verbose=0, return_dict="yes"), r"return_dict must be True or"),
    (lambda m: m.evaluate(None, Y, verbose=0), r"evaluate needs x and y"),
    (lambda m: m.predict(X, batch_size=0), r"batch_size must be an integer >= 1, got 0"),
    (lambda m: m.predict(X, verbose=3), r"verbose must be 0"),
    (lambda m: m.predict(None), r"predict needs x"),
    (lambda m: m.train_on_batch(X, Y, reset_metrics=1), r"reset_metrics must be True or False"),
    (lambda m: m.train_on_batch(X, None), r"train_on_batch needs x and y"),
    (lambda m: m.test_on_batch(X, Y, return_dict=None), r"return_dict must be True or False"),
    (lambda m: m.predict_on_batch(None), r"predict_on_batch needs x"),
    (lambda m: m.compile(optimizer="sgd", loss="mse", metrics=5),
     r"metrics must be a metric .* a list of them, or a dict by output name; got 5"),
])
def test_the_other_entry_points_check_their_arguments(call: Any, message: str) -> None:
    model = _model()
    with pytest.raises(ValueError, match=message):
        call(model)
    assert model.optimizer.iterations == 0


def test_predict_verbose_prints_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    """predict's verbose used to be ignored."""
    model = _model()
    model.predict(X, batch_size=4)
    assert capsys.readouterr().out == ""
    model.predict(X, batch_size=4, verbose=2)
    assert capsys.readouterr().out.startswith("2/2 - ")


# --- callbacks --------------------------------------------------------------------------------
def test_model_checkpoint_checks_its_template_before_training(tmp_path: Any) -> None:
    """ModelCheckpoint("{epok}") used to fail with a KeyError only after the first epoch."""
    with pytest.raises(ValueError, match=r"filepath '.*w-\{epoch:02d\.mpw' is not a valid "
                                         r"format string"):
        mp.callbacks.ModelCheckpoint(str(tmp_path / "w-{epoch:02d.mpw"))
    with pytest.raises(ValueError, match=r"positional field"):
        mp.callbacks.ModelCheckpoint(str(tmp_path / "w-{}.mpw"))
    model = _model()
    model.compile(loss="sparse_categorical_crossentropy", optimizer="sgd", metrics=["accuracy"])
    bad = mp.callbacks.ModelCheckpoint(str(tmp_path / "w-{epok}.mpw"), save_weights_only=True)
    with pytest.raises(ValueError, match=r"'epok'.*valid keys: epoch, loss, accuracy, "
                                         r"time_per_sample"):
        model.fit(X, Y, epochs=1, verbose=0, callbacks=[bad])
    assert model.optimizer.iterations == 0 and not list(tmp_path.iterdir())
    spec = mp.callbacks.ModelCheckpoint(str(tmp_path / "w-{epoch:s}.mpw"))
    with pytest.raises(ValueError, match=r"cannot be formatted: Unknown format code 's'.*"
                                         r"epoch is an integer"):
        model.fit(X, Y, epochs=1, verbose=0, callbacks=[spec])
    good = mp.callbacks.ModelCheckpoint(str(tmp_path / "w-{epoch:02d}-{val_loss:.3f}.mpw"),
                                        save_weights_only=True)
    model.fit(X, Y, epochs=1, verbose=0, validation_split=0.25, callbacks=[good])
    assert [p.name[:5] for p in tmp_path.iterdir()] == ["w-01-"]


@pytest.mark.parametrize("make", [
    lambda: mp.callbacks.EarlyStopping(monitor="val_los"),
    lambda: mp.callbacks.ModelCheckpoint("w.mpw", monitor="val_los", save_best_only=True),
])
def test_a_monitor_missing_from_the_logs_fails_before_training(make: Any) -> None:
    model = _model()
    with pytest.raises(ValueError, match=r"monitors 'val_los'.*available: loss, "
                                         r"val_loss, time_per_sample"):
        model.fit(X, Y, epochs=1, verbose=0, validation_split=0.25, callbacks=[make()])
    assert model.optimizer.iterations == 0


@pytest.mark.parametrize("kwargs, message", [
    ({"patience": 2.7}, r"patience must be an integer >= 0, got 2\.7"),
    ({"min_delta": "0.1"}, r"min_delta must be a finite number, got '0\.1'"),
    ({"restore_best_weights": "yes"}, r"restore_best_weights must be True or False"),
])
def test_early_stopping_checks_its_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mp.callbacks.EarlyStopping(**kwargs)
