"""The base class of the optimizers, Keras' ``Optimizer``: hyperparameters (a learning rate
that may be a schedule), slots per variable, the step count, clipping and gradient
accumulation, and the update gated by the device's "all finite" flag (see the package's
docstring); the concrete optimizers are in :mod:`mpcore.optimizers`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from mpcore import ops
from mpcore.core import arguments as _args
from mpcore.core.tensor import Tensor, Variable
from mpcore.distribution import api as _distribution
from mpcore.distribution import gradients as _distributed
from mpcore.optimizers import clipping as _clipping
from mpcore.optimizers import device_schedules, schedules
from mpcore.optimizers.accumulation import Accumulation
from mpcore.optimizers.gradients import VarList, compute_gradients, split_grads_and_vars
from mpcore.optimizers.hyperparameters import Hyperparameters
from mpcore.optimizers.step_count import StepCount
from mpcore.tracing.function import kept_whole, on_replay, recording_kernels, value_key

LearningRate = float | Callable[[int], float]

_RATE_RULE = "a finite number >= 0"


def _check_learning_rate(value: Any) -> LearningRate:
    if callable(value):
        return value
    try:
        return _args.number("learning_rate", value, 0.0)
    except ValueError:
        raise ValueError(f"learning_rate must be {_RATE_RULE} or a callable schedule(step) -> "
                         f"float, got {value!r}") from None


class Optimizer(Accumulation, StepCount, Hyperparameters):
    """Base class. Subclasses name their ``slots`` and implement ``_update_variable`` with
    their update op (:mod:`mpcore.ops.optim`)."""

    #: The attributes a recorded update holds as constants (its guard compares their values),
    #: or () where updates are not recorded: a traced step then calls ``apply_gradients``
    #: whole at each replay. Set by the class itself, not inherited: a subclass may compute
    #: its rate or step size in Python at each step (see :meth:`_recordable`).
    _recorded_hyperparameters: tuple[str, ...] = ()
    #: How many settings of the hyperparameters a recorded update is traced for; beyond, it is
    #: kept whole (a rate changed at every step, a warm-up set by a callback, retraces no more).
    _MAX_RECORDED_SETTINGS = 4
    #: ``apply`` keeps its variables for a later ``apply(grads)``, rebinding them only to other
    #: variables (:meth:`_keep_built_variables`): set by the first call, a traced step's replay
    #: leaves them as eager execution would; another traced step's other variables are a
    #: change a replay would not make, refused (mpcore.tracing.python_state).
    _trace_set_once_attributes = ("_built_variables", "_iterations_var", "_micro_var")
    #: The host's copy of ``iterations`` (None: unknown, read from the device when asked): a
    #: recorded update drops it, as each replay does (mpcore.tracing.python_state).
    _trace_ignored_attributes = ("_iterations_known", "_iterations_version", "_micro_known",
                                 "_micro_version")
    #: Whether ``_update_variable`` uses ``step`` (iterations + 1, a host value): the built-in
    #: optimizers do not (Adam reads ``iterations_variable`` on the device), so their steps
    #: never read the count back.
    _uses_step = True

    def __init__(self, learning_rate: LearningRate = 0.001, name: str | None = None, *,
                 clipnorm: float | None = None, clipvalue: float | None = None,
                 global_clipnorm: float | None = None,
                 gradient_accumulation_steps: int | None = None, **keras_options: Any) -> None:
        _check_keras_options(self, keras_options)
        self._learning_rate: LearningRate = _check_learning_rate(learning_rate)
        #: (option, threshold) of the gradient clipping (:mod:`mpcore.optimizers.clipping`), or
        #: None.
        self.clipping = _clipping.check(clipnorm, clipvalue, global_clipnorm)
        #: Update every this many calls, with the mean of their gradients (None or 1: every
        #: call). ``iterations`` counts the updates, so N micro-batches of B train as one batch
        #: of N*B (Keras 3 counts the calls; its Adam and schedules then see micro-steps).
        self.gradient_accumulation_steps = (
            None if gradient_accumulation_steps is None
            else _args.integer("gradient_accumulation_steps", gradient_accumulation_steps, 1))
        self._accumulators: dict[int, Variable] = {}
        self._micro_steps = 0
        #: The gradients of the last update, unclipped (a LossScaleOptimizer names the
        #: variables whose gradients were not finite from them).
        self.last_gradients: list[Tensor] = []
        self.last_variables: list[Variable] = []
        self.last_flag: Tensor | None = None
        if name is not None and not isinstance(name, str):
            raise ValueError(f"name must be a string or None, got {name!r}")
        self.name = name or type(self).__name__
        # the step count, made here on the current backend (mpcore.optimizers.step_count)
        self._iterations_known: int | None = 0
        self._iterations_version = -1
        self._iterations_var: Variable | None = None
        self._iterations_var = self._new_iterations_variable(None)
        #: Use the backend's fused update kernel when it has one (False forces the op path).
        self.use_fused_kernels = True
        self._slots: dict[int, dict[str, Variable]] = {}
        self._var_list: list[Variable] = []

    # --- hyperparameters ---------------------------------------------------------------
    @property
    def learning_rate(self) -> float:
        """The learning rate of the next step (a schedule is evaluated at ``iterations``)."""
        lr = self._learning_rate
        if not callable(lr):
            return lr
        rate = lr(self.iterations)
        try:
            return _args.number("learning_rate", rate, 0.0)
        except ValueError:
            raise ValueError(f"the learning_rate schedule {lr!r} returned {rate!r} at step "
                             f"{self.iterations}; it must return {_RATE_RULE}") from None

    @learning_rate.setter
    def learning_rate(self, value: LearningRate) -> None:
        value = _check_learning_rate(value)
        if (isinstance(self.__dict__.get("_learning_rate"), schedules.LearningRateSchedule)
                and not callable(value)):
            # Keras 3's rule: a number set over a schedule would silently end the schedule
            raise TypeError("This optimizer was created with a `LearningRateSchedule` object "
                            "as its `learning_rate` constructor argument, hence its learning "
                            "rate is not settable. If you need the learning rate to be "
                            "settable, you should instantiate the optimizer with a float "
                            "`learning_rate` argument.")
        self._learning_rate = value

    lr = learning_rate

    def slot_names(self) -> tuple[str, ...]:
        return ()

    # --- state --------------------------------------------------------------------------
    def build(self, var_list: Sequence[Variable]) -> None:
        """Create the slots of every variable not seen yet (zeros, in the variable's dtype),
        and the step count's variable on the first one's backend."""
        if var_list and (self._iterations_var is None
                         or self._iterations_var.backend is not var_list[0].backend):
            self._iterations_var = self._new_iterations_variable(var_list[0].backend)
        if var_list and (self.gradient_accumulation_steps or 1) > 1:
            self._micro_variable(var_list[0].backend)
        for var in var_list:
            if id(var) in self._slots:
                continue
            self._slots[id(var)] = {
                name: Variable(ops.zeros(var.shape, var.dtype, var.backend), dtype=var.dtype,
                               trainable=False, name=f"{var.name}/{name}")
                for name in self.slot_names()}
            self._var_list.append(var)

    def get_slot(self, var: Variable, name: str) -> Variable:
        try:
            return self._slots[id(var)][name]
        except KeyError:
            raise KeyError(f"no slot {name!r} for variable {var.name!r}; slots: "
                           f"{', '.join(self.slot_names()) or 'none'}") from None

    def variables(self) -> list[Variable]:
        return [slot for var in self._var_list for slot in self._slots[id(var)].values()]

    def __getstate__(self) -> dict[str, Any]:
        # the last step's gradients and flag are device tensors, read only within that step
        return {**self.__dict__, "last_gradients": [], "last_flag": None}

    def get_state(self, var_list: Sequence[Variable]) -> dict[str, Any]:
        """Host copies of ``iterations``, of the slots of ``var_list`` (in that order) that the
        update uses, and the hyperparameters (a rate or a momentum changed during training
        resumes as it was; a schedule stays the caller's)."""
        self.build(var_list)
        active = self.slot_names()
        slots = []
        for var in var_list:
            slots.append({name: slot.numpy() for name, slot in self._slots[id(var)].items()
                          if name in active})
        hyper = {name: self.__dict__[name] for name in self.CHECKS
                 if name in self.__dict__ and name != "gradient_accumulation_steps"}
        if not callable(self._learning_rate):
            hyper["learning_rate"] = self._learning_rate
        state = {"class": type(self).__name__, "iterations": self.iterations, "slots": slots,
                 "hyperparameters": hyper}
        if (self.gradient_accumulation_steps or 1) > 1:
            state["gradient_accumulation_steps"] = self.gradient_accumulation_steps
            state["micro_steps"] = self._micro_steps
            state["accumulators"] = [
                None if id(v) not in self._accumulators else self._accumulators[id(v)].numpy()
                for v in var_list]
        return state

    def set_state(self, var_list: Sequence[Variable], state: dict[str, Any]) -> None:
        if state.get("class") == "LossScaleOptimizer":   # a mixed run continued unscaled:
            state = state["inner"]                        # its optimizer's state, not the scale
        if state.get("class") != type(self).__name__:
            raise ValueError(f"optimizer state of {state.get('class')!r} cannot be loaded into "
                             f"{type(self).__name__}")
        if len(state["slots"]) != len(var_list):
            raise ValueError(f"optimizer state has slots for {len(state['slots'])} variables, "
                             f"the model has {len(var_list)}")
        micro_steps = int(state.get("micro_steps", 0))
        saved_steps = state.get("gradient_accumulation_steps") or 1
        if micro_steps and saved_steps != (self.gradient_accumulation_steps or 1):
            # the accumulated gradients are a partial sum over saved_steps micro-steps: resuming
            # them with another count would average the wrong number of batches
            raise ValueError(
                f"optimizer state was saved after micro-step {micro_steps} of "
                f"gradient_accumulation_steps={saved_steps}; this {type(self).__name__} has "
                f"gradient_accumulation_steps={self.gradient_accumulation_steps}: create it "
                f"with gradient_accumulation_steps={saved_steps} to resume exactly")
        for name, value in state.get("hyperparameters", {}).items():
            if name != "learning_rate":
                setattr(self, name, value)         # checked, as any setting is
            elif not callable(self._learning_rate):
                self.learning_rate = value
        self.build(var_list)
        active = set(self.slot_names())
        for var, entry in zip(var_list, state["slots"]):
            slots = self._slots[id(var)]
            if set(entry) != active:
                raise ValueError(f"slots {sorted(entry)} do not match {sorted(active)} for "
                                 f"variable {var.name!r}")
            for name, value in entry.items():
                slots[name].assign(value)
        self.iterations = int(state["iterations"])
        self._micro_steps = micro_steps
        for var, value in zip(var_list, state.get("accumulators") or []):
            if value is not None:
                self._accumulator(var).assign(value)

    def get_config(self) -> dict[str, Any]:
        lr: Any = self._learning_rate
        if isinstance(lr, schedules.LearningRateSchedule):
            lr = schedules.serialize(lr)    # as Keras 3 writes it: a dict, not the object
        config: dict[str, Any] = {"name": self.name, "learning_rate": lr}
        if self.clipping is not None:
            config[self.clipping[0]] = self.clipping[1]
        if self.gradient_accumulation_steps is not None:
            config["gradient_accumulation_steps"] = self.gradient_accumulation_steps
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: dict[str, Any] | None = None
                    ) -> Optimizer:
        lr = config.get("learning_rate")
        if isinstance(lr, dict):   # a serialized schedule (get_config's)
            config = {**config, "learning_rate": schedules.deserialize(lr, custom_objects)}
        return cls(**config)

    # --- updates ------------------------------------------------------------------------
    def _recordable(self) -> tuple[Any, ...] | None:
        """While tracing: whether the step may record this update kernel by kernel, and then
        the hyperparameters it records (their values: the guard of the trace, so that another
        setting retraces); None keeps the call whole, replayed eagerly
        (:meth:`kept_whole_reason` says why). Recorded: the built-in SGD, RMSprop, Adam and
        AdamW (a subclass opts in by naming ``_recorded_hyperparameters`` itself) with a
        constant learning rate or a schedule evaluated on the device
        (:mod:`mpcore.optimizers.device_schedules`), clipped or not (clipping is ops on the
        device), accumulating or not (:mod:`mpcore.optimizers.accumulation`), no
        distribution, and at most
        :data:`_MAX_RECORDED_SETTINGS` settings seen."""
        names = type(self).__dict__.get("_recorded_hyperparameters")
        if (not names or (callable(self._learning_rate) and not self._device_schedule())
                or _distribution.distribution() is not None):
            return None
        setting = (*(self._guard_value(name) for name in names), self.clipping)
        seen = self.__dict__.setdefault("_recorded_settings", set())
        if setting not in seen:
            if len(seen) >= self._MAX_RECORDED_SETTINGS:
                return None
            seen.add(setting)
        return setting

    def _guard_value(self, name: str) -> Any:
        value = getattr(self, name)
        if callable(value):   # a schedule evaluated on the device: its settings are constants
            return (type(value), repr(value.get_config()))
        return value_key(value)   # (-0.0 is not 0.0)

    def kept_whole_reason(self) -> str | None:
        """Why a traced step keeps :meth:`apply_gradients` whole: ``print(fn.graph)`` shows it."""
        if not type(self).__dict__.get("_recorded_hyperparameters"):
            return (f"{type(self).__name__} names no _recorded_hyperparameters: its update may "
                    "compute in Python at each step")
        if callable(self._learning_rate) and not self._device_schedule():
            var = self._iterations_var
            return device_schedules.why_not(self._learning_rate,
                                            None if var is None else var.backend)
        if _distribution.distribution() is not None:
            return "distribution: the averaging and the agreed flag are host collectives"
        if len(self.__dict__.get("_recorded_settings", ())) >= self._MAX_RECORDED_SETTINGS:
            return (f"more than {self._MAX_RECORDED_SETTINGS} settings of the hyperparameters "
                    "traced")
        return None

    def _device_schedule(self) -> bool:
        """Whether the rate is a schedule computed on the device (eagerly too: replays agree)."""
        lr, var = self._learning_rate, self._iterations_var
        return (callable(lr) and var is not None
                and device_schedules.why_not(lr, var.backend) is None)

    def finish_recorded_update(self, flag: Tensor | None, grads: list[Tensor],
                               variables: list[Variable]) -> None:
        """What a recorded update does besides its kernels, at each replay: the step count,
        the last gradients and flag, and the cached casts of what its kernels updated in place
        dropped."""
        self.last_gradients, self.last_variables, self.last_flag = grads, variables, flag
        self._iterations_known = None      # counted on the device by the replay's kernel
        self._micro_known = None
        for var in variables:
            var.mark_updated()
            for slot in self._slots[id(var)].values():
                slot.mark_updated()

    @kept_whole(unless="_recordable")
    def apply_gradients(self, grads_and_vars: Iterable[tuple[Tensor | None, Variable]]
                        ) -> bool | Tensor:
        """Apply one step; variables whose gradient is None are left alone.

        A step whose gradients hold Inf or NaN leaves every variable and slot untouched (the
        project's rule, stricter than Keras, which would write NaN into the weights): the
        "all finite" flag is computed on the device and gates the update there, with no host
        read. Returns that flag (truthy when the step was applied; reading it is the host
        read), or True when there was nothing to check."""
        grads, variables = split_grads_and_vars(grads_and_vars)
        # under a distribution: averaged over the ranks, then checked, then agreed on
        grads = _distributed.average_gradients(grads, variables, self)
        flag = _distributed.agree_finite(ops.all_finite(grads)) if grads else None
        updated, used = self._apply(grads, variables, flag)
        #: The device flag that gated the last update (None: nothing to check, or a
        #: micro-step of an accumulation); LossScaleMonitor reads it.
        self.last_flag = used if updated is not False else None
        if recording_kernels():          # the update's kernels were recorded: the rest too
            on_replay(self.finish_recorded_update, self.last_flag, self.last_gradients,
                      self.last_variables)
        return True if flag is None else flag

    def _keep_built_variables(self, variables: list[Variable]) -> None:
        """Keep ``apply``'s variables for a later ``apply(grads)``. The same ones again are
        left as they are: a traced step's replay runs no Python, and a trace that changed
        Python state would be refused (mpcore.tracing.python_state)."""
        kept = getattr(self, "_built_variables", None)
        if kept is None or len(kept) != len(variables) or any(
                a is not b for a, b in zip(kept, variables)):
            self._built_variables = variables

    def apply(self, grads: Sequence[Tensor | None],
              trainable_variables: Sequence[Variable] | None = None) -> bool | Tensor:
        """Keras 3's ``optimizer.apply(grads, trainable_variables)``: :meth:`apply_gradients`
        of the pairs (the variables the optimizer was built with when none are given)."""
        if trainable_variables is None:
            trainable_variables = getattr(self, "_built_variables", None)
            if trainable_variables is None:
                raise ValueError("apply(grads) needs trainable_variables the first time (the "
                                 "optimizer has not been built with any)")
        grads, trainable_variables = list(grads), list(trainable_variables)
        if len(grads) != len(trainable_variables):
            raise ValueError(f"apply: {len(grads)} gradients for {len(trainable_variables)} "
                             "variables")
        self._keep_built_variables(trainable_variables)
        return self.apply_gradients(zip(grads, trainable_variables))

    def compute_gradients(self, loss: Any, var_list: VarList, tape: Any = None
                          ) -> list[tuple[Tensor | None, Variable]]:
        """tf-keras' (gradient, variable) pairs of ``loss``: a callable, or a tensor computed
        under ``tape`` (:func:`mpcore.optimizers.gradients.compute_gradients`)."""
        return compute_gradients(loss, var_list, tape)

    def minimize(self, loss: Any, var_list: VarList, tape: Any = None) -> bool | Tensor:
        """``apply_gradients(compute_gradients(loss, var_list, tape))``, as tf-keras: a
        LossScaleOptimizer's ``compute_gradients`` scales the loss and unscales the
        gradients."""
        return self.apply_gradients(self.compute_gradients(loss, var_list, tape))

    def _apply(self, grads: Sequence[Tensor], variables: Sequence[Variable],
               flag: Tensor | None, count_skipped: bool = True
               ) -> tuple[bool | Tensor, Tensor | None]:
        """Update the variables (where ``flag`` allows); returns whether this call was an
        update (not a micro-step that only accumulated: a bool, or a device flag where the
        host does not know, :mod:`mpcore.optimizers.accumulation`) and the flag that gated
        it. ``count_skipped=False``: a step the flag skips is not counted in ``iterations``
        (a LossScaleOptimizer's, as Keras 3's, which never applies its inner optimizer
        then)."""
        self.build(variables)
        cast = []
        for grad, var in zip(grads, variables):
            if grad.shape != var.shape:
                raise ValueError(f"gradient of shape {grad.shape} for variable {var.name!r} of "
                                 f"shape {var.shape}")
            cast.append(grad if grad.dtype == var.dtype else ops.cast(grad, var.dtype))
        updated: bool | Tensor = True
        if (self.gradient_accumulation_steps or 1) > 1:
            cast, flag, variables, updated = self._accumulate(cast, list(variables))
        self.last_gradients, self.last_variables = cast, list(variables)
        count = self._iterations_var
        rate = (device_schedules.device_rate(self._learning_rate, count)
                if count is not None and self._device_schedule() else self.learning_rate)
        lr = self._step_rates(rate)
        step = self.iterations + 1 if self._uses_step else 0
        for grad, var in zip(_clipping.clip(cast, self.clipping), variables):
            self._update_variable(var, grad, self._slots[id(var)], lr, step, flag)
        gated = not count_skipped and flag is not None and updated is not False
        self._count_step(flag if gated else updated)   # (accumulation: flag has last in it)
        return updated, flag

    def nonfinite_variables(self) -> list[str]:
        """The variables whose gradients in the last update held Inf or NaN (one host read
        per variable: for explaining a skipped step, not for every step)."""
        return [v.name for v, g in zip(self.last_variables, self.last_gradients)
                if not bool(ops.all_finite([g]))]

    def _step_rates(self, learning_rate: Any) -> Any:
        """What ``_update_variable`` gets as ``lr``: the learning rate (a schedule's device
        rate rounded once to a float32 device scalar, as the kernels round a number), or what
        a subclass computes from it once per step (Adam: its step size on the device)."""
        if isinstance(learning_rate, Tensor):
            return ops.reshape(ops.cast(learning_rate, "float32"), ())
        return learning_rate

    def _update_variable(self, var: Variable, grad: Tensor, slots: dict[str, Variable],
                         lr: float, step: int, flag: Tensor | None) -> None:
        """Update ``var`` and its ``slots`` in place with this optimizer's update op."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<mp.optimizers.{type(self).__name__} learning_rate={self._learning_rate!r}>"


#: Keras 3 optimizer arguments mpcore does not implement, with the value that means "off"
#: (Keras code that passes that value runs unchanged; another value is refused, saying so).
KERAS_ONLY_OPTIONS: dict[str, Any] = {"weight_decay": None, "use_ema": False, "ema_momentum": 0.99,
                                      "ema_overwrite_frequency": None,
                                      "loss_scale_factor": None}


def _check_keras_options(optimizer: Any, options: dict[str, Any]) -> None:
    """Keras 3's names that mean "off" are taken; anything else is an error naming what this
    optimizer takes (Keras: "Argument(s) not recognized")."""
    if not options:
        return
    cls = type(optimizer).__name__
    taken = sorted(_args.accepted_arguments(type(optimizer)) or ())
    keras_only = {**KERAS_ONLY_OPTIONS, **getattr(optimizer, "_keras_only_options", {})}
    for name, value in options.items():
        if name in keras_only:
            off = keras_only[name]
            if value is off or value == off:
                continue
            raise ValueError(f"{cls}({name}={value!r}): Keras 3's {name} is not implemented by "
                             f"mpcore (only {name}={off!r} is accepted); {cls} takes: "
                             f"{', '.join(taken)}")
        # (Keras 3 raises ValueError here: "Argument(s) not recognized")
        raise ValueError(f"{cls}() argument(s) not recognized: {name}={value!r}; {cls} takes: "
                         f"{', '.join(taken)}")
