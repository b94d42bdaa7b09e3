"""Seeds drawn while a step is recorded.

Each ``mp.random.next_seed()`` a step makes (a random op given no seed draws one itself) is
recorded as a step of the program: every replay draws a seed at that point, so the seeds come
in the order eager execution draws them, interleaved with the step's other draws and its
``set_seed``/``shared()`` calls. A random kernel that was given the drawn seed as it is reads the
replay's; two kernels given one seed read the same one (one mask for every time step, as a
recurrent dropout draws it), as eagerly.

A value computed from a seed in Python would be the trace's forever, so arithmetic on a drawn
seed is refused while a step is recorded (:class:`DrawnSeed`), and so is a kept trace in which a
drawn seed reached no random kernel as drawn (:func:`seed_refusal`: it went somewhere a replay
cannot follow, such as ``int(s) + 1``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpcore import random as _random
from mpcore.trace_state import local, refuse

__all__ = ["DrawnSeed", "draw_seed", "next_seed_recorded", "seed_refusal"]

SEED_MATH = (
    "a traced step cannot compute with a seed from mp.random.next_seed() in Python (seed + 1, "
    "seed ^ k): a replay draws a fresh seed where a random op takes one as it is, and would "
    "reuse the first call's computed value. Draw another seed with next_seed() instead, or "
    "call the function without mp.function.")


class DrawnSeed(int):
    """A seed drawn while a step is recorded. A random op that takes it as it is gets the
    replay's seed; arithmetic on it is refused (a value computed from it in Python would be
    the trace's forever)."""

    __slots__ = ()


def _seed_math(name: str) -> Callable[..., Any]:
    plain = getattr(int, name)

    def op(self: int, *args: Any) -> Any:
        refuse(SEED_MATH)
        return plain(int(self), *args)

    return op


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__xor__",
              "__rxor__", "__and__", "__rand__", "__or__", "__ror__", "__mod__", "__rmod__",
              "__floordiv__", "__rfloordiv__", "__truediv__", "__rtruediv__", "__pow__",
              "__rpow__", "__divmod__", "__rdivmod__", "__lshift__", "__rlshift__",
              "__rshift__", "__rrshift__", "__neg__", "__invert__", "__abs__"):
    setattr(DrawnSeed, _name, _seed_math(_name))


#: ``mp.random.next_seed`` itself (the trace replaces the module's while it records).
draw_seed = _random.next_seed


def next_seed_recorded() -> int:
    """``mp.random.next_seed`` while a trace records: the draw becomes a step of the program."""
    seed = draw_seed()
    recorder = local.recorder
    if recorder is not None and not recorder.whole_depth:   # (a whole call draws its own)
        recorder.draw(seed, replay_draw)
        return DrawnSeed(seed)
    return seed


def replay_draw() -> int:
    """The draw step of a replay (``mp.random.next_seed`` as it is at that moment)."""
    return _random.next_seed()


def seed_refusal(recorder: Any, name: str) -> str | None:
    """Why a replay could not give this trace's random ops the seeds eager execution would,
    or None."""
    if recorder.seed_slot.keys() - recorder.consumed:
        return (f"{name} drew a seed (mp.random.next_seed()) that reached no random op as "
                "drawn: a replay draws the seeds again and gives them to random ops only, and "
                "would reuse a seed computed from it in Python. Pass seeds from next_seed() to "
                "the random ops unchanged, or call the function without mp.function.")
    return None
