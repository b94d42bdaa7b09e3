"""Effects held back: a trace whose run must leave no trace of itself in the training state.

The mixed precision graph rewrite (:mod:`mpcore.amp.rewrite`) needs the float32 op graph of a
step before it can paint it, and the only way to get the graph is to run the step. That run is
a pre-pass, not a step of training: the first call of a signature must return the painted
(16-bit) result and apply a painted update, as every later call does (issue 34: "steps
prepared before they run"). So the pre-pass runs on the state as it is, and afterwards
:class:`HeldEffects` puts that state back:

- every live variable's array (weights, optimizer slots, metric totals, a loss scale kept in
  variables), copied before the pre-pass and put back as ``assign`` would (the variable gets
  the saved array; a replay reads variables through the variable, never a captured array);
- ``mp.random``'s seed and counter (the seeds the pre-pass drew are drawn again by the
  painted trace, in the same order);
- the Python state that calls kept whole changed (an optimizer's step count, a loss scale's
  counters), from the trace's own :class:`~mpcore.tracing.python_state.StateWatch`.

Where some Python state cannot be put back (an array changed in place, a module's globals),
:meth:`HeldEffects.restore` says so and the caller keeps the old two-call behaviour (the
pre-pass stands as a float32 step), rather than training from a state half put back.

The copies cost one pass over the variables' memory once per signature (not per replay).
"""

from __future__ import annotations

from typing import Any

from mpcore.core import random as _random
from mpcore.core import tensor as _tensor
from mpcore.tracing.python_state import StateWatch


class HeldEffects:
    """The training state before a pre-pass, to be put back after it."""

    def __init__(self) -> None:
        self.variables = [_saved(v) for v in _tensor.live_variables()]
        # (taken and put back outside the trace: its hooks are not installed then)
        self.random_state = _random.get_state()

    def created(self, variable: Any) -> None:
        """A variable the pre-pass creates (an optimizer's slot, made by its first update):
        put back to the value it was created with."""
        self.variables.append(_saved(variable))

    def restore(self, watch: StateWatch | None) -> bool:
        """Put the state back; False (nothing put back) where the Python state a call kept
        whole changed cannot be."""
        if watch is not None and not watch.undo_whole():
            return False
        for variable, saved in self.variables:
            variable._data = saved
            variable.mark_updated()
        _random.set_state(self.random_state)
        return True


def _saved(variable: Any) -> tuple[Any, Any]:
    """The variable and a copy of its array, made by its backend's own copy kernel."""
    return variable, variable._backend.kernels()["copy"](variable._data)
