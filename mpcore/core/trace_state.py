"""The state a trace shares between its modules: the thread's recorder (while a step is
recorded), how deep in replays the thread is, and the refusal of what a replay could not
reproduce (:class:`TraceError`, or with ``fallback`` the switch to eager execution)."""

from __future__ import annotations

import threading
from typing import Any


class TraceError(RuntimeError):
    """Raised while tracing a step that a replay could not reproduce."""


class _Local(threading.local):
    def __init__(self) -> None:
        self.recorder: Any = None          # a mpcore.tracing.recorder.Recorder while recording
        self.replaying = 0


local = _Local()


def refuse(message: str) -> None:
    """What the step just did cannot be replayed: raise :class:`TraceError` with ``message``,
    or, where the function falls back, let this call go on eagerly, unrecorded (the function
    runs eagerly from then on). Nothing inside a call kept whole is refused: each replay makes
    that call again."""
    recorder = local.recorder
    if recorder is None or recorder.whole_depth:
        return
    if recorder.refused is None:    # (a TraceError the step's own try/except swallows is
        recorder.refused = message  # raised again at the trace's end)
    if not recorder.fallback:
        raise TraceError(message)
    recorder.whole_depth += 1


_HOST_READ = (
    "a traced step cannot read a tensor's value on the host (float(t), t.numpy(), bool(t), "
    "`if t:`, a dynamic loss scale's value): a replay would reuse the value of the first "
    "call. Keep the decision on the device (mp.ops.where), or return the tensor from the step "
    "and read it outside, or call the function without mp.function.")

_STATE_READ = (
    "a traced step cannot read mp.random's state (get_state()): a replay would restore the "
    "first call's. Save and restore the state outside the step, or call the function without "
    "mp.function.")


def refuse_host_read(tensor: Any = None) -> None:
    """A tensor's value read on the host (the hook a trace installs on tensors)."""
    refuse(_HOST_READ)


def refuse_state_read() -> None:
    """mp.random's state read (the hook a trace installs on the random module)."""
    refuse(_STATE_READ)
