"""What automatic mixed precision (:mod:`mpcore.amp`) adds to traced steps
(:mod:`mpcore.function`), set by it and read at each call and trace; None when unused.

- ``signature_hook()``: more of every signature (whether autocast or the mixed precision graph
  rewrite is on, with which lists and dtype), so a step is not replayed under other dtypes.
- ``trace_hook(function, signature)``: the rewrite's session for this trace, or None. Its
  ``begin(recorder)`` and ``end()`` bracket the traced call; ``keep()`` says whether the
  program is kept (False for the float32 trace that recorded the op graph); ``describe()``
  gives the painted ops' lines of ``Function.graph``.
- ``eager_step_hook()``: called by a model step that runs eagerly (``jit_compile=False``):
  the rewrite says once that it only applies to traced steps, whatever the optimizer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

signature_hook: Callable[[], Any] | None = None
trace_hook: Callable[[Any, tuple[Any, ...]], Any] | None = None
eager_step_hook: Callable[[], None] | None = None
