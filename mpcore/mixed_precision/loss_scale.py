"""Loss scaling: multiply the loss before backprop so small float16 gradients do not flush to
zero, and divide the gradients by the same factor before the update.

Semantics follow TensorFlow's ``DynamicLossScale``: the scale is a float32 value; after
``increment_period`` consecutive finite steps it is multiplied by ``multiplier`` (only while the
result stays finite in float32), a non-finite step divides it (never below 1.0) and resets the
good-step counter. Three options go beyond TF, with TF's behaviour as their defaults:
``min_loss_scale`` (the floor, 1.0), ``max_loss_scale`` (a ceiling, none) and ``hysteresis``
(as DeepSpeed's: back off only at the ``hysteresis``-th overflow in a row; 1 backs off at every
overflow). A scale stuck at its floor while steps keep overflowing is warned about once.

A dynamic scale used in training lives on the device (:meth:`DynamicLossScale.place`): its
scale, reciprocal and counters are variables that :func:`mpcore.ops.loss_scale_update` updates
from the step's finite flag, so a step reads nothing back; reading the scale (``ls()``,
``state_dict()``) is then a host read of the variables. Before it is placed it keeps the same
state in Python and updates it by the same rule (``update(True)``), bit for bit.

>>> ls = DynamicLossScale(initial_loss_scale=4.0, increment_period=2, multiplier=2.0)
>>> ls.update(True), ls.update(True), ls()
(True, True, 8.0)
>>> ls.update(False), ls()
(False, 4.0)
>>> FixedLossScale(1024)
FixedLossScale(1024.0)
"""

from __future__ import annotations

import math
import operator
import struct
import warnings
from collections.abc import Callable
from typing import Any

from mpcore.core import user_frames as _user_frames

#: The device side of a dynamic scale (:mod:`mpcore.ops.loss_scaling`: its variables and update
#: kernel), wired by ``mpcore/mixed_precision/__init__.py``, which sits above both: policy.py
#: makes loss scales and reaches no op, and ops sit below this package.
device: Any = None

#: Set by :mod:`mpcore.function` while it traces a step: called when a dynamic scale's value
#: is read (a host read there).
read_hook: Callable[[], None] | None = None


def _host_read() -> None:
    """A dynamic scale's state is read: in a traced step (outside the calls kept whole, which
    read it again at each replay) that is refused, as a replay would reuse the trace's."""
    if read_hook is not None:
        read_hook()


FLOAT32_MAX = 3.4028234663852886e38


def _to_float32(value: float) -> float:
    """Round like TF's float32 loss-scale variable, so scales match it bit for bit.
    Values that round beyond float32's range become inf (what a float32 multiply gives);
    those that round down to float32's max stay finite, as in IEEE arithmetic."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def _number(name: str, value: Any) -> float:
    if isinstance(value, (bool, str, bytes)):  # "2" is not silently a number
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None


def _integer(value: Any) -> int:
    """``value`` as an int (NumPy integers too); -1 for anything else (bool, float, str)."""
    try:
        return -1 if isinstance(value, bool) else operator.index(value)
    except TypeError:
        return -1


def _is_device_flag(grads_finite: Any) -> bool:
    return str(getattr(grads_finite, "dtype", "")) == "bool" and getattr(
        grads_finite, "size", None) == 1 and not isinstance(grads_finite, bool)


def _finite_flag(grads_finite: Any) -> bool:
    """The "all finite" flag as a Python bool: a bool, or a one-element bool tensor or array
    (``ops.all_finite``'s result). Anything else (a string, None, a float, a list of gradients)
    is a TypeError, not a truth value: ``"no"`` is truthy."""
    if isinstance(grads_finite, bool):
        return grads_finite
    if _is_device_flag(grads_finite):
        # a device scalar converts through __bool__: a host read (eager steps only)
        return bool(grads_finite)
    raise TypeError("update takes the 'all gradients finite' flag: a bool, or a one-element "
                    "bool tensor such as mp.ops.all_finite(grads) returns; got "
                    f"{type(grads_finite).__name__} {grads_finite!r}")


class LossScale:
    """Base class: a loss scale is called for its current value and updated once per step."""

    def __call__(self) -> float:
        raise NotImplementedError

    def __float__(self) -> float:
        """The current scale (``float(optimizer.loss_scale)``, as with TF 2.4+'s tensor)."""
        return float(self())

    def update(self, grads_finite: Any) -> bool:
        """Record one step; returns True when that step's gradients should be applied."""
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LossScale:
        return cls(**config)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} has no state; got keys {sorted(state)}")

    def __eq__(self, other: object) -> bool:
        return (type(self) is type(other) and self.get_config() == other.get_config()  # type: ignore[attr-defined]
                and self.state_dict() == other.state_dict())  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self.get_config().items()))))


class FixedLossScale(LossScale):
    """A loss scale that never changes; ``update(False)`` still means "skip this step"."""

    def __init__(self, loss_scale_value: float) -> None:
        value = _to_float32(_number("loss_scale_value", loss_scale_value))
        if not (math.isfinite(value) and value > 0):
            raise ValueError("loss_scale_value must be a number > 0 that is finite in float32, "
                             f"got {loss_scale_value!r}")
        self._value = value

    def __call__(self) -> float:
        return self._value

    def update(self, grads_finite: Any) -> bool:
        return _finite_flag(grads_finite)

    def get_config(self) -> dict[str, Any]:
        return {"loss_scale_value": self._value}

    def __repr__(self) -> str:
        return f"FixedLossScale({self._value!r})"



class DynamicLossScale(LossScale):
    """A loss scale that grows while gradients stay finite and shrinks when they overflow."""

    #: Overflows in a row at the floor before the one warning that the scale is stuck there.
    STUCK_AT_FLOOR = 10

    def __init__(self, initial_loss_scale: float = 2.0**15, increment_period: int = 2000,
                 multiplier: float = 2.0, min_loss_scale: float = 1.0,
                 max_loss_scale: float | None = None, hysteresis: int = 1) -> None:
        floor = _to_float32(_number("min_loss_scale", min_loss_scale))
        if not (math.isfinite(floor) and floor > 0):
            raise ValueError("min_loss_scale must be a number > 0 that is finite in float32, "
                             f"got {min_loss_scale!r}")
        ceiling = None
        if max_loss_scale is not None:
            ceiling = _to_float32(_number("max_loss_scale", max_loss_scale))
            if not (math.isfinite(ceiling) and ceiling >= floor):
                raise ValueError(f"max_loss_scale must be None or a finite float32 number >= "
                                 f"min_loss_scale ({floor!r}), got {max_loss_scale!r}")
        top = FLOAT32_MAX if ceiling is None else ceiling
        initial = _to_float32(_number("initial_loss_scale", initial_loss_scale))
        if not (math.isfinite(initial) and floor <= initial <= top):
            raise ValueError(f"initial_loss_scale must be a finite number in [min_loss_scale, "
                             f"max_loss_scale] = [{floor!r}, {top!r}], got "
                             f"{initial_loss_scale!r}")
        period = _integer(increment_period)
        if period < 1:
            raise ValueError(f"increment_period must be an integer >= 1, got {increment_period!r}")
        patience = _integer(hysteresis)
        if patience < 1:
            raise ValueError(f"hysteresis must be an integer >= 1 (1: back off at every "
                             f"overflow), got {hysteresis!r}")
        self._floor, self._ceiling, self._hysteresis = floor, ceiling, patience
        self._overflows = 0          # overflows in a row, for the hysteresis
        self._stuck = 0              # overflows in a row at the floor (kept at the warning's)
        self._skipped = 0            # overflowing steps (a LossScaleOptimizer's skipped_steps)
        self._warned = False
        #: (scale, inv_scale, counters) once placed on a device (:meth:`place`), else None
        self._vars: tuple[Any, Any, Any] | None = None
        mult = _number("multiplier", multiplier)
        # TF multiplies the float32 scale by the multiplier as a float32 tensor.
        self._multiplier32 = _to_float32(mult)
        if not (math.isfinite(mult) and self._multiplier32 > 1.0):
            raise ValueError(f"multiplier must be a finite number > 1, got {multiplier!r}")
        self._initial = initial
        self._period = period
        self._multiplier = mult
        self._scale = self._initial
        self._good_steps = 0

    @property
    def initial_loss_scale(self) -> float:
        return self._initial

    @property
    def increment_period(self) -> int:
        return self._period

    @property
    def multiplier(self) -> float:
        return self._multiplier

    @property
    def num_good_steps(self) -> int:
        return self._read()[1]

    def __call__(self) -> float:
        return self._read()[0]

    # --- the state: in Python, or variables on a device ---------------------------------
    def _read(self) -> tuple[float, int, int, int, int]:
        """(scale, good steps, overflows in a row, at the floor in a row, skipped steps): a
        host read of the variables once placed (refused inside a traced step, where the
        variables are read as tensors: :meth:`tensors`)."""
        _host_read()
        if self._vars is None:
            return (self._scale, self._good_steps, self._overflows, self._stuck,
                    self._skipped)
        scale, _, counters = self._vars
        good, over, stuck, skipped = (int(c) for c in counters.numpy())
        state = (float(scale.numpy()), good, over, stuck, skipped)
        self._warn_if_stuck(stuck)
        return state

    def _write(self, scale: float, good: int, over: int, stuck: int, skipped: int) -> None:
        if self._vars is None:
            self._scale, self._good_steps, self._overflows = scale, good, over
            self._stuck, self._skipped = stuck, skipped
            return
        device.write_state(self._vars, scale, _to_float32(1.0 / scale),
                           [good, over, stuck, skipped])

    def place(self, backend: Any) -> tuple[Any, Any, Any]:
        """The scale's variables on ``backend`` (made from the Python state the first time,
        moved there from another backend): the scale and its reciprocal (float32, shape ())
        and the int64 counters (good steps, overflows in a row, at the floor in a row,
        skipped steps)."""
        if self._vars is not None and self._vars[0].backend is backend:
            return self._vars
        state = ((self._scale, self._good_steps, self._overflows, self._stuck, self._skipped)
                 if self._vars is None else self._read())   # (no host read to refuse)
        self._vars = None
        scale, good, over, stuck, skipped = state
        self._vars = device.make_state(backend, scale, _to_float32(1.0 / scale),
                                       [good, over, stuck, skipped])
        return self._vars

    @property
    def variables(self) -> list[Any]:
        """The device variables (none before :meth:`place`)."""
        return [] if self._vars is None else list(self._vars)

    def update_on_device(self, flag: Any, fused: bool = True) -> None:
        """The update from a device flag, on the device (no host read): what a training step
        does. Places the state on the flag's backend first. ``fused=False``: as ops, not the
        backend's kernel (for tests)."""
        scale, inv, counters = self.place(flag.backend)
        device.loss_scale_update(scale, inv, counters, flag, self._period, self._multiplier32,
                              self._floor, math.inf if self._ceiling is None else self._ceiling,
                              self._hysteresis, self.STUCK_AT_FLOOR, fused)

    def _warn_if_stuck(self, stuck: int) -> None:
        if stuck >= self.STUCK_AT_FLOOR and not self._warned:
            self._warned = True
            warnings.warn(
                f"the loss scale has been at its floor ({self._floor!r}) for "
                f"{self.STUCK_AT_FLOOR} overflowing steps in a row: the gradients overflow even "
                "unscaled. Try mixed_bfloat16 (float32's range), a lower learning rate, "
                "or keep the layer that overflows in float32 (dtype='float32').",
                RuntimeWarning, stacklevel=_user_frames.stacklevel())

    @property
    def min_loss_scale(self) -> float:
        return self._floor

    @property
    def max_loss_scale(self) -> float | None:
        return self._ceiling

    @property
    def hysteresis(self) -> int:
        return self._hysteresis

    def update(self, grads_finite: Any) -> bool:
        """Record one step (TF's rule); True when it should be applied. A device flag, or a
        scale already on the device, updates the variables on the device, then reads the
        flag (a host read: eager use; a traced step calls :meth:`update_on_device`)."""
        if self._vars is not None or (_is_device_flag(grads_finite) and hasattr(
                grads_finite, "backend")):
            finite = _finite_flag(grads_finite)          # (checks the type first)
            if not hasattr(grads_finite, "backend"):     # a bool, a NumPy bool
                grads_finite = device.flag(finite, self._vars[0].backend)  # type: ignore[index]
            self.update_on_device(grads_finite)
            if not finite:
                self._read()            # the warning, where the scale is stuck at its floor
            return finite
        finite = _finite_flag(grads_finite)
        if finite:
            self._overflows = 0
            if self._stuck < self.STUCK_AT_FLOOR:
                self._stuck = 0
            self._good_steps += 1
            if self._good_steps >= self._period:
                # exact in float64 (24-bit significands), so one rounding, as in float32
                grown = _to_float32(self._scale * self._multiplier32)
                if math.isfinite(grown):
                    self._scale = grown if self._ceiling is None else min(grown, self._ceiling)
                self._good_steps = 0
            return True
        self._good_steps = 0
        if self._stuck < self.STUCK_AT_FLOOR:
            self._stuck = self._stuck + 1 if self._scale <= self._floor else 0
        self._overflows += 1
        self._skipped += 1
        if self._overflows >= self._hysteresis:
            self._overflows = 0
            # float64 division then float32 rounding is correctly rounded (53 >= 2*24 + 2)
            self._scale = max(_to_float32(self._scale / self._multiplier32), self._floor)
        self._warn_if_stuck(self._stuck)
        return False

    def get_config(self) -> dict[str, Any]:
        return {"initial_loss_scale": self._initial, "increment_period": self._period,
                "multiplier": self._multiplier, "min_loss_scale": self._floor,
                "max_loss_scale": self._ceiling, "hysteresis": self._hysteresis}

    def state_dict(self) -> dict[str, Any]:
        scale, good, over, _, _ = self._read()
        state = {"current_loss_scale": scale, "num_good_steps": good}
        if self._hysteresis > 1:  # with hysteresis 1 no overflow is carried to the next step
            state["overflows_in_a_row"] = over
        return state

    @property
    def skipped_steps(self) -> int:
        """The overflowing steps this scale has seen (a device counter once placed)."""
        return self._read()[4]

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        scale, good, over, stuck, _ = self._read()
        self._write(scale, good, over, stuck, int(value))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        expected = {"current_loss_scale", "num_good_steps"}
        if not expected <= set(state) <= expected | {"overflows_in_a_row"}:
            raise ValueError(f"DynamicLossScale state needs keys {sorted(expected)} (and "
                             f"'overflows_in_a_row' with hysteresis), got {sorted(state)}")
        scale = _to_float32(_number("current_loss_scale", state["current_loss_scale"]))
        steps = _integer(state["num_good_steps"])
        overflows = _integer(state.get("overflows_in_a_row", 0))
        top = FLOAT32_MAX if self._ceiling is None else self._ceiling
        if not (math.isfinite(scale) and self._floor <= scale <= top):
            raise ValueError(f"current_loss_scale must be finite in float32 and in "
                             f"[min_loss_scale, max_loss_scale] = [{self._floor!r}, {top!r}], "
                             f"got {state['current_loss_scale']!r}")
        if steps < 0:
            raise ValueError("num_good_steps must be an integer >= 0, got "
                             f"{state['num_good_steps']!r}")
        if not 0 <= overflows < self._hysteresis:
            raise ValueError(f"overflows_in_a_row must be an integer in [0, hysteresis), got "
                             f"{state.get('overflows_in_a_row')!r}")
        skipped = self._read()[4]
        self._write(scale, steps, overflows, 0, skipped)

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.get_config(), "state": self.state_dict(),
                "skipped": self.skipped_steps}

    def __setstate__(self, data: dict[str, Any]) -> None:
        self.__init__(**data["config"])  # type: ignore[misc]
        self.load_state_dict(data["state"])
        self._skipped = int(data.get("skipped", 0))

    def __repr__(self) -> str:
        options = "".join(
            f", {name}={value!r}" for name, value, default in (
                ("min_loss_scale", self._floor, 1.0), ("max_loss_scale", self._ceiling, None),
                ("hysteresis", self._hysteresis, 1)) if value != default)
        scale, good = self._read()[:2]
        return (f"DynamicLossScale(current_loss_scale={scale!r}, "
                f"num_good_steps={good}, initial_loss_scale={self._initial!r}, "
                f"increment_period={self._period}, multiplier={self._multiplier!r}{options})")



_CLASSES: dict[str, type[LossScale]] = {
    "FixedLossScale": FixedLossScale, "DynamicLossScale": DynamicLossScale}


def serialize(loss_scale: LossScale) -> dict[str, Any]:
    return {"class_name": type(loss_scale).__name__, "config": loss_scale.get_config()}


def deserialize(config: dict[str, Any]) -> LossScale:
    name = config.get("class_name")
    if name not in _CLASSES:
        raise ValueError(f"unknown loss scale class {name!r}; valid: {', '.join(_CLASSES)}")
    return _CLASSES[name].from_config(config["config"])


def get(identifier: Any, allow_none: bool = True) -> LossScale | None:
    """A LossScale from "dynamic" (in any case), a number, a LossScale, a serialized dict, or
    None where ``allow_none`` (a policy's "no loss scale"; a LossScaleOptimizer needs one)."""
    if (identifier is None and allow_none) or isinstance(identifier, LossScale):
        return identifier
    if isinstance(identifier, str) and identifier.lower() == "dynamic":
        return DynamicLossScale()
    if isinstance(identifier, (int, float)) and not isinstance(identifier, bool):
        return FixedLossScale(identifier)
    if isinstance(identifier, dict):
        return deserialize(identifier)
    raise ValueError(f"invalid loss_scale {identifier!r}; valid: 'dynamic', a number > 0, "
                     f"a LossScale instance{', or None' if allow_none else ''}")
