"""LossScaleOptimizer: loss scaling around any optimizer, as in the Keras guide.

The custom training loop of the guide::

    with mp.GradientTape() as tape:
        loss = loss_object(y, model(x))
        scaled_loss = opt.get_scaled_loss(loss)
    grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, model.trainable_variables))
    opt.apply_gradients(zip(grads, model.trainable_variables))

``get_unscaled_gradients`` runs the multi-tensor ``unscale_and_check`` kernel: every gradient
(16-bit ones included) comes back in float32, divided by the scale, together with one device
flag "all finite". ``apply_gradients`` hands that flag to the inner optimizer's update (which
leaves every variable and slot untouched when it is false) and then to ``loss_scale.update``,
which reads it: the one host read of a training step. A step with any Inf/NaN gradient is
skipped as a whole, the scale shrinks, and ``skipped_steps`` counts it; ``iterations`` counts
every step, skipped or not.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

from mpcore import loss_scale as _ls
from mpcore import ops
from mpcore import user_frames as _user_frames
from mpcore.distribution import gradients as _distributed
from mpcore.function import in_traced_step, kept_whole
from mpcore.optimizers import Optimizer, split_grads_and_vars
from mpcore.tensor import Tensor, Variable


class LossScaleOptimizer(Optimizer):
    """Wraps ``inner_optimizer`` with ``loss_scale``: "dynamic" (the default), a number (a
    fixed scale) or a :class:`~mpcore.LossScale` (TF 2.3's argument). Or, as TF 2.4+ and
    Keras 3 spell it: ``dynamic`` (default True), ``initial_scale`` (default 2**15 when
    dynamic; required when not) and ``dynamic_growth_steps`` (default 2000), by keyword."""

    def __init__(self, inner_optimizer: Optimizer, loss_scale: Any = None, *,
                 dynamic: bool | None = None, initial_scale: float | None = None,
                 dynamic_growth_steps: int | None = None) -> None:
        if isinstance(inner_optimizer, LossScaleOptimizer):
            raise TypeError("LossScaleOptimizer cannot wrap another LossScaleOptimizer; wrap "
                            "its inner_optimizer instead")
        if not isinstance(inner_optimizer, Optimizer):
            raise TypeError("LossScaleOptimizer wraps an mp.optimizers.Optimizer, got "
                            f"{type(inner_optimizer).__name__}")
        scale = _scale(loss_scale, dynamic, initial_scale, dynamic_growth_steps)
        self._inner = inner_optimizer
        self._loss_scale = scale
        self.skipped_steps = 0
        #: The variables whose gradients held Inf/NaN in the last step, if it was skipped.
        self.last_nonfinite: list[str] = []
        self._flag: Tensor | None = None
        self._unscaled = False
        #: What get_unscaled_gradients returned: the flag vouches for these tensors only.
        self._unscaled_grads: list[Tensor] = []
        self._warned = False
        self.name = f"LossScaleOptimizer({inner_optimizer.name})"

    # --- TF 2.4+ / Keras 3 names ---------------------------------------------------------
    @property
    def dynamic(self) -> bool:
        """Whether the loss scale changes with the gradients (a DynamicLossScale)."""
        return isinstance(self._loss_scale, _ls.DynamicLossScale)

    @property
    def initial_scale(self) -> float:
        scale = self._loss_scale
        return scale.initial_loss_scale if isinstance(scale, _ls.DynamicLossScale) else scale()

    @property
    def dynamic_growth_steps(self) -> int | None:
        scale = self._loss_scale
        return scale.increment_period if isinstance(scale, _ls.DynamicLossScale) else None

    # --- delegation ---------------------------------------------------------------------
    # Hyperparameters live on the inner optimizer (those its CHECKS list, its own class's
    # included): set and read through the wrapper (``opt.momentum = 0.9``, ``opt.clipnorm``),
    # not shadowed on it.
    def __setattr__(self, name: str, value: Any) -> None:
        inner = self.__dict__.get("_inner")
        if inner is not None and name in inner.CHECKS:
            setattr(inner, name, value)
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("_inner")
        if inner is not None and name in inner.CHECKS:
            return getattr(inner, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def inner_optimizer(self) -> Optimizer:
        return self._inner

    @property
    def loss_scale(self) -> _ls.LossScale:
        return self._loss_scale

    @property
    def iterations(self) -> int:  # type: ignore[override]
        return self._inner.iterations

    @iterations.setter
    def iterations(self, value: int) -> None:
        self._inner.iterations = int(value)

    @property
    def learning_rate(self) -> float:  # type: ignore[override]
        return self._inner.learning_rate

    @learning_rate.setter
    def learning_rate(self, value: Any) -> None:
        self._inner.learning_rate = value

    lr = learning_rate

    def build(self, var_list: Sequence[Variable]) -> None:
        self._inner.build(var_list)

    def variables(self) -> list[Variable]:
        return self._inner.variables()

    def get_slot(self, var: Variable, name: str) -> Variable:
        return self._inner.get_slot(var, name)

    # --- loss scaling -------------------------------------------------------------------
    def get_scaled_loss(self, loss: Any) -> Any:
        """``loss`` times the current scale (a callable loss is wrapped, as TF does)."""
        if callable(loss) and not isinstance(loss, Tensor):
            return lambda: self.get_scaled_loss(loss())
        loss = ops.convert_to_tensor(loss)
        return ops.multiply(loss, self._scale_of(loss))

    @kept_whole
    def _scale_of(self, loss: Tensor) -> Tensor:
        """The current scale as a tensor of ``loss``'s dtype (exact: a power of two or the
        user's fixed scale). A tensor, not a Python number, so that a traced step reads the
        scale of its own step, in the product and in its gradient."""
        self._unscaled = False
        return ops.constant(self._loss_scale(), dtype=loss.dtype, backend=loss.backend)

    def scale_loss(self, loss: Any) -> Any:
        """Keras 3's name for :meth:`get_scaled_loss`."""
        return self.get_scaled_loss(loss)

    @kept_whole
    def get_unscaled_gradients(self, grads: Sequence[Tensor | None]) -> list[Tensor | None]:
        """``grads`` divided by the scale, in float32; None stays None. Also computes the
        "all finite" flag that ``apply_gradients`` uses (no host read here)."""
        if isinstance(grads, Tensor) or not isinstance(grads, Iterable):
            raise TypeError("get_unscaled_gradients takes the list of gradients "
                            f"(tape.gradient(scaled_loss, variables)), got {grads!r}")
        out, flag = ops.unscale_and_check(list(grads), 1.0 / self._loss_scale())
        self._flag = flag
        self._unscaled = True
        self._unscaled_grads = [g for g in out if g is not None]
        return out

    @kept_whole
    def apply_gradients(self, grads_and_vars: Iterable[tuple[Tensor | None, Variable]]) -> bool:
        """Apply the step unless a gradient is Inf/NaN; returns whether it was applied."""
        grads, variables = split_grads_and_vars(grads_and_vars)
        flag = self._flag
        if not self._unscaled or flag is None:
            if not self._warned:
                warnings.warn("LossScaleOptimizer.apply_gradients was called without "
                              "get_scaled_loss()/get_unscaled_gradients(): the gradients are "
                              "applied as given (not unscaled); only the Inf/NaN check is done",
                              UserWarning, stacklevel=_user_frames.stacklevel())
                self._warned = True
            flag = ops.all_finite(grads) if grads else None
        elif not _same_tensors(grads, self._unscaled_grads):
            # the caller changed the gradients after unscaling them (clipped, masked, summed):
            # the flag says nothing about these, so check what is applied (README: a step
            # whose gradients hold Inf or NaN never touches the weights)
            flag = ops.all_finite(grads) if grads else None
        self._flag = None
        self._unscaled = False
        self._unscaled_grads = []
        if flag is None:  # nothing to update
            self._inner.iterations += 1
            return self._result(True, None)
        # Under a distribution: the average over the ranks, each rank's gradients weighted by
        # its share first (a sum of finite values stays finite), so the MIN of the ranks'
        # flags is the average's flag; every rank then skips the same steps.
        grads = _distributed.average_gradients(grads, variables, self)
        flag = _distributed.agree_finite(flag)
        updated, flag = self._inner._apply(grads, variables, flag)
        if not updated:  # a micro-step: the loss scale moves once per real step
            return self._result(True, None)
        applied = self._loss_scale.update(flag)
        self.last_nonfinite = []
        if not applied:
            self.skipped_steps += 1
            # only on a skipped step: one host read per variable, to say where it went wrong
            self.last_nonfinite = self._inner.nonfinite_variables()
        return self._result(applied, flag)

    def _result(self, applied: bool, flag: Tensor | None) -> Any:
        """``applied``; in a traced step the device flag that says it (a Python bool would
        be the first call's at every replay)."""
        if not in_traced_step():
            return applied
        return flag if flag is not None else ops.constant(applied)

    # --- state --------------------------------------------------------------------------
    def get_state(self, var_list: Sequence[Variable]) -> dict[str, Any]:
        return {"class": "LossScaleOptimizer", "inner": self._inner.get_state(var_list),
                "loss_scale": _ls.serialize(self._loss_scale),
                "loss_scale_state": self._loss_scale.state_dict(),
                "skipped_steps": self.skipped_steps}

    def set_state(self, var_list: Sequence[Variable], state: dict[str, Any]) -> None:
        if state.get("class") != "LossScaleOptimizer":
            raise ValueError(f"optimizer state of {state.get('class')!r} cannot be loaded into "
                             "a LossScaleOptimizer")
        self._inner.set_state(var_list, state["inner"])
        self._loss_scale = _ls.deserialize(state["loss_scale"])
        self._loss_scale.load_state_dict(state["loss_scale_state"])
        self.skipped_steps = int(state["skipped_steps"])

    def get_config(self) -> dict[str, Any]:
        return {"inner_optimizer": {"class_name": type(self._inner).__name__,
                                    "config": self._inner.get_config()},
                "loss_scale": _ls.serialize(self._loss_scale)}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LossScaleOptimizer:  # type: ignore[override]
        from mpcore.optimizers import by_class_name

        inner = config["inner_optimizer"]
        return cls(by_class_name(inner["class_name"]).from_config(inner["config"]),
                   _ls.deserialize(config["loss_scale"]))

    def __repr__(self) -> str:
        return f"<mp.LossScaleOptimizer {self._inner!r} loss_scale={self._loss_scale!r}>"


def _same_tensors(given: Sequence[Tensor], unscaled: Sequence[Tensor]) -> bool:
    """Whether ``given`` are the tensors get_unscaled_gradients returned: the same objects, or
    wrappers of the same device buffers (a traced step's replay rewraps them). Identity, not
    values: comparing values would be a host read every step."""
    return len(given) == len(unscaled) and all(
        a is b or a._data is b._data for a, b in zip(given, unscaled))


def _scale(loss_scale: Any, dynamic: bool | None, initial_scale: float | None,
           growth_steps: int | None) -> _ls.LossScale:
    """The loss scale from TF 2.3's ``loss_scale`` or from TF 2.4+'s (Keras 3's) arguments."""
    keras = {"dynamic": dynamic, "initial_scale": initial_scale,
             "dynamic_growth_steps": growth_steps}
    given = [name for name, value in keras.items() if value is not None]
    if isinstance(loss_scale, bool):     # TF 2.4's second positional argument
        raise TypeError("LossScaleOptimizer's second positional argument is loss_scale (TF "
                        f"2.3); pass dynamic={loss_scale} by keyword, as TF 2.4+ and Keras 3 "
                        "name it")
    if loss_scale is not None:
        if given:
            raise ValueError(f"give loss_scale (TF 2.3) or {', '.join(given)} (TF 2.4+, "
                             "Keras 3), not both")
        return _ls.get(loss_scale, allow_none=False)  # type: ignore[return-value]
    if dynamic is not None and not isinstance(dynamic, bool):
        raise TypeError(f"dynamic must be True or False, got {dynamic!r}")
    if dynamic is False:
        if initial_scale is None:
            raise ValueError("initial_scale is required when dynamic=False (a fixed loss scale)")
        if growth_steps is not None:
            raise ValueError("dynamic_growth_steps applies to a dynamic loss scale only; it "
                             "was given with dynamic=False")
    try:
        if dynamic is False:
            return _ls.FixedLossScale(initial_scale)  # type: ignore[arg-type]
        return _ls.DynamicLossScale(
            initial_loss_scale=2.0**15 if initial_scale is None else initial_scale,
            increment_period=2000 if growth_steps is None else growth_steps)
    except (TypeError, ValueError) as exc:   # named as the caller named them
        message = str(exc)
        for ours, theirs in (("initial_loss_scale", "initial_scale"),
                             ("loss_scale_value", "initial_scale"),
                             ("increment_period", "dynamic_growth_steps")):
            message = message.replace(ours, theirs)
        raise type(exc)(message) from None
