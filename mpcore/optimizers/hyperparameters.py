"""What every optimizer's hyperparameters share: each is checked whenever it is set, at
construction or later (Keras users set them on the optimizer: a bad value set later was stored
as given), a change that needs slots the optimizer was built without is refused, and Keras'
clipping attributes (``clipnorm``, ``clipvalue``, ``global_clipnorm``) read and set the one
``clipping`` option (setting ``clipnorm`` on the optimizer used to add an attribute nothing
read)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpcore.core import arguments as _args
from mpcore.optimizers import clipping as _clipping


class Hyperparameters:
    """Mixed into :class:`~mpcore.optimizers.Optimizer` (which provides ``slot_names``,
    ``_slots``, ``_var_list`` and ``clipping``)."""

    clipping: tuple[str, float] | None
    slot_names: Any
    _var_list: list[Any]

    #: The checks a hyperparameter passes whenever it is set, at construction or later (Keras
    #: users set them on the optimizer): name -> check(value) -> the value stored.
    CHECKS: dict[str, Callable[[Any], Any]] = {
        "gradient_accumulation_steps": lambda v: (
            None if v is None else _args.integer("gradient_accumulation_steps", v, 1)),
        "momentum": lambda v: _args.number("momentum", v, 0.0, 1.0),
        "nesterov": lambda v: _args.flag("nesterov", v),
        "rho": lambda v: _args.number("rho", v, 0.0, 1.0, high_open=True),
        # 0 would divide 0 by 0 where a weight's gradients have all been 0
        "epsilon": lambda v: _args.number("epsilon", v, 0.0, low_open=True),
        "beta_1": lambda v: _args.number("beta_1", v, 0.0, 1.0, high_open=True),
        "beta_2": lambda v: _args.number("beta_2", v, 0.0, 1.0, high_open=True),
        "weight_decay": lambda v: 0.0 if v is None else _args.number("weight_decay", v, 0.0),
        "use_fused_kernels": lambda v: _args.flag("use_fused_kernels", v),
        "clipping": lambda v: _checked_clipping(v),
    }

    def __setattr__(self, name: str, value: Any) -> None:
        check = self.CHECKS.get(name)
        if check is None:
            object.__setattr__(self, name, value)
            return
        value = check(value)
        built = self.__dict__.get("_slots")
        old = self.__dict__.get(name, value)
        done = getattr(self, "_micro_steps", 0) if "_accumulators" in self.__dict__ else 0
        if name == "gradient_accumulation_steps" and done and value != old:
            raise ValueError(f"gradient_accumulation_steps cannot change in the middle of an "
                             f"accumulation ({done} of {old} micro-steps done): change it right "
                             "after an update")
        object.__setattr__(self, name, value)
        missing = {n for slots in (built or {}).values() for n in self.slot_names()
                   if n not in slots}
        if missing:   # e.g. momentum set above 0 once the slots exist without a velocity
            object.__setattr__(self, name, old)
            raise ValueError(f"{name}={value!r} needs the slot(s) {sorted(missing)}, which this "
                             f"optimizer, already built for {len(self._var_list)} variable(s), "
                             "does not have: set it before the first step, or make a new "
                             "optimizer")

    # Keras' clipping attributes, one of which may be set (``clipping`` holds it)
    def _clip_option(self, option: str) -> float | None:
        return self.clipping[1] if self.clipping and self.clipping[0] == option else None

    def _set_clip_option(self, option: str, value: float | None) -> None:
        given = {"clipnorm": None, "clipvalue": None, "global_clipnorm": None}
        if self.clipping is not None:
            given[self.clipping[0]] = self.clipping[1]
        given[option] = value
        self.clipping = _clipping.check(**given)

    clipnorm = property(lambda self: self._clip_option("clipnorm"),
                        lambda self, v: self._set_clip_option("clipnorm", v))
    clipvalue = property(lambda self: self._clip_option("clipvalue"),
                         lambda self, v: self._set_clip_option("clipvalue", v))
    global_clipnorm = property(lambda self: self._clip_option("global_clipnorm"),
                               lambda self, v: self._set_clip_option("global_clipnorm", v))


def _checked_clipping(value: Any) -> tuple[str, float] | None:
    """``clipping`` set directly: None or one (option, threshold) pair, checked as the
    constructor's ``clipnorm``/``clipvalue``/``global_clipnorm`` are."""
    if value is None:
        return None
    options = ("clipnorm", "clipvalue", "global_clipnorm")
    if not (isinstance(value, tuple) and len(value) == 2 and value[0] in options):
        raise ValueError(f"clipping must be None or (option, threshold) with option one of "
                         f"{', '.join(options)}, got {value!r}")
    return _clipping.check(**{**dict.fromkeys(options), value[0]: value[1]})
