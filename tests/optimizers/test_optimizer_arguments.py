"""Every optimizer hyperparameter follows the argument rule (issue 15, item 13): a finite real
number (no bool, no string: ``SGD(learning_rate="x")`` used to fail inside float() without
naming the argument) in its valid range, checked when the optimizer is made, with an error
naming the argument and the range."""

from __future__ import annotations

import math
import numbers
import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mpcore as mp
from mpcore import optimizers
from mpcore.optimizers.loss_scale_optimizer import LossScaleOptimizer

ANYTHING = st.one_of(
    st.floats(allow_nan=True), st.integers(-3, 3), st.booleans(), st.none(),
    st.floats(-2, 2, width=32).map(np.float32), st.integers(0, 2).map(np.int64),
    st.text(max_size=3), st.sampled_from(["0.1", "1e-3"]), st.just(10**400))

# (optimizer, argument, low, high, low_open, high_open): high None is no upper bound.
RANGES = [
    (optimizers.SGD, "learning_rate", 0, None, False, False),
    (optimizers.SGD, "momentum", 0, 1, False, False),
    (optimizers.RMSprop, "learning_rate", 0, None, False, False),
    (optimizers.RMSprop, "rho", 0, 1, False, True),
    (optimizers.RMSprop, "momentum", 0, 1, False, False),
    (optimizers.RMSprop, "epsilon", 0, None, True, False),
    (optimizers.Adam, "learning_rate", 0, None, False, False),
    (optimizers.Adam, "beta_1", 0, 1, False, True),
    (optimizers.Adam, "beta_2", 0, 1, False, True),
    (optimizers.Adam, "epsilon", 0, None, True, False),
    (optimizers.Adam, "weight_decay", 0, None, False, False),
    (optimizers.AdamW, "learning_rate", 0, None, False, False),
    (optimizers.AdamW, "weight_decay", 0, None, False, False),
    (optimizers.AdamW, "beta_1", 0, 1, False, True),
    (optimizers.AdamW, "beta_2", 0, 1, False, True),
    (optimizers.AdamW, "epsilon", 0, None, True, False),
]


def _inside(value: Any, low: float, high: float | None, low_open: bool, high_open: bool) -> bool:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        v = float(value)
    except OverflowError:
        return False
    return (math.isfinite(v) and (v > low if low_open else v >= low)
            and (high is None or (v < high if high_open else v <= high)))


@pytest.mark.parametrize("cls, name, low, high, low_open, high_open", RANGES,
                         ids=[f"{c.__name__}-{n}" for c, n, *_ in RANGES])
@given(value=ANYTHING)
def test_each_hyperparameter_takes_exactly_the_numbers_in_its_range(
        cls: type, name: str, low: float, high: float | None, low_open: bool, high_open: bool,
        value: Any) -> None:
    if value is None and (cls, name) == (optimizers.Adam, "weight_decay"):
        assert cls(weight_decay=None).weight_decay == 0.0  # Keras' default: no decay
    elif _inside(value, low, high, low_open, high_open):
        opt = cls(**{name: value})
        assert getattr(opt, name) == pytest.approx(float(value))
        assert type(opt.get_config()[name]) is float or value == 0
    else:
        with pytest.raises(ValueError, match=rf"^{name} must be a finite number"):
            cls(**{name: value})


@pytest.mark.parametrize("value", ["x", "0.1", None, True, math.nan, math.inf, -1e-3, [0.1]])
def test_learning_rate_errors_name_the_argument_and_the_choices(value: Any) -> None:
    for cls in (optimizers.SGD, optimizers.RMSprop, optimizers.Adam, optimizers.AdamW):
        with pytest.raises(ValueError, match=r"learning_rate must be a finite number >= 0 or a "
                                             r"callable schedule\(step\) -> float, got "
                                             + re.escape(repr(value))):
            cls(learning_rate=value)
    opt = optimizers.SGD(0.1)
    wrapped = LossScaleOptimizer(optimizers.SGD(0.1))
    for target in (opt, wrapped):
        with pytest.raises(ValueError, match="learning_rate must be a finite number >= 0"):
            target.learning_rate = value
        assert target.learning_rate == 0.1  # unchanged by the refused value


def test_a_schedule_that_returns_a_bad_rate_is_named_with_the_step() -> None:
    opt = optimizers.SGD(lambda step: 0.1 if step == 0 else "fast")
    var = mp.Variable([1.0])
    opt.apply_gradients([(mp.constant([1.0]), var)])
    with pytest.raises(ValueError, match=r"learning_rate schedule .* returned 'fast' at step 1;"
                                         r" it must return a finite number >= 0"):
        opt.apply_gradients([(mp.constant([1.0]), var)])
    assert var.numpy().tolist() == pytest.approx([0.9])


@pytest.mark.parametrize("make, message", [
    (lambda: optimizers.SGD(nesterov="yes"), r"nesterov must be True or False, got 'yes'"),
    (lambda: optimizers.SGD(name=3), r"name must be a string or None, got 3"),
    (lambda: optimizers.Adam(weight_decay="0.1"), r"weight_decay must be a finite number >= 0"),
])
def test_the_other_hyperparameters(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_adam_weight_decay_none_is_no_decay() -> None:
    assert optimizers.Adam(weight_decay=None).weight_decay == 0.0
    assert optimizers.Adam().get_config()["weight_decay"] is None
    assert optimizers.Adam.from_config(optimizers.Adam().get_config()).weight_decay == 0.0


@pytest.mark.parametrize("opt", [optimizers.SGD(0.1, momentum=0.5, nesterov=True),
                                 optimizers.RMSprop(rho=0.8, momentum=0.1, epsilon=1e-6),
                                 optimizers.Adam(beta_1=0.8, weight_decay=0.01),
                                 optimizers.AdamW(weight_decay=0.0)],
                         ids=lambda o: type(o).__name__)
def test_configs_round_trip_through_the_checks(opt: optimizers.Optimizer) -> None:
    again = type(opt).from_config(opt.get_config())
    assert again.get_config() == opt.get_config()


# --- hyperparameters set after construction (a trial found them stored unchecked, and
# ``opt.clipnorm = x`` read by nothing) -----------------------------------------------------------
@pytest.mark.parametrize(("make", "name", "value", "match"), [
    (lambda: mp.optimizers.RMSprop(), "rho", 1.5, "rho"),
    (lambda: mp.optimizers.RMSprop(), "epsilon", -1, "epsilon"),
    (lambda: mp.optimizers.SGD(), "momentum", -3, "momentum"),
    (lambda: mp.optimizers.SGD(), "nesterov", "yes", "nesterov"),
    (lambda: mp.optimizers.Adam(), "beta_2", 1.0, "beta_2"),
    (lambda: mp.optimizers.Adam(), "gradient_accumulation_steps", 0, "gradient_accumulation"),
    (lambda: mp.optimizers.SGD(), "use_fused_kernels", "no", "use_fused_kernels"),
])
def test_a_hyperparameter_set_later_is_checked_as_at_construction(make: Any, name: str,
                                                                  value: Any, match: str) -> None:
    opt = make()
    before = getattr(opt, name)
    with pytest.raises(ValueError, match=match):
        setattr(opt, name, value)
    assert getattr(opt, name) == before


def test_clipping_set_later_is_the_clipping_given_at_construction() -> None:
    rng = np.random.default_rng(1)
    grads = [mp.constant(rng.normal(0, 5, (3, 2)).astype(np.float32))]
    results = []
    for late in (False, True):
        v = mp.Variable(np.ones((3, 2), np.float32))
        opt = mp.optimizers.SGD(0.1) if late else mp.optimizers.SGD(0.1, clipnorm=0.01)
        if late:
            opt.clipnorm = 0.01
        assert opt.clipnorm == 0.01 and opt.clipping == ("clipnorm", 0.01)
        opt.apply_gradients(zip(grads, [v]))
        results.append(v.numpy())
    np.testing.assert_array_equal(*results)
    opt.clipnorm = None
    assert opt.clipping is None
    opt.clipvalue = 1.0
    with pytest.raises(ValueError):
        opt.global_clipnorm = 1.0          # at most one clipping option


def test_momentum_needing_a_slot_the_optimizer_lacks_is_refused_with_what_to_do() -> None:
    v = mp.Variable(np.ones(3, np.float32))
    opt = mp.optimizers.SGD(0.1)
    opt.apply_gradients([(mp.constant(np.ones(3, np.float32)), v)])
    with pytest.raises(ValueError, match=r"momentum=0.9 needs the slot\(s\) \['momentum'\].*"
                                         r"make a new optimizer"):
        opt.momentum = 0.9
    assert opt.momentum == 0.0
    opt.momentum = 0.0                    # no new slot needed: fine


def test_a_loss_scale_optimizer_sets_and_reads_hyperparameters_on_its_inner_optimizer() -> None:
    inner = mp.optimizers.SGD(0.1)
    lso = mp.mixed_precision.LossScaleOptimizer(inner)
    lso.momentum = 0.5                         # before the first step: the inner one's
    lso.clipnorm = 1.0
    assert inner.momentum == 0.5 and inner.clipping == ("clipnorm", 1.0)
    assert lso.momentum == 0.5 and lso.clipnorm == 1.0
    with pytest.raises(ValueError, match="momentum"):
        lso.momentum = 2.0
    assert "momentum" not in vars(lso)


# --- a re-trial's findings ------------------------------------------------------------------
def test_lr_set_on_a_loss_scale_optimizer_is_the_inner_rate() -> None:
    inner = mp.optimizers.SGD(0.01)
    lso = mp.mixed_precision.LossScaleOptimizer(inner)
    lso.lr = 0.5
    assert inner.learning_rate == lso.learning_rate == lso.lr == 0.5
    assert "_learning_rate" not in vars(lso)


def test_a_subclass_hyperparameter_is_forwarded_by_a_loss_scale_optimizer() -> None:
    class Decaying(mp.optimizers.RMSprop):
        CHECKS = {**mp.optimizers.RMSprop.CHECKS, "decay": float}

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.decay = 0.5

    inner = Decaying(0.01)
    lso = mp.mixed_precision.LossScaleOptimizer(inner)
    lso.decay = 0.9
    assert inner.decay == lso.decay == 0.9


def test_accumulation_steps_cannot_change_in_the_middle_of_an_accumulation() -> None:
    v = mp.Variable(np.zeros(1, np.float32))
    opt = mp.optimizers.SGD(1.0, gradient_accumulation_steps=4)
    g = mp.constant(np.ones(1, np.float32))
    for _ in range(3):
        opt.apply_gradients([(g, v)])
    for value in (2, None):
        with pytest.raises(ValueError, match=r"middle of an accumulation \(3 of 4"):
            opt.gradient_accumulation_steps = value
    opt.apply_gradients([(g, v)])
    np.testing.assert_array_equal(v.numpy(), [-1.0])       # the mean of 4
    opt.gradient_accumulation_steps = 2                     # right after an update: fine


@pytest.mark.parametrize(("value", "match"), [
    (("clipnorm", -5.0), "clipnorm"),
    (("clipnrom", 1.0), "one of clipnorm, clipvalue, global_clipnorm"),
    ("clipnorm", "one of clipnorm"),
])
def test_clipping_set_directly_is_checked(value: Any, match: str) -> None:
    opt = mp.optimizers.SGD(1.0)
    with pytest.raises(ValueError, match=match):
        opt.clipping = value
    assert opt.clipping is None
    opt.clipping = ("clipvalue", 0.5)
    assert opt.clipvalue == 0.5


def test_an_optimizer_that_has_stepped_pickles_without_its_last_tensors() -> None:
    import pickle

    v = mp.Variable(np.ones(2, np.float32))
    opt = mp.optimizers.RMSprop(0.01)
    opt.apply_gradients([(mp.constant(np.ones(2, np.float32)), v)])
    copy = pickle.loads(pickle.dumps(opt))
    assert copy.get_config() == opt.get_config() and copy.iterations == 1
    assert copy.last_gradients == [] and opt.last_gradients


@pytest.mark.parametrize("make, option, off", [
    (mp.optimizers.Adam, "amsgrad", False), (mp.optimizers.AdamW, "amsgrad", False),
    (mp.optimizers.RMSprop, "centered", False), (mp.optimizers.SGD, "use_ema", False),
    (mp.optimizers.Adam, "loss_scale_factor", None), (mp.optimizers.SGD, "weight_decay", None),
])
def test_keras_options_mpcore_lacks_are_taken_off_and_refused_on(make: Any, option: str,
                                                                  off: Any) -> None:
    """Keras 3 code that spells out an option's default runs unchanged; turning a feature on
    that mpcore does not have is a clear error naming what the optimizer takes (before: a
    bare "unexpected keyword argument")."""
    make(**{option: off})
    with pytest.raises(ValueError, match=rf"{option}=True.* not implemented by mpcore.*takes: "):
        make(**{option: True})


def test_an_unknown_optimizer_argument_names_the_valid_ones() -> None:
    # Keras 3: ValueError("Argument(s) not recognized: ...")
    with pytest.raises(ValueError, match=r"not recognized: beta1=0\.8; Adam takes: beta_1, "):
        mp.optimizers.Adam(beta1=0.8)
    with pytest.raises(ValueError, match="amsgrad"):
        mp.optimizers.SGD(amsgrad=False)      # not SGD's option in Keras either


def test_set_random_seed_seeds_python_numpy_and_mpcore_as_keras() -> None:
    import random

    draws = []
    for _ in range(2):
        mp.utils.set_random_seed(1234)
        draws.append((random.random(), np.random.rand(),
                      mp.ops.random_uniform((3,)).numpy().tolist()))
    assert draws[0] == draws[1]
    with pytest.raises(ValueError, match="Expected `seed` argument to be an integer"):
        mp.utils.set_random_seed(1.5)
