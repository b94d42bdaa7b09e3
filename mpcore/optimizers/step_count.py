"""The optimizer's step count: Keras 3's ``iterations`` variable on the device (int64, shape
()), incremented by a kernel in each update, so a traced step records it and reads nothing
back (issue 34, item 1); and the host's copy of it, which ``optimizer.iterations`` returns as
a Python int.

What counts: every update of a plain optimizer (one whose Inf/NaN gradients left the weights
alone too: Keras 3 counts every ``apply``); under a LossScaleOptimizer only the applied steps,
as Keras 3, whose ``apply`` calls the inner optimizer's only for finite gradients (the count
then gated by the finite flag on the device); under gradient accumulation, the updates, not
the micro-steps (:mod:`mpcore.optimizers.accumulation`).

``optimizer.iterations`` inside a traced step is refused (a ``TraceError`` naming
``iterations_variable``): an int there would be the trace's at every replay, and a step whose
host copy is unknown would read the device back at every step. The device variable,
``opt.iterations_variable``, is what Keras 3 returns as ``optimizer.iterations``; a step uses
it as a tensor.
"""

from __future__ import annotations

from typing import Any

from mpcore import ops
from mpcore.core.tensor import Tensor, Variable
from mpcore.core.trace_state import refuse
from mpcore.tracing.function import recording_kernels

_TRACED_READ = (
    "a traced step cannot read optimizer.iterations: it is a Python int, the host's copy of "
    "the device's step count, so a replay would use the count of the call that traced (or "
    "read the count back to the host at every step). Use opt.iterations_variable instead, "
    "the int64 device variable that Keras 3 returns as optimizer.iterations, as a tensor in "
    "the step (mp.ops.cast(opt.iterations_variable, 'float32') ...), or read opt.iterations "
    "outside the step.")


class StepCount:
    """Mixed into :class:`~mpcore.optimizers.base.Optimizer`."""

    name: str
    #: the device count (made by the optimizer's constructor, moved by ``build`` to the
    #: variables' backend)
    _iterations_var: Variable | None
    #: the host's copy (None: unknown, read from the device when asked), and the variable's
    #: ``_version`` when the copy was taken (another value means the copy is stale)
    _iterations_known: int | None
    _iterations_version: int

    @property
    def iterations(self) -> int:
        """The updates made so far, as a Python int (see the module's docstring): read from
        the device variable :attr:`iterations_variable` where the host's copy is unknown
        (after a traced step's replays). Keras 3 returns the variable itself; an int compares,
        formats and indexes as the count everywhere. Refused inside a traced step (use
        ``iterations_variable`` there)."""
        refuse(_TRACED_READ)      # (nothing outside a trace, nor in a call kept whole)
        return self._read_count()

    @iterations.setter
    def iterations(self, value: int) -> None:
        value = int(value)
        if self._iterations_var is not None:
            self._iterations_var.assign(ops.constant(value, "int64",
                                                     backend=self._iterations_var.backend))
            self._iterations_version = self._iterations_var._version
        self._iterations_known = value

    @property
    def iterations_variable(self) -> Variable | None:
        """The step count on the device (Keras 3's ``optimizer.iterations`` variable), made by
        the first update (:meth:`build`); None before."""
        return self._iterations_var

    def _read_count(self) -> int:
        known = self._host_count()
        if known is None:
            var = self._iterations_var
            assert var is not None
            known = int(var.numpy())
            self._iterations_known, self._iterations_version = known, var._version
        return known

    def _new_iterations_variable(self, backend: Any) -> Variable:
        count = self._read_count()
        var = Variable(ops.constant(count, "int64", backend=backend), dtype="int64",
                       trainable=False, name=f"{self.name}/iterations")
        self._iterations_known, self._iterations_version = count, var._version   # current
        return var

    def _host_count(self) -> int | None:
        """The host's copy of the count where it is current (None: a read would be needed).
        The copy holds while the variable is as the copy saw it: a value put back under it
        (the graph rewrite's pre-pass, mpcore.tracing.effects) or assigned to it marks the
        variable updated."""
        var = self._iterations_var
        if var is not None and var._version != self._iterations_version:
            return None
        return self._iterations_known

    def _settle_count(self, count: int) -> None:
        """The count is ``count``: known to a caller that read the flag the step was counted
        by (an eager LossScaleOptimizer step), so no read of the variable is needed."""
        var = self._iterations_var
        self._iterations_known = count
        self._iterations_version = -1 if var is None else var._version

    def _count_step(self, updated: bool | Tensor = True) -> None:
        """One more update: the variable incremented by a kernel (recorded in a traced step),
        the host's copy kept where Python sees every step (eager, a call kept whole).
        ``updated``: False for a micro-step, or the device flag that says (accumulation's
        last micro-step; a LossScaleOptimizer's finite flag, Keras 3 counting no skipped
        step)."""
        if updated is False:
            return
        # the host's copy before this step's increment, where it is current (a count assigned
        # to iterations_variable since makes it stale: None, read from the device when asked)
        known = self._host_count()
        var = self._iterations_var
        if var is not None:
            count = ops.add(var.current_value(), 1)
            # (a where, not a cast of the flag: no cast beyond the step's own in a painted graph)
            var.assign(count if updated is True else ops.where(updated, count,
                                                               var.current_value()))
        if recording_kernels() or known is None or updated is not True:
            self._iterations_known = None     # replays count on the device only
        else:
            self._settle_count(known + 1)
