"""Gradient accumulation (``gradient_accumulation_steps=N``), on the device, so that a traced
step records it kernel by kernel and reads nothing back (issue 34, item 1).

The accumulators are variables (one per variable given a gradient, made at its first one) and
the micro-step count an int64 variable (shape ()). Every call runs the same kernels: the
totals ``acc + grad`` (a variable with no gradient in this call: its accumulator), the count
``n = micro + 1``, ``last = (n == N)``, the means ``total / N`` and their "all finite" flag (a
non-finite micro-step leaves a non-finite sum: the whole step is skipped); the update is gated
by ``last and finite`` (the update kernels take a flag: a micro-step writes nothing), and the
accumulators and the count are reset where ``last`` (``where(last, 0, total)``). So eager steps
and replays agree bit for bit, with the values the host's accumulation computed before.

What :meth:`_apply` tells its caller (the LossScaleOptimizer, which moves its scale once per
real step): whether the call was an update, a Python bool where the host's copy of the count is
known (eager steps, calls kept whole), else the device flag ``last`` (a traced step's replays
run no Python): the scale's update is then gated by it on the device.
"""

from __future__ import annotations

from typing import Any

from mpcore import ops
from mpcore.core.tensor import Tensor, Variable
from mpcore.tracing.function import recording_kernels


class Accumulation:
    """Mixed into :class:`~mpcore.optimizers.base.Optimizer`."""

    gradient_accumulation_steps: int | None
    _accumulators: dict[int, Variable]
    _var_list: list[Variable]
    _micro_var: Variable | None = None
    #: the host's copy of the micro-step count (None: unknown, read from the device), and the
    #: variable's ``_version`` when it was taken
    _micro_known: int | None = 0
    _micro_version = -1

    @property
    def _micro_steps(self) -> int:
        """Micro-steps done in the current accumulation (a host read where the host's copy is
        unknown: after a traced step's replays)."""
        known, var = self._micro_known, self._micro_var
        if var is not None and (known is None or var._version != self._micro_version):
            known = int(var.numpy())
            self._micro_known, self._micro_version = known, var._version
        return known or 0

    @_micro_steps.setter
    def _micro_steps(self, value: int) -> None:
        value = int(value)
        var = self._micro_var
        if var is not None:
            var.assign(ops.constant(value, "int64", backend=var.backend))
            self._micro_version = var._version
        self._micro_known = value

    def _micro_variable(self, backend: Any) -> Variable:
        var = self._micro_var
        if var is None or var.backend is not backend:
            count = self._micro_steps
            var = self._micro_var = Variable(ops.constant(count, "int64", backend=backend),
                                             dtype="int64", trainable=False,
                                             name=f"{getattr(self, 'name', '')}/micro_steps")
            self._micro_version = var._version
        return var

    def _accumulator(self, var: Variable) -> Variable:
        acc = self._accumulators.get(id(var))
        if acc is None:
            acc = self._accumulators[id(var)] = Variable(
                ops.zeros(var.shape, var.dtype, var.backend), dtype=var.dtype, trainable=False,
                name=f"{var.name}/accumulator")
        return acc

    def _build_accumulation(self, variables: list[Variable]) -> None:
        """The accumulators of ``variables`` and the count's variable (a traced step that
        made them would run eagerly once: ``build`` makes them first where it can)."""
        if (self.gradient_accumulation_steps or 1) > 1 and variables:
            self._micro_variable(variables[0].backend)
            for var in variables:
                self._accumulator(var)

    def _accumulate(self, grads: list[Tensor], variables: list[Variable]
                    ) -> tuple[list[Tensor], Tensor, list[Variable], bool | Tensor]:
        """Add ``grads`` to the accumulators; returns the means of every accumulator, the flag
        that gates their update (``last and finite``), the variables, and whether this call
        is an update (see the module's docstring)."""
        steps = self.gradient_accumulation_steps or 1
        self._build_accumulation(variables)
        micro = self._micro_variable(variables[0].backend)
        given = {id(v) for v in variables}
        totals = [ops.add(self._accumulators[id(v)].current_value(), g)
                  for g, v in zip(grads, variables)]
        for var in self._var_list:          # accumulated earlier, no gradient this time
            acc = self._accumulators.get(id(var))
            if acc is not None and id(var) not in given:
                variables.append(var)
                totals.append(acc.current_value())
        # the count and flags on shape (1,) (see flags())
        count = ops.add(ops.reshape(micro.current_value(), (1,)), 1)
        last1 = ops.equal(count, steps)
        last = ops.reshape(last1, ())
        means = [ops.divide(total, float(steps)) for total in totals]
        flag = flags(ops.logical_and, last, ops.all_finite(means))
        for var, total in zip(variables, totals):
            acc = self._accumulators[id(var)]
            acc.assign(ops.where(last, ops.zeros(acc.shape, acc.dtype, acc.backend), total))
        micro.assign(ops.reshape(ops.where(last1, ops.zeros((1,), "int64", micro.backend),
                                           count), ()))
        known = self._micro_known
        if recording_kernels() or known is None:
            self._micro_known = None      # replays count on the device only
            return means, flag, variables, last
        self._micro_known = 0 if known + 1 >= steps else known + 1
        self._micro_version = micro._version
        return means, flag, variables, known + 1 >= steps


def flags(op: Any, *args: Tensor) -> Tensor:
    """``op`` (logical_and ...) of 0-d device flags, computed on shape (1,) and reshaped back:
    NumPy makes a 0-d bool result ``np.True_``/``np.False_``, singletons that a trace, which
    tells a step's values apart by their arrays, would take for one another."""
    return ops.reshape(op(*(ops.reshape(a, (1,)) for a in args)), ())
