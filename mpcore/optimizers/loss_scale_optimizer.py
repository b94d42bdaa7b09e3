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
leaves every variable and slot untouched when it is false) and then to the loss scale's update.
A step with any Inf/NaN gradient is skipped as a whole, the scale shrinks, and
``skipped_steps`` counts it; ``iterations`` counts applied steps only, as Keras 3's (whose
inner ``apply``, which counts, runs for finite gradients only; tf-keras counted every step).

A dynamic scale's state is device variables (:meth:`mpcore.DynamicLossScale.place`): the loss
is multiplied by the scale variable, the gradients by its reciprocal, and the update is a
kernel (:func:`mpcore.ops.loss_scale_update`) from the flag, skipped steps counted there. So a
traced step records all of it kernel by kernel where the inner optimizer's update is recorded
(``_recordable``), and reads nothing back to the host; where the inner update is kept whole
(a host schedule, distribution: ``kept_whole_reason``) the three calls are kept whole, and each
replay runs them on the device, reading nothing back either. Eagerly, ``apply_gradients``
returns a Python bool: that read of the flag is the eager step's one host read.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

from mpcore import ops
from mpcore.core import user_frames as _user_frames
from mpcore.core.tensor import Tensor, Variable
from mpcore.distribution import gradients as _distributed
from mpcore.mixed_precision import loss_scale as _ls
from mpcore.optimizers import Optimizer
from mpcore.optimizers.accumulation import flags
from mpcore.optimizers.gradients import VarList, same_tensors, split_grads_and_vars
from mpcore.optimizers.loss_scale_arguments import FORGOT as _FORGOT
from mpcore.optimizers.loss_scale_arguments import scale_from_arguments as _scale
from mpcore.tracing.function import in_traced_step, kept_whole, on_replay, recording_kernels

#: The LossScaleOptimizer wrapping each optimizer (weakly: an optimizer whose wrapper is gone
#: may be wrapped again). tf-keras refuses a second wrapper: both would scale and step the one
#: optimizer, and a checkpoint could not tell their states apart.
_WRAPPERS: weakref.WeakKeyDictionary[Optimizer, weakref.ref[LossScaleOptimizer]] = (
    weakref.WeakKeyDictionary())

class LossScaleOptimizer(Optimizer):
    """Wraps ``inner_optimizer`` with ``loss_scale``: "dynamic" (the default), a number (a
    fixed scale) or a :class:`~mpcore.LossScale` (TF 2.3's argument). Or, as TF 2.4+ and
    Keras 3 spell it: ``dynamic`` (default True), ``initial_scale`` (default 2**15 when
    dynamic; required when not) and ``dynamic_growth_steps`` (default 2000), by keyword."""

    #: What a step's calls hand each other (get_scaled_loss -> get_unscaled_gradients ->
    #: apply_gradients, reset by the last): written and read within one step, so a recorded
    #: step's replays need none of it (mpcore.tracing.python_state).
    _trace_ignored_attributes = ("_flag", "_unscaled", "_scaled", "_unscaled_grads", "_warned")
    _trace_set_once_attributes = ("_skipped_var",)

    def __init__(self, inner_optimizer: Optimizer, loss_scale: Any = None, *,
                 dynamic: bool | None = None, initial_scale: float | None = None,
                 dynamic_growth_steps: int | None = None, name: str | None = None) -> None:
        if isinstance(inner_optimizer, LossScaleOptimizer):
            raise TypeError("LossScaleOptimizer cannot wrap another LossScaleOptimizer, but "
                            f"got: {inner_optimizer!r}; wrap its inner_optimizer instead")
        if not isinstance(inner_optimizer, Optimizer):
            raise TypeError('"inner_optimizer" must be an instance of '
                            f"mp.optimizers.Optimizer, but got: {inner_optimizer!r}")
        if name is not None and not isinstance(name, str):
            raise ValueError(f"name must be a string or None, got {name!r}")
        scale = _scale(loss_scale, dynamic, initial_scale, dynamic_growth_steps)
        wrapper = _WRAPPERS.get(inner_optimizer)
        if wrapper is not None and wrapper() is not None:
            raise ValueError('"inner_optimizer" is already wrapped by a LossScaleOptimizer. An '
                             "optimizer can only be wrapped by a single LossScaleOptimizer")
        _WRAPPERS[inner_optimizer] = weakref.ref(self)
        self._inner = inner_optimizer
        self._loss_scale = scale
        #: A fixed scale's skipped steps: a Python count, then an int64 device variable
        #: (a dynamic scale counts them among its own counters).
        self._skipped_count = 0
        self._skipped_var: Variable | None = None
        # the scale's state on the device now (the current backend; a step on another moves
        # it), so that no traced step has to make variables
        if isinstance(scale, _ls.DynamicLossScale) and _built_in_rule(scale):
            scale.place(scale.variables[0].backend if scale.variables else _current_backend())
        elif _built_in_rule(scale):
            self._skipped_var = Variable(ops.constant(0, "int64"), dtype="int64",
                                         trainable=False, name="skipped_steps")
        self._flag: Tensor | None = None
        self._unscaled = False
        self._scaled = False     # get_scaled_loss called since the last apply_gradients
        #: What get_unscaled_gradients returned: the flag vouches for these tensors only.
        self._unscaled_grads: list[Tensor] = []
        self._warned = False
        self.name = name or f"LossScaleOptimizer({inner_optimizer.name})"

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

    @property
    def dynamic_counter(self) -> int | None:
        """The finite steps since the scale last changed (tf-keras' name for
        ``num_good_steps``); None for a fixed scale."""
        scale = self._loss_scale
        return scale.num_good_steps if isinstance(scale, _ls.DynamicLossScale) else None

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
    def iterations_variable(self) -> Variable | None:  # type: ignore[override]
        return self._inner.iterations_variable

    @property
    def skipped_steps(self) -> int:
        """The steps skipped for Inf/NaN gradients (a host read of a device counter)."""
        scale = self._loss_scale
        if isinstance(scale, _ls.DynamicLossScale) and _built_in_rule(scale):
            return scale.skipped_steps
        return self._skipped_count if self._skipped_var is None else int(self._skipped_var)

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        scale = self._loss_scale
        if isinstance(scale, _ls.DynamicLossScale) and _built_in_rule(scale):
            scale.skipped_steps = int(value)
        elif self._skipped_var is None:
            self._skipped_count = int(value)
        else:
            self._skipped_var.assign(ops.constant(int(value), "int64",
                                                  backend=self._skipped_var.backend))

    @property
    def last_nonfinite(self) -> list[str]:
        """The variables whose gradients held Inf/NaN in the last step, if it was skipped
        (found when asked: a host read of the flag, and one per variable for a skipped
        step)."""
        flag = self._inner.last_flag
        if flag is None or bool(flag):
            return []
        return self._inner.nonfinite_variables()

    @property
    def dynamic_scale(self) -> Tensor:
        """Keras 3's variable: a dynamic scale's current value on the device (placed on the
        current backend if no step has placed it), a fixed scale's as a constant. A tensor:
        a traced step may compute with it; ``float()`` of it is a host read."""
        scale = self._loss_scale
        if isinstance(scale, _ls.DynamicLossScale):
            variables = scale.variables
            return variables[0] if variables else scale.place(_current_backend())[0]
        return ops.constant(scale(), "float32")

    def check_loss_scale(self) -> None:
        """Read the dynamic scale's counters (one host read): the warning that the scale is
        stuck at its floor, for traced steps, which read nothing back (fit calls this at the
        end of each epoch)."""
        if isinstance(self._loss_scale, _ls.DynamicLossScale) and self._loss_scale.variables:
            self._loss_scale.num_good_steps  # noqa: B018 - the read warns

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
    def _recordable(self) -> tuple[Any, ...] | None:
        """Whether a traced step records the loss scaling kernel by kernel: where the inner
        optimizer's update is recorded (its guard), and for this loss scale (another one, a
        checkpoint's, traces again: its variables and settings are the program's)."""
        inner = self._inner._recordable()
        if inner is None or not _built_in_rule(self._loss_scale):
            return None
        return (inner, id(self._loss_scale))

    def kept_whole_reason(self) -> str | None:
        """Why the loss scaling and update are kept whole (the inner optimizer's reason, or
        a user's own loss scale rule)."""
        if not _built_in_rule(self._loss_scale):
            return "a user's own LossScale.update: called with the flag (a host read)"
        return self._inner.kept_whole_reason()

    def get_scaled_loss(self, loss: Any) -> Any:
        """``loss`` times the current scale (a callable loss is wrapped, as TF does)."""
        if callable(loss) and not isinstance(loss, Tensor):
            self._scaled = True
            return lambda: self.get_scaled_loss(loss())
        loss = ops.convert_to_tensor(loss)
        return ops.multiply(loss, self._scale_of(loss))

    @kept_whole(unless="_recordable")
    def _scale_of(self, loss: Tensor) -> Tensor:
        """The current scale as a tensor of ``loss``'s dtype (exact: a power of two or the
        user's fixed scale): a dynamic scale's variable (cast on the device), so that a
        traced step reads the scale of its own step, in the product and in its gradient."""
        self._unscaled, self._scaled = False, True
        scale = self._loss_scale
        if isinstance(scale, _ls.DynamicLossScale):
            variable = scale.place(loss.backend)[0]
            return variable if loss.dtype == "float32" else ops.cast(variable, loss.dtype)
        return ops.constant(scale(), dtype=loss.dtype, backend=loss.backend)

    def scale_loss(self, loss: Any) -> Any:
        """Keras 3's name for :meth:`get_scaled_loss`."""
        return self.get_scaled_loss(loss)

    @kept_whole(unless="_recordable")
    def get_unscaled_gradients(self, grads: Sequence[Tensor | None]) -> list[Tensor | None]:
        """``grads`` divided by the scale, in float32; None stays None. Also computes the
        "all finite" flag that ``apply_gradients`` uses (no host read here)."""
        if isinstance(grads, Tensor) or not isinstance(grads, Iterable):
            raise TypeError("get_unscaled_gradients takes the list of gradients "
                            f"(tape.gradient(scaled_loss, variables)), got {grads!r}")
        grads = list(grads)
        scale = self._loss_scale
        present = [g for g in grads if g is not None]
        if isinstance(scale, _ls.DynamicLossScale) and present:
            inv: Any = scale.place(present[0].backend)[1]     # read on the device
        else:
            inv = 1.0 / scale()
        out, flag = ops.unscale_and_check(grads, inv)
        self._flag = flag
        self._unscaled = True
        self._unscaled_grads = [g for g in out if g is not None]
        return out

    def compute_gradients(self, loss: Any, var_list: VarList, tape: Any = None
                          ) -> list[tuple[Tensor | None, Variable]]:
        """tf-keras': the (gradient, variable) pairs of ``loss`` scaled, unscaled by
        :meth:`get_unscaled_gradients` (so ``minimize`` scales, and float16 gradients do not
        underflow). A tensor ``loss`` is scaled on ``tape``, which computed it."""
        from mpcore.core.tape import GradientTape

        if (isinstance(loss, Tensor) or not callable(loss)) and tape is None:
            # (a fresh tape would record the scaling only: every gradient None)
            raise ValueError("`tape` is required when a `Tensor` loss is passed. "
                             f"Received: loss={loss}, tape={tape}.")
        tape = GradientTape() if tape is None else tape
        with tape:
            loss = self.get_scaled_loss(loss)
        pairs = self._inner.compute_gradients(loss, var_list, tape)
        grads = self.get_unscaled_gradients([g for g, _ in pairs])
        return list(zip(grads, [v for _, v in pairs]))

    def apply(self, grads: Sequence[Tensor | None],
              trainable_variables: Sequence[Variable] | None = None) -> Any:
        """Keras 3's ``apply``: ``grads`` of the scaled loss (``scale_loss``) are unscaled
        here, then applied unless one is Inf/NaN (Keras 3's LossScaleOptimizer unscales in
        ``apply``; tf-keras' ``apply_gradients`` takes unscaled gradients)."""
        if trainable_variables is None:
            trainable_variables = getattr(self._inner, "_built_variables", None)
        if trainable_variables is None:
            raise ValueError("apply(grads) needs trainable_variables the first time")
        self._inner._keep_built_variables(list(trainable_variables))
        return self.apply_gradients(zip(self.get_unscaled_gradients(list(grads)),
                                        trainable_variables))

    @kept_whole(unless="_recordable")
    def apply_gradients(self, grads_and_vars: Iterable[tuple[Tensor | None, Variable]]) -> bool:
        """Apply the step unless a gradient is Inf/NaN; returns whether it was applied."""
        grads, variables = split_grads_and_vars(grads_and_vars)
        flag = self._flag
        forgot = (self._scaled, self._unscaled and flag is not None)
        if forgot != (True, True) and not self._warned:
            # once per optimizer (tf-keras logs at every call): a loop would repeat it
            warnings.warn(_FORGOT[forgot], UserWarning, stacklevel=_user_frames.stacklevel())
            self._warned = True
        if not self._unscaled or flag is None:
            flag = ops.all_finite(grads) if grads else None
        elif not same_tensors(grads, self._unscaled_grads):
            # the caller changed the gradients after unscaling them (clipped, masked, summed):
            # the flag says nothing about these, so check what is applied (README: a step
            # whose gradients hold Inf or NaN never touches the weights)
            flag = ops.all_finite(grads) if grads else None
        self._flag = None
        self._unscaled = self._scaled = False
        self._unscaled_grads = []
        if flag is None:  # nothing to update
            self._inner._count_step()
            return self._result(True, None)
        # Under a distribution: the average over the ranks, each rank's gradients weighted by
        # its share first (a sum of finite values stays finite), so the MIN of the ranks'
        # flags is the average's flag; every rank then skips the same steps.
        grads = _distributed.average_gradients(grads, variables, self)
        flag = _distributed.agree_finite(flag)
        before = self._inner._host_count()
        updated, flag = self._inner._apply(grads, variables, flag, count_skipped=False)
        if updated is False:  # a micro-step: the loss scale moves once per real step
            return self._result(True, None)
        if not _built_in_rule(self._loss_scale):   # a user's LossScale: its update, on the host
            applied = self._loss_scale.update(flag)
            self._skipped_count += not applied
            self._inner.last_flag = flag
            return self._result(applied, flag)
        assert flag is not None
        self._update_scale(flag, updated)
        inner = self._inner
        inner.last_flag = flag
        if recording_kernels():       # each replay: its gradients and flag, the casts dropped
            on_replay(inner.finish_recorded_update, flag, inner.last_gradients,
                      inner.last_variables)
        if in_traced_step():          # (a micro-step, updated false on the device: not skipped)
            return flag if updated is True else flags(
                ops.logical_or, flags(ops.logical_not, updated), flag)
        applied = bool(flag)          # eager: the step's one host read
        if before is not None and updated is True:    # the count, without a second read
            inner._settle_count(before + applied)
        if not applied:
            self.check_loss_scale()
        return applied

    def _update_scale(self, flag: Tensor, updated: bool | Tensor = True) -> None:
        """The loss scale's update and the skipped-step count, on the device; where
        ``updated`` is a device flag (a traced step's gradient accumulation), only where it
        holds: once per real step."""
        scale = self._loss_scale
        if isinstance(scale, _ls.DynamicLossScale):
            if updated is True:
                scale.update_on_device(flag)
                return
            state = scale.place(flag.backend)
            old = [ops.multiply(v.current_value(), 1) for v in state]   # copies
            scale.update_on_device(flag)
            for v, before in zip(state, old):
                v.assign(ops.where(updated, v.current_value(), before))
            return
        counter = self._skipped_var
        if counter is None or counter.backend is not flag.backend:
            counter = self._skipped_var = Variable(
                ops.constant(self.skipped_steps, "int64", backend=flag.backend),
                dtype="int64", trainable=False, name=f"{self.name}/skipped_steps")
        skipped = flags(ops.logical_not, flag)
        if updated is not True:
            skipped = flags(ops.logical_and, updated, skipped)
        counter.assign(ops.add(counter.current_value(), ops.cast(skipped, "int64")))

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
        """Restore a LossScaleOptimizer's state, or a plain optimizer's into the inner one
        (a float32 run continued under mixed_float16: the loss scale starts afresh, as it
        would in tf-keras, where the checkpoint holds no loss scale)."""
        if state.get("class") != "LossScaleOptimizer":
            self._inner.set_state(var_list, state)
            return
        self._inner.set_state(var_list, state["inner"])
        saved = _ls.deserialize(state["loss_scale"])
        if saved != _ls.deserialize(_ls.serialize(self._loss_scale)):
            self._loss_scale = saved   # another kind or setting of scale: the checkpoint's
        # else into the instance itself: it may be a policy's (see for_policy)
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


def _current_backend() -> Any:
    from mpcore.plugins.registry import get_backend

    return get_backend()


def _built_in_rule(scale: _ls.LossScale) -> bool:
    """Whether ``scale`` updates by mpcore's rule (on the device, or fixed), not a subclass's
    own ``update`` (called with the flag: a host read at every step)."""
    return type(scale).update in (_ls.DynamicLossScale.update, _ls.FixedLossScale.update)


#: The dynamic loss scales of policies that a compile has trained (by id, dropped with them).
_TRAINED: weakref.WeakValueDictionary[int, _ls.LossScale] = weakref.WeakValueDictionary()


def for_policy(optimizer: Optimizer, policy: Any) -> Optimizer:
    """What ``Model.compile`` trains with under ``policy``: ``optimizer``, wrapped in a
    LossScaleOptimizer where the policy has a loss scale: mixed_float16's default dynamic one,
    or one given to any policy (``Policy("mixed_bfloat16", loss_scale="dynamic")``; TF 2.3's
    compile honoured it for every policy). An optimizer that already has a wrapper gets that
    wrapper back (compiling again with the same optimizer), as tf-keras refuses a second one.

    Which LossScale the wrapper gets (the decision of issue 33):

    - the default one (``Policy("mixed_float16")``): a fresh copy for each compile. The
      global policy is one value shared by every model of the process; its scale trained by
      one model would start the next model's training at that model's scale (or not, as the
      garbage collector decides). ``policy.loss_scale`` stays the configuration; the trained
      scale is ``model.optimizer.loss_scale``, as in TF 2.4+ and Keras 3.
    - one given to the policy: a fixed scale is used as it is (it has no state); a dynamic
      one is the policy's own instance for the first compile that uses it, so
      ``policy.loss_scale`` follows that model's training, as in TF 2.3, and a fresh copy for
      any later compile (another model, or a new optimizer), so that two models never share,
      and the later ones start from the configuration whatever the first one did.
    """
    scale = policy.loss_scale
    if scale is None or isinstance(optimizer, LossScaleOptimizer):
        return optimizer
    wrapper = _WRAPPERS.get(optimizer)
    existing = None if wrapper is None else wrapper()
    if existing is not None:
        return existing
    if not policy.loss_scale_is_default and isinstance(scale, _ls.FixedLossScale):
        return LossScaleOptimizer(optimizer, scale)
    if not policy.loss_scale_is_default and id(scale) not in _TRAINED:
        _TRAINED[id(scale)] = scale
        return LossScaleOptimizer(optimizer, scale)
    return LossScaleOptimizer(optimizer, _ls.deserialize(_ls.serialize(scale)))
