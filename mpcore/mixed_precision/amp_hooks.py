"""Where automatic mixed precision meets the dispatch: one dtype hook for autocast and the
graph rewrite, installed only while one of them is on, so that eager dispatch pays a single
``is None`` test otherwise.

A decider (an autocast scope, or the rewrite's session while it traces a step) answers
``decide(op, backend, dtype, float_only)`` with a compute dtype, or None to leave the op to
the category rule. The rewrite's session is per thread (a trace runs in one); autocast is
context-local, as ``policy_scope``.
"""

from __future__ import annotations

import contextvars
import threading
from typing import Any, Protocol

from mpcore.core import dtypes as _dt
from mpcore.mixed_precision import trace_hooks
from mpcore.ops import dispatch as _dispatch


class Decider(Protocol):
    def decide(self, op: str, backend: Any, dtype: str, float_only: bool) -> str | None: ...


class _Local(threading.local):
    def __init__(self) -> None:
        self.session: Decider | None = None


_local = _Local()
_autocast: contextvars.ContextVar[Any] = contextvars.ContextVar("mpcore_autocast",
                                                                default=None)
_lock = threading.Lock()
_users = 0


def _decide(op: str, backend: Any, dtype: str, float_only: bool) -> str | None:
    decider = _local.session
    if decider is None:
        decider = _autocast.get()
        if decider is None:
            return None
    return decider.decide(op, backend, dtype, float_only)


#: The graph rewrite's configuration while it is enabled (see :mod:`mpcore.amp.rewrite`).
rewrite: Any = None


def _signature() -> Any:
    """What a traced step's signature holds of automatic mixed precision: a step traced under
    autocast or the rewrite is not replayed without them (nor with other lists)."""
    scope = _autocast.get()
    config = rewrite
    if scope is None and config is None:
        return None
    return (None if scope is None else scope.key(), None if config is None else config.key())


def acquire() -> None:
    """One more user of the dtype hook (installed with the first)."""
    global _users
    with _lock:
        _users += 1
        if _users == 1:
            _dispatch.dtype_hook = _decide


def release() -> None:
    global _users
    with _lock:
        _users -= 1
        if _users == 0:
            _dispatch.dtype_hook = None


trace_hooks.signature_hook = _signature


def begin_session(session: Decider) -> None:
    """The rewrite's session decides on this thread until :func:`end_session`."""
    _local.session = session
    acquire()


def end_session() -> None:
    _local.session = None
    release()


def enter_scope(scope: Decider) -> contextvars.Token[Any]:
    """An autocast scope decides in this context until :func:`exit_scope`."""
    token = _autocast.set(scope)
    acquire()
    return token


def exit_scope(token: contextvars.Token[Any]) -> None:
    release()
    _autocast.reset(token)


def deciding() -> bool:
    """Whether autocast or the rewrite decides dtypes here (a layer then lets a 16-bit input
    through to its ops instead of casting it back to its float32 compute dtype)."""
    return _dispatch.dtype_hook is not None and (_local.session is not None
                                                 or _autocast.get() is not None)


def autocast_on() -> bool:
    """Whether an autocast block is open in this context."""
    return _autocast.get() is not None


def refuse_mixed_layer(layer: str, policy: str) -> None:
    """A layer with its own mixed policy called under autocast or the rewrite: both would set
    its dtypes (the rewrite would even run it in float32), so, as a mixed global policy, it is
    refused rather than silently overridden (docs/architecture.md, automatic mixed precision)."""
    which = ("the mixed precision graph rewrite" if _local.session is not None
             else "autocast")
    raise ValueError(
        f"layer {layer!r} has the mixed policy {policy!r} (from its dtype= or a policy_scope), "
        f"but {which} runs float32 models in mixed precision: both would change its dtypes. "
        f"Use one: build the model with a float32 policy for {which}, or keep the policy "
        f"without {which}")


def follow(dtype: str, float_only: bool) -> str:
    """What an op that follows its inputs computes in: their promoted dtype (float32 for an
    op that needs a floating result of non-floating inputs)."""
    return "float32" if float_only and dtype not in _dt.FLOATING_SET else dtype
