"""Seeds for random ops: a process-wide generator whose state is (seed, counter).

Kernels are stateless (``random_uniform(shape, dtype, seed, ...)``); the core hands each call a
fresh 63-bit seed derived from (seed, counter) with SplitMix64. The state is two integers, so a
checkpoint restores it exactly and a run with ``set_seed(n)`` repeats on any backend.

>>> set_seed(7); a = next_seed(); set_seed(7); a == next_seed()
True
"""

from __future__ import annotations

import os
import threading

_MASK = (1 << 64) - 1
_lock = threading.Lock()
_seed = int.from_bytes(os.urandom(8), "little") >> 1
_counter = 0


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
        _seed, _counter = seed & _MASK, 0


def next_seed() -> int:
    global _counter
    with _lock:
        _counter += 1
        return _splitmix64(_seed ^ _splitmix64(_counter)) >> 1


def get_state() -> dict[str, int]:
    return {"seed": _seed, "counter": _counter}


def set_state(state: dict[str, int]) -> None:
    global _seed, _counter
    with _lock:
        _seed, _counter = int(state["seed"]) & _MASK, int(state["counter"])
