"""Seeds for random ops: a process-wide generator whose state is (seed, counter).

Kernels are stateless (``random_uniform(shape, dtype, seed, ...)``); the core hands each call a
fresh 63-bit seed derived from (seed, counter) with SplitMix64. The state is two integers, so a
checkpoint restores it exactly and a run with ``set_seed(n)`` repeats on any backend.

>>> set_seed(7); a = next_seed(); set_seed(7); a == next_seed()
True
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Callable, Iterator

_MASK = (1 << 64) - 1
_lock = threading.Lock()
_seed = int.from_bytes(os.urandom(8), "little") >> 1
_counter = 0
#: This process's stream (its rank under a distribution; 0 alone): mixed into every seed
#: outside :func:`shared`, so that dropout draws independent masks on every rank while the
#: counter stays the same everywhere (the ranks check it at each step).
_stream = 0
_shared: contextvars.ContextVar[bool] = contextvars.ContextVar("mpcore_random_shared",
                                                              default=False)
#: Set by :mod:`mpcore.function` while it traces a step: told of every change of the state
#: (``hook(fn, *args)``), which each replay then makes again at the same point, so that the
#: seeds drawn after it are those eager execution would draw.
state_hook: Callable[..., None] | None = None
#: Set with it: called by :func:`get_state`, which a traced step cannot replay.
state_read_hook: Callable[[], None] | None = None
#: Set with it: given each seed :func:`next_seed` draws, returns what the caller gets (the
#: trace's record of the draw). A hook inside the function, so that a ``next_seed`` imported
#: by name is recorded too.
draw_hook: Callable[[int], int] | None = None


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def set_seed(seed: int) -> None:
    """Make every later random op (initializers, dropout) repeatable."""
    global _seed, _counter
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    with _lock:
        _seed, _counter = int(seed) & _MASK, 0
    if state_hook is not None:
        state_hook(set_seed, seed)


def next_seed() -> int:
    global _counter
    with _lock:
        _counter += 1
        x = _seed ^ _splitmix64(_counter)
        if _stream and not _shared.get():
            x ^= _splitmix64(_stream ^ 0xD1B54A32D192ED03)
        seed = _splitmix64(x) >> 1
    hook = draw_hook
    return seed if hook is None else hook(seed)


def set_stream(stream: int) -> None:
    """Draw from stream ``stream`` from now on (``mp.distribution`` sets it to the rank;
    stream 0 draws what a single process does)."""
    global _stream
    if isinstance(stream, bool) or not isinstance(stream, int) or int(stream) < 0:
        raise ValueError(f"stream must be an int >= 0, got {stream!r}")
    _stream = int(stream)
    if state_hook is not None:
        state_hook(set_stream, stream)


@contextlib.contextmanager
def shared() -> Iterator[None]:
    """Seeds drawn inside are those of stream 0 on every rank: for what every replica must
    draw alike (initial weights, fit's shuffle), as opposed to dropout's masks.

    >>> set_seed(7); set_stream(1); a = next_seed()
    >>> with shared(): b = next_seed()
    >>> set_seed(7); set_stream(0); a != next_seed() and b == next_seed()
    True
    """
    token = _shared.set(True)
    if state_hook is not None:
        state_hook(_enter_shared)
    try:
        yield
    finally:
        _shared.reset(token)
        if state_hook is not None:
            state_hook(_leave_shared)


_replayed = threading.local()


def _tokens() -> list[contextvars.Token[bool]]:
    """This thread's tokens of the :func:`shared` blocks replays entered and did not leave."""
    return _replayed.__dict__.setdefault("tokens", [])


def _enter_shared() -> None:
    """What a replay does where the traced step entered :func:`shared` (the flag it finds is
    the replay's caller's, restored at :func:`_leave_shared`)."""
    _tokens().append(_shared.set(True))


def _leave_shared() -> None:
    _shared.reset(_tokens().pop())


def shared_depth() -> int:
    """How many :func:`shared` blocks replays have entered and not left in this thread."""
    return len(_tokens())


def leave_shared_to(depth: int) -> None:
    """Leave the blocks a replay that raised had entered (back to ``depth``)."""
    tokens = _tokens()
    while len(tokens) > depth:
        _shared.reset(tokens.pop())


def get_state() -> dict[str, int]:
    if state_read_hook is not None:
        state_read_hook()
    return {"seed": _seed, "counter": _counter}


def set_state(state: dict[str, int]) -> None:
    global _seed, _counter
    with _lock:
        _seed, _counter = int(state["seed"]) & _MASK, int(state["counter"])
    if state_hook is not None:
        state_hook(set_state, dict(state))
