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
