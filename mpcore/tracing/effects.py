"""Effects held back: a trace whose run must leave no trace of itself in the training state.

The mixed precision graph rewrite (:mod:`mpcore.amp.rewrite`) needs the float32 op graph of a
step before it can paint it, and the only way to get the graph is to run the step. That run is
a pre-pass, not a step of training: the first call of a signature must return the painted
(16-bit) result and apply a painted update, as every later call does (issue 34: "steps
prepared before they run"). So the pre-pass runs on the state as it is, and afterwards
:class:`HeldEffects` puts that state back:

- the array of each variable the pre-pass writes (weights, optimizer slots, metric totals, a
  loss scale kept in variables), copied just before its first write and put back as
  ``assign`` would (the variable gets the saved array; a replay reads variables through the
  variable, never a captured array);
- ``mp.random``'s seed and counter (the seeds the pre-pass drew are drawn again by the
  painted trace, in the same order);
- the Python state that calls kept whole changed (an optimizer's step count, a loss scale's
  counters), from the trace's own :class:`~mpcore.tracing.python_state.StateWatch`.

Which variables: a recorded step writes a variable in two ways only, both of which the trace
sees before the variable's old value is gone: an assignment (``Variable.assign``, whose hook
hands over the array it replaced) and a kernel that writes into its operands (:data:`~mpcore.
tracing.program.IN_PLACE`: the fused optimizer updates and ``loss_scale_update``, by the kernel
contract the only ones). So a variable is copied when the first of those reaches it, and one
the step never writes (a frozen layer, another model, a large buffer of the process) is not
copied at all. A call kept whole runs unrecorded and may write any variable it reaches by
kernels no trace sees, so at its start every variable not saved yet is copied (the old
copy-everything, from that point), and a variable it creates is copied as it is made.

Where some Python state cannot be put back (an array changed in place, a module's globals),
:meth:`HeldEffects.restore` says so and the caller keeps the old two-call behaviour (the
pre-pass stands as a float32 step), rather than training from a state half put back.

The copies cost one pass over the written variables' memory once per signature (not per
replay).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mpcore.core import random as _random
from mpcore.core import tensor as _tensor
from mpcore.tracing.python_state import StateWatch

if TYPE_CHECKING:
    from mpcore.core.tensor import Variable
    from mpcore.tracing.recorder import Recorder


class HeldEffects:
    """The training state before a pre-pass, to be put back after it."""

    def __init__(self, recorder: Recorder) -> None:
        #: the trace whose pre-pass this is: the copies are its bookkeeping, made unrecorded
        self.recorder = recorder
        #: id(variable) -> (the variable, a copy of its array before the pre-pass wrote it).
        #: The variable is held, so its id is not reused while the entry stands.
        self.saved: dict[int, tuple[Variable, Any]] = {}
        #: why every live variable was copied, where one was ("a call kept whole"), or None
        self.copied_all: str | None = None
        # (taken and put back outside the trace: its hooks are not installed then)
        self.random_state = _random.get_state()

    def writing(self, variable: Variable) -> None:
        """``variable``'s array is about to be written in place (an :data:`IN_PLACE` kernel
        given it): saved first, where no earlier write saved it."""
        if id(variable) not in self.saved:
            self._save(variable, variable._data)

    def assigned(self, variable: Variable, replaced: Any) -> None:
        """``variable`` was just assigned; ``replaced`` is the array it held (as it was before
        the pre-pass, where no earlier write saved the variable)."""
        if id(variable) not in self.saved and replaced is not None:
            self._save(variable, replaced)

    def created(self, variable: Variable) -> None:
        """A variable the pre-pass creates (an optimizer's slot, made by its first update).
        Inside a call kept whole, whose writes no trace sees, saved now (put back to the value
        it was created with); elsewhere its first write saves it, as any variable's."""
        if self.recorder.whole_depth:
            self.writing(variable)

    def whole_call(self) -> None:
        """A call kept whole is about to run: it is replayed eagerly, so its kernels are not
        recorded and what it writes in place (a custom optimizer's update, a host schedule's)
        is not seen. Which variables it reaches cannot be known (its object, the globals and
        closures of its code), so every live variable not saved yet is saved now."""
        self.copied_all = self.copied_all or "a call kept whole"
        for variable in _tensor.live_variables():
            self.writing(variable)

    def restore(self, watch: StateWatch | None) -> bool:
        """Put the state back; False (nothing put back) where the Python state a call kept
        whole changed cannot be."""
        if watch is not None and not watch.undo_whole():
            return False
        for variable, saved in self.saved.values():
            variable._data = saved
            variable.mark_updated()
        _random.set_state(self.random_state)
        return True

    def _save(self, variable: Variable, array: Any) -> None:
        """A copy of ``array`` (the variable's, as before the pre-pass), made by its backend's
        own copy kernel. Not a step of the pre-pass: made as a kernel called by a kernel,
        which the trace does not record (it would land in the recorded op graph)."""
        recorder = self.recorder
        recorder.kernel_depth += 1
        try:
            copy = variable._backend.kernels()["copy"](array)
        finally:
            recorder.kernel_depth -= 1
        self.saved[id(variable)] = (variable, copy)
