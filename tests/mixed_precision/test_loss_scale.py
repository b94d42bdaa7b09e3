"""LossScale: reprs, FixedLossScale, DynamicLossScale's TF semantics against an independent
reference model (hypothesis state machine), config/state round trips, bad arguments, and
device flags from every backend."""

from __future__ import annotations

import copy
import pickle
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import mpcore as mp
from mpcore.mixed_precision import loss_scale as ls_module

F32_MAX = float(np.finfo(np.float32).max)


def test_reprs_exactly_as_designed() -> None:
    assert repr(mp.DynamicLossScale()) == (
        "DynamicLossScale(current_loss_scale=32768.0, num_good_steps=0, "
        "initial_loss_scale=32768.0, increment_period=2000, multiplier=2.0)")
    assert repr(mp.FixedLossScale(1024)) == "FixedLossScale(1024.0)"
    ls = mp.DynamicLossScale(initial_loss_scale=4, increment_period=3, multiplier=4)
    ls.update(True)
    assert repr(ls) == ("DynamicLossScale(current_loss_scale=4.0, num_good_steps=1, "
                        "initial_loss_scale=4.0, increment_period=3, multiplier=4.0)")


def test_defaults() -> None:
    ls = mp.DynamicLossScale()
    assert ls() == 2.0**15
    assert isinstance(ls(), float)
    assert (ls.initial_loss_scale, ls.increment_period, ls.multiplier) == (32768.0, 2000, 2.0)
    assert ls.num_good_steps == 0
    assert isinstance(ls, mp.LossScale)


@pytest.mark.parametrize("flags", [[True] * 5, [False] * 5, [True, False, True, False]])
def test_fixed_never_changes_and_update_says_apply(flags: list[bool]) -> None:
    ls = mp.FixedLossScale(1024)
    for ok in flags:
        assert ls.update(ok) is ok
        assert ls() == 1024.0
    assert ls.get_config() == {"loss_scale_value": 1024.0}
    assert ls.state_dict() == {}


def test_fixed_rounds_to_float32_and_round_trips() -> None:
    ls = mp.FixedLossScale(0.1)
    assert ls() == float(np.float32(0.1))
    for other in (mp.FixedLossScale.from_config(ls.get_config()), pickle.loads(pickle.dumps(ls)),
                  copy.deepcopy(ls)):
        assert other == ls
        assert other() == ls()
    ls.load_state_dict({})
    with pytest.raises(ValueError, match="no state"):
        ls.load_state_dict({"current_loss_scale": 2.0})


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), float("nan"), 1e39, "big", None,
                                   True])
def test_fixed_bad_values(value: object) -> None:
    with pytest.raises(ValueError, match="loss_scale_value"):
        mp.FixedLossScale(value)  # type: ignore[arg-type]


def test_dynamic_tf_semantics_by_hand() -> None:
    ls = mp.DynamicLossScale(initial_loss_scale=8.0, increment_period=3, multiplier=2.0)
    assert [ls.update(True) for _ in range(2)] == [True, True]
    assert (ls(), ls.num_good_steps) == (8.0, 2)
    assert ls.update(True) is True                       # third good step: grow, reset
    assert (ls(), ls.num_good_steps) == (16.0, 0)
    ls.update(True)
    assert ls.update(False) is False                     # overflow: shrink, reset the counter
    assert (ls(), ls.num_good_steps) == (8.0, 0)
    for _ in range(10):
        ls.update(False)
    assert ls() == 1.0                                   # the floor
    assert ls.update(np.bool_(True)) is True             # NumPy bools are flags too
    assert ls.num_good_steps == 1


def test_growth_stops_at_float32_max() -> None:
    top = float(np.float32(2.0**127))
    ls = mp.DynamicLossScale(initial_loss_scale=top, increment_period=1, multiplier=2.0)
    assert ls.update(True) is True
    assert ls() == top                 # 2**128 is inf in float32: the scale stays
    assert ls.num_good_steps == 0      # the counter still resets
    near = mp.DynamicLossScale(initial_loss_scale=F32_MAX, increment_period=1,
                               multiplier=1.0000001)
    near.update(True)
    assert near() == F32_MAX


def test_multiplier_is_applied_in_float32_like_tf() -> None:
    ls = mp.DynamicLossScale(initial_loss_scale=3.0, increment_period=1, multiplier=1.1)
    expected = np.float32(3.0)
    for _ in range(20):
        ls.update(True)
        expected = expected * np.float32(1.1)
        assert ls() == float(expected)
    assert ls.multiplier == 1.1  # the config keeps what was given


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"initial_loss_scale": 0.5}, "initial_loss_scale"),
    ({"initial_loss_scale": float("inf")}, "initial_loss_scale"),
    ({"initial_loss_scale": 1e39}, "initial_loss_scale"),
    ({"initial_loss_scale": "x"}, "initial_loss_scale"),
    ({"increment_period": 0}, "increment_period"),
    ({"increment_period": 2.5}, "increment_period"),
    ({"increment_period": True}, "increment_period"),
    ({"multiplier": 1.0}, "multiplier"),
    ({"multiplier": 0.5}, "multiplier"),
    ({"multiplier": float("nan")}, "multiplier"),
    ({"multiplier": None}, "multiplier"),
])
def test_dynamic_bad_arguments_name_the_argument(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        mp.DynamicLossScale(**kwargs)  # type: ignore[arg-type]


def test_dynamic_config_state_pickle_round_trip() -> None:
    ls = mp.DynamicLossScale(initial_loss_scale=64.0, increment_period=4, multiplier=3.0)
    for ok in (True, True, False, True, True, True, True, True):
        ls.update(ok)
    state = ls.state_dict()
    assert state == {"current_loss_scale": ls(), "num_good_steps": ls.num_good_steps}
    fresh = mp.DynamicLossScale.from_config(ls.get_config())
    assert fresh() == 64.0 and fresh != ls
    fresh.load_state_dict(state)
    assert fresh == ls and repr(fresh) == repr(ls)
    for other in (pickle.loads(pickle.dumps(ls)), copy.deepcopy(ls)):
        assert other == ls and repr(other) == repr(ls)
    # the restored scale continues exactly as the original would
    for ok in (True, True, True, False, True):
        assert fresh.update(ok) == ls.update(ok)
        assert (fresh(), fresh.num_good_steps) == (ls(), ls.num_good_steps)
    assert ls_module.deserialize(ls_module.serialize(ls)).get_config() == ls.get_config()


@pytest.mark.parametrize("state", [
    {"current_loss_scale": 2.0},
    {"current_loss_scale": 0.5, "num_good_steps": 0},
    {"current_loss_scale": 1e39, "num_good_steps": 0},
    {"current_loss_scale": float("nan"), "num_good_steps": 0},
    {"current_loss_scale": 2.0, "num_good_steps": -1},
    {"current_loss_scale": 2.0, "num_good_steps": 1.5},
    {"current_loss_scale": 2.0, "num_good_steps": 0, "extra": 1},
])
def test_dynamic_bad_state(state: dict[str, object]) -> None:
    ls = mp.DynamicLossScale()
    with pytest.raises(ValueError):
        ls.load_state_dict(state)
    assert ls() == 32768.0 and ls.num_good_steps == 0  # a bad state changes nothing


def test_state_accepts_numpy_scalars_from_checkpoints() -> None:
    ls = mp.DynamicLossScale()
    ls.load_state_dict({"current_loss_scale": np.float32(4.0), "num_good_steps": np.int64(3)})
    assert (ls(), ls.num_good_steps) == (4.0, 3)


def test_get_identifiers() -> None:
    assert ls_module.get(None) is None
    assert ls_module.get("dynamic") == mp.DynamicLossScale()
    assert ls_module.get(8) == mp.FixedLossScale(8)
    with pytest.raises(ValueError, match="dynamic"):
        ls_module.get("static")
    with pytest.raises(ValueError, match="DynamicLossScale"):
        ls_module.deserialize({"class_name": "Nope", "config": {}})


def test_update_with_device_flags(backend: mp.Backend) -> None:
    good = mp.ops.all_finite([mp.constant([1.0, 2.0]), mp.constant([[3.0]], dtype="float16")])
    bad = mp.ops.all_finite([mp.constant([1.0, 2.0]), mp.constant([np.inf])])
    nan = mp.ops.all_finite([mp.constant([np.nan], dtype="bfloat16")])
    assert good.backend is backend and good.dtype == "bool"
    ls = mp.DynamicLossScale(initial_loss_scale=4.0, increment_period=1)
    assert ls.update(good) is True and ls() == 8.0
    assert ls.update(bad) is False and ls() == 4.0
    assert ls.update(nan) is False and ls() == 2.0
    fixed = mp.FixedLossScale(2)
    assert fixed.update(good) is True
    assert fixed.update(bad) is False
    _, flag = mp.ops.unscale_and_check([mp.constant([1.0, 65504.0], dtype="float16")], 0.5)
    assert ls.update(flag) is True


# --- the state machine against an independent reference ---------------------------------
class Reference:
    """TF's DynamicLossScale, written with numpy.float32 arithmetic, with the options beyond
    TF: a floor, a ceiling and DeepSpeed-style hysteresis (back off only at the
    ``hysteresis``-th overflow in a row); their defaults are TF's behaviour."""

    def __init__(self, initial: float, period: int, multiplier: float, floor: float = 1.0,
                 ceiling: float | None = None, hysteresis: int = 1) -> None:
        self.scale = np.float32(initial)
        self.multiplier = np.float32(multiplier)
        self.period = period
        self.counter = 0
        self.floor, self.hysteresis, self.overflows = np.float32(floor), hysteresis, 0
        self.ceiling = None if ceiling is None else np.float32(ceiling)

    def update(self, finite: bool) -> bool:
        with np.errstate(over="ignore"):
            if finite:
                self.overflows = 0
                if self.counter + 1 >= self.period:
                    grown = self.scale * self.multiplier
                    if np.isfinite(grown):
                        self.scale = grown if self.ceiling is None else min(grown, self.ceiling)
                    self.counter = 0
                else:
                    self.counter += 1
                return True
            self.counter = 0
            self.overflows += 1
            if self.overflows == self.hysteresis:
                self.overflows = 0
                self.scale = np.maximum(self.scale / self.multiplier, self.floor)
        return False


class DynamicLossScaleMachine(RuleBasedStateMachine):
    @initialize(
        initial=st.one_of(st.sampled_from([1.0, 2.0**15, 2.0**126, F32_MAX]),
                          st.floats(1.0, 1e38)),
        period=st.integers(1, 4),
        multiplier=st.one_of(st.sampled_from([2.0, 4.0, 1.5]), st.floats(1.0001, 1e6)),
    )
    def start(self, initial: float, period: int, multiplier: float) -> None:
        self.ls = mp.DynamicLossScale(initial, period, multiplier)
        self.ref = Reference(initial, period, multiplier)

    @rule(finite=st.booleans())
    def step(self, finite: bool) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # stuck at the floor: tested apart
            assert self.ls.update(finite) is self.ref.update(finite)

    @rule(n=st.integers(1, 40))
    def many_finite_steps(self, n: int) -> None:
        for _ in range(n):
            assert self.ls.update(True) is True
            self.ref.update(True)

    @rule(n=st.integers(1, 200))
    def many_overflows(self, n: int) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # stuck at the floor: tested apart
            for _ in range(n):
                assert self.ls.update(False) is False
                self.ref.update(False)

    @rule()
    def checkpoint_and_restore(self) -> None:
        restored = mp.DynamicLossScale.from_config(self.ls.get_config())
        restored.load_state_dict(self.ls.state_dict())
        assert restored == self.ls
        self.ls = pickle.loads(pickle.dumps(restored))

    @precondition(lambda self: hasattr(self, "ls"))
    @invariant()
    def matches_reference(self) -> None:
        assert self.ls() == float(self.ref.scale)
        assert self.ls.num_good_steps == self.ref.counter
        assert 1.0 <= self.ls() <= F32_MAX
        assert self.ls() == float(np.float32(self.ls()))  # always a float32 value


TestDynamicLossScaleMachine = DynamicLossScaleMachine.TestCase
TestDynamicLossScaleMachine.settings = settings(max_examples=60, stateful_step_count=30,
                                                deadline=None)


@given(st.floats(1.0, F32_MAX), st.floats(1.0001, 1e30))
def test_one_overflow_then_growth(initial: float, multiplier: float) -> None:
    ls = mp.DynamicLossScale(initial, 1, multiplier)
    ref = Reference(initial, 1, multiplier)
    for ok in (False, True, True, False):
        ls.update(ok)
        ref.update(ok)
        assert ls() == float(ref.scale)


# --- the options beyond TF: floor, ceiling, hysteresis (DeepSpeed's) ----------------------
class DynamicLossScaleOptionsMachine(DynamicLossScaleMachine):
    """The machine above (its rules inherited) with a floor, a ceiling and hysteresis."""

    @initialize(floor_exp=st.integers(-4, 10), span=st.one_of(st.none(), st.integers(0, 12)),
                start=st.integers(0, 12), period=st.integers(1, 3),
                multiplier=st.sampled_from([2.0, 4.0, 1.5]), hysteresis=st.integers(1, 4))
    def start(self, floor_exp: int, span: int | None, start: int, period: int,  # type: ignore[override]
              multiplier: float, hysteresis: int) -> None:
        floor = 2.0**floor_exp
        ceiling = None if span is None else 2.0 ** (floor_exp + span)
        initial = 2.0 ** (floor_exp + (start if span is None else min(start, span)))
        args = (initial, period, multiplier)
        self.ls = mp.DynamicLossScale(*args, min_loss_scale=floor, max_loss_scale=ceiling,
                                      hysteresis=hysteresis)
        self.ref = Reference(*args, floor, ceiling, hysteresis)

    @precondition(lambda self: hasattr(self, "ls"))
    @invariant()
    def matches_reference(self) -> None:
        assert self.ls() == float(self.ref.scale)
        assert self.ls.num_good_steps == self.ref.counter
        ceiling = self.ls.max_loss_scale
        assert self.ls.min_loss_scale <= self.ls() <= (F32_MAX if ceiling is None else ceiling)


TestDynamicLossScaleOptionsMachine = DynamicLossScaleOptionsMachine.TestCase
TestDynamicLossScaleOptionsMachine.settings = settings(max_examples=60, stateful_step_count=30,
                                                       deadline=None)


def test_hysteresis_floor_and_ceiling_by_hand() -> None:
    ls = mp.DynamicLossScale(8.0, increment_period=1, min_loss_scale=2.0, max_loss_scale=16.0,
                             hysteresis=2)
    seen = []
    for ok in (True, True, False, True, False, False, False, False, False, False):
        ls.update(ok)
        seen.append(ls())
    # grows to the ceiling; one overflow alone is tolerated; a second in a row backs off
    assert seen == [16.0, 16.0, 16.0, 16.0, 16.0, 8.0, 8.0, 4.0, 4.0, 2.0]
    assert repr(ls).endswith("min_loss_scale=2.0, max_loss_scale=16.0, hysteresis=2)")
    assert ls.state_dict() == {"current_loss_scale": 2.0, "num_good_steps": 0,
                               "overflows_in_a_row": 0}


def test_a_scale_stuck_at_its_floor_is_warned_about_once() -> None:
    ls = mp.DynamicLossScale(4.0)
    with pytest.warns(RuntimeWarning, match="at its floor .* mixed_bfloat16") as record:
        for _ in range(40):
            ls.update(False)
    assert len(record) == 1 and ls() == 1.0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"min_loss_scale": 0.0}, "min_loss_scale must be a number > 0"),
    ({"min_loss_scale": -1.0}, "min_loss_scale must be a number > 0"),
    ({"min_loss_scale": 64.0, "max_loss_scale": 32.0}, "max_loss_scale must be None or"),
    ({"max_loss_scale": float("inf")}, "max_loss_scale must be None or"),
    ({"initial_loss_scale": 1024.0, "max_loss_scale": 512.0},
     r"initial_loss_scale must be a finite number in \[min_loss_scale, max_loss_scale\]"),
    ({"initial_loss_scale": 2.0, "min_loss_scale": 4.0}, r"\[4.0, 3.40"),
    ({"hysteresis": 0}, r"hysteresis must be an integer >= 1"),
    ({"hysteresis": 1.5}, r"hysteresis must be an integer >= 1"),
    ({"hysteresis": True}, r"hysteresis must be an integer >= 1"),
])
def test_bad_options_name_the_valid_range(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mp.DynamicLossScale(**kwargs)  # type: ignore[arg-type]


def test_states_from_before_the_options_still_load() -> None:
    ls = mp.DynamicLossScale(hysteresis=3)
    ls.load_state_dict({"current_loss_scale": 8.0, "num_good_steps": 2})
    assert (ls(), ls.num_good_steps, ls.state_dict()["overflows_in_a_row"]) == (8.0, 2, 0)
    with pytest.raises(ValueError, match="overflows_in_a_row must be an integer in"):
        ls.load_state_dict({"current_loss_scale": 8.0, "num_good_steps": 2,
                            "overflows_in_a_row": 3})


def test_a_state_above_the_ceiling_is_refused() -> None:
    ls = mp.DynamicLossScale(initial_loss_scale=8, max_loss_scale=64)
    with pytest.raises(ValueError, match=r"in \[min_loss_scale, max_loss_scale\] = \[1.0, 64.0\]"):
        ls.load_state_dict({"current_loss_scale": 1e6, "num_good_steps": 0})
    assert ls() == 8.0


def test_the_floor_warning_counts_overflows_under_hysteresis() -> None:
    ls = mp.DynamicLossScale(initial_loss_scale=1, hysteresis=3)
    with pytest.warns(RuntimeWarning, match="for 10 overflowing steps in a row") as record:
        for _ in range(10):
            ls.update(False)
    assert len(record) == 1


def test_numbers_given_as_strings_are_refused() -> None:
    with pytest.raises(ValueError, match="min_loss_scale must be a number, got '2'"):
        mp.DynamicLossScale(min_loss_scale="2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="current_loss_scale must be a number"):
        mp.DynamicLossScale().load_state_dict({"current_loss_scale": "8", "num_good_steps": 0})


@pytest.mark.parametrize("flag", ["no", None, 1.0, 0, [True], np.array([True, False])])
@pytest.mark.parametrize("make", [mp.DynamicLossScale, lambda: mp.FixedLossScale(8)])
def test_update_takes_only_a_flag(make: Any, flag: Any) -> None:
    ls = make()
    with pytest.raises(TypeError, match="update takes the 'all gradients finite' flag"):
        ls.update(flag)
    # the accepted forms: a bool, a device flag, a NumPy bool scalar
    assert ls.update(True) is True
    assert ls.update(mp.ops.all_finite([mp.constant([np.inf])])) is False
    assert ls.update(np.bool_(True)) is True
