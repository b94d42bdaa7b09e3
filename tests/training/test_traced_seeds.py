"""Seeds in traced steps (mpcore.trace_seeds): each seed a step draws is drawn again at each
replay where eager execution draws it, so random ops get the seeds eager execution would give
them, in the same order, whatever else the step draws or sets in between. Each case compares
the replays with eager calls from the same seed, on every backend here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import mpcore as mp

F32 = np.float32


def _host(out: Any) -> list[Any]:
    return [np.asarray(t).tolist() for t in (out if isinstance(out, tuple) else (out,))]


def _eager_and_traced(step: Callable[..., Any], calls: int = 4) -> None:
    """``step`` eagerly and traced, each call from the same seed, then four calls in a row
    (the stream goes on as eagerly): equal bit for bit."""
    f = mp.function(step)
    x = mp.ops.ones((16,))
    for n in range(calls):
        mp.random.set_seed(100 + n)
        eager = _host(step(x))
        mp.random.set_seed(100 + n)
        assert _host(f(x)) == eager, f"call {n}"
    mp.random.set_seed(7)
    eager = [_host(step(x)) for _ in range(calls)]
    mp.random.set_seed(7)
    assert [_host(f(x)) for _ in range(calls)] == eager
    assert f.tracing_count == 1 and f.eager_reason is None


def test_a_seed_drawn_before_another_random_op_is_drawn_first(backend: mp.Backend) -> None:
    """Fifth round: a replay drew each seed at the random op that took it, so a seed drawn
    with next_seed() before another op drew its own was given the other's number (the two
    draws swapped from the second call on)."""
    def step(x: mp.Tensor) -> Any:
        s = mp.random.next_seed()
        a = mp.ops.random_uniform((16,))             # draws its own seed, after s
        b = mp.ops.random_uniform((16,), seed=s)
        return mp.ops.add(a, x), mp.ops.add(b, x)

    _eager_and_traced(step)


def test_one_seed_for_two_random_ops_gives_them_one_mask(backend: mp.Backend) -> None:
    """Was refused (third round): one seed for the masks of every time step, as a recurrent
    dropout draws it. Each replay draws it once and both ops read it."""
    def step(x: mp.Tensor) -> Any:
        s = mp.random.next_seed()
        first, second = mp.ops.dropout(x, 0.5, seed=s), mp.ops.dropout(x, 0.5, seed=s)
        return first, second, mp.ops.dropout(x, 0.5)

    _eager_and_traced(step)
    first, second, third = _host(mp.function(step)(mp.ops.ones((16,))))
    assert first == second and first != third


def test_seeds_around_set_seed_and_shared_come_in_eager_order(backend: mp.Backend) -> None:
    """A seed drawn before set_seed() in the step and used after it, and one drawn inside
    shared(): each replay draws them where eager execution does."""
    def step(x: mp.Tensor) -> Any:
        early = mp.random.next_seed()
        mp.random.set_seed(3)
        with mp.random.shared():
            common = mp.random.next_seed()
        late = mp.ops.random_normal((16,))
        return (mp.ops.add(mp.ops.random_normal((16,), seed=early), x),
                mp.ops.add(mp.ops.random_normal((16,), seed=common), late))

    _eager_and_traced(step)


def test_the_graph_shows_where_each_seed_is_drawn(backend: mp.Backend) -> None:
    def step(x: mp.Tensor) -> mp.Tensor:
        s = mp.random.next_seed()
        return mp.ops.add(mp.ops.dropout(x, 0.5, seed=s), mp.ops.dropout(x, 0.5, seed=s))

    f = mp.function(step)
    f(mp.ops.ones((4,)))
    lines = str(f.graph).splitlines()
    draws = [n for n, line in enumerate(lines) if "mp.random.next_seed()  [on each replay]" in line]
    assert len(draws) == 1
    slot = lines[draws[0]].split(" = ")[0]
    readers = [line for line in lines if f"<seed {slot}>" in line]
    assert len(readers) == 2 and lines.index(readers[0]) > draws[0]


def test_a_seed_computed_from_a_drawn_one_is_still_refused() -> None:
    """What a replay cannot follow stays refused: a seed converted and changed in Python."""
    def step(x: mp.Tensor) -> mp.Tensor:
        s = mp.random.next_seed()
        return mp.ops.add(mp.ops.random_uniform((4,), seed=int(s) + 1), x)

    with pytest.raises(mp.TraceError, match="reached no random op as drawn"):
        mp.function(step)(mp.ops.ones((4,)))
    with pytest.raises(mp.TraceError, match="cannot compute with a seed"):
        mp.function(lambda x: mp.ops.random_uniform((4,), seed=mp.random.next_seed() + 1))(
            mp.ops.ones((4,)))
