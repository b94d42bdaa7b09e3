"""Seeds drawn while a step is recorded.

Each ``mp.random.next_seed()`` a step makes (a random op given no seed draws one itself) is
recorded as a step of the program: every replay draws a seed at that point, so the seeds come
in the order eager execution draws them, interleaved with the step's other draws and its
``set_seed``/``shared()`` calls. The draw returns a :class:`DrawnSeed`, and wherever that object
goes as it is (a random op, a call kept whole such as ``set_seed``, the step's outputs) the
replay's draw goes: two random ops given one seed read one draw (one mask for every time step,
as a recurrent dropout takes it), as eagerly. Draws are told apart by identity, not by value:
two draws of equal value (``set_seed(k)`` twice in a step) are two draws.

What a replay could not follow is refused while tracing (the message says what to do):
arithmetic (rounding included), ordering and truth tests on a drawn seed in Python (the
result would be the trace's forever); a random op given a plain int equal to a seed the step
drew (``int(s)``, ``np.int64(s)``, or a constant that happens to be equal: a replay cannot
tell which); and a drawn seed that reached nothing a replay follows (it went where Python
kept the trace's value, such as ``int(s) + 1``). All three are checked where the trace is
kept: a first call that creates variables is never replayed, and may compute with a seed
(NumPy's ``default_rng(s)`` tests ``s < 0``); so a first trace refuses at its end, and a later
one where the use happens (:meth:`mpcore.tracing.recorder.Recorder.refuse_seed`). What is not
Python arithmetic (``hash((s, i))``, ``str(s)``, ``float(s)``, ``s == k``, ``s.real``,
``random.Random(s)``, NumPy's ``np.add(s, 1)``) escapes the checks where the seed also
went to a random op: refusing ``__hash__``, ``__eq__`` or ``__float__`` would break dict keys
and kernels.

A step that draws only when an attribute is unset (``if self.seed is None: self.seed =
next_seed()``) would draw at every replay, where eager execution draws once: the trace that
sets the attribute is refused (:mod:`mpcore.tracing.python_state`), unless it is a first trace
that creates variables (run eagerly, never replayed; the next trace finds the attribute set).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpcore.core import random as _random
from mpcore.core.trace_state import local

__all__ = ["DrawnSeed", "given_seed", "next_seed_recorded", "replay_draw", "seed_refusal"]

SEED_MATH = (
    "a traced step cannot compute with, compare or test a seed from mp.random.next_seed() in "
    "Python (seed + 1, seed ^ k, seed > k, `if seed:`): a replay draws the seed again, and "
    "would reuse what the first call computed from it. Draw another seed with next_seed() "
    "instead, or call the function without mp.function.")

SEED_COPY = (
    "a traced step used a seed equal to one it drew from mp.random.next_seed(), "
    "but not that seed itself (converted with int() or np.int64(), or a constant that happens "
    "to be equal): a replay draws the seed again and cannot tell which was meant. Pass the "
    "seed from next_seed() unchanged, or call the function without mp.function.")


class DrawnSeed(int):
    """A seed drawn while a step is recorded. Where it goes as it is, a replay gives its own
    draw; Python computing with it is refused while its trace records (see the module)."""

    __slots__ = ()


def _refusing(name: str) -> Callable[..., Any]:
    plain = getattr(int, name)

    def op(self: int, *args: Any) -> Any:
        recorder = local.recorder
        if recorder is not None and not recorder.whole_depth and recorder.drew(self):
            # (a first call that creates variables, never replayed, may compute with it:
            # NumPy's default_rng(s) tests s < 0; a call kept whole computes again at each
            # replay, on the replay's seed)
            recorder.refuse_seed(SEED_MATH)
        return plain(int(self), *args)

    return op


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__xor__",
              "__rxor__", "__and__", "__rand__", "__or__", "__ror__", "__mod__", "__rmod__",
              "__floordiv__", "__rfloordiv__", "__truediv__", "__rtruediv__", "__pow__",
              "__rpow__", "__divmod__", "__rdivmod__", "__lshift__", "__rlshift__",
              "__rshift__", "__rrshift__", "__neg__", "__invert__", "__abs__", "__lt__",
              "__le__", "__gt__", "__ge__", "__bool__", "__round__", "__trunc__", "__floor__",
              "__ceil__"):
    setattr(DrawnSeed, _name, _refusing(_name))


def next_seed_recorded(seed: int) -> int:
    """``mp.random.draw_hook`` while a trace records: the draw becomes a step of the program."""
    recorder = local.recorder
    if recorder is not None and not recorder.whole_depth:   # (a whole call draws its own)
        drawn = DrawnSeed(seed)
        recorder.draw(drawn, replay_draw)
        return drawn
    return seed


def replay_draw() -> int:
    """The draw step of a replay."""
    return _random.next_seed()


def given_seed(seed: Any, convert: Callable[[Any], int] = int) -> int:
    """A random op's ``seed`` argument as it goes to the kernel: a drawn seed as it is (a trace
    knows its draw by identity), anything else through ``convert``."""
    return seed if type(seed) is DrawnSeed else convert(seed)


def seed_refusal(recorder: Any, name: str) -> str | None:
    """Why a replay could not give this trace's random ops the seeds eager execution would,
    or None."""
    if recorder.seed_refused is not None:
        return recorder.seed_refused
    if recorder.unfollowed_seeds():
        return (f"{name} drew a seed (mp.random.next_seed()) that reached no random op as "
                "drawn: a replay draws the seeds again and gives them only where the drawn "
                "seed itself went, and would reuse a seed computed from it in Python. Pass "
                "seeds from next_seed() to the random ops unchanged, or call the function "
                "without mp.function.")
    return None
