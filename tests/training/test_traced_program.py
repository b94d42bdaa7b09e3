"""What a traced step's program runs: kernel calls whose operands are all constants are folded
once at compile time (and never the in-place updates, the inputs, variables or fresh seeds), a
fresh random permutation per replay, and the fused cross-entropy backward on the CPU, all bit
for bit the eager results."""

from __future__ import annotations

import numpy as np
import pytest

import mpcore as mp
from mpcore.program import KernelCall, fold_constants

RNG = np.random.default_rng(5)


def _calls(program: object) -> list[str]:
    return [s.name for s in program.steps if type(s) is KernelCall]  # type: ignore[attr-defined]


def test_calls_on_constants_are_folded_and_the_replay_still_equals_eager() -> None:
    mp.set_global_policy("float32")
    c = mp.constant(RNG.random(4, dtype=np.float32))

    def step(x: mp.Tensor) -> mp.Tensor:
        scale = mp.ops.divide(mp.ops.broadcast_to(mp.ops.reshape(mp.ops.full((), 3.0), (1,)),
                                                  (4,)), 4.0)       # constants only: folded
        return mp.ops.exp(x * scale + c)                              # reads the input: kept

    f = mp.function(step)
    for _ in range(3):
        x = mp.constant(RNG.random(4, dtype=np.float32))
        np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(step(x)))
    assert f.tracing_count == 1
    recorded, folded = _calls(f.graph), _calls(fold_constants(f.graph))
    assert recorded[:4] == ["full", "reshape", "broadcast_to", "divide"]
    assert folded == ["multiply", "add", "exp"]
    assert len(str(f.graph).splitlines()) == len(recorded)   # the graph shows what was recorded


def test_variables_seeds_and_in_place_updates_are_never_folded() -> None:
    mp.set_global_policy("float32")
    v = mp.Variable(np.ones(3, np.float32))
    ms = mp.Variable(np.zeros(3, np.float32))

    def step() -> mp.Tensor:
        noise = mp.ops.random_uniform((3,))                           # a fresh seed each call
        grad = mp.ops.full((3,), 0.5)                                 # constant: folded
        mp.ops.rmsprop_update(v, grad, ms, None, 0.1, 0.9, 0.0, 1e-7)   # writes v and ms
        return mp.ops.add(v.current_value(), noise)

    f = mp.function(step)
    outs = [np.asarray(f()) for _ in range(3)]
    assert _calls(fold_constants(f.graph)) == ["random_uniform", "rmsprop_update", "add"]
    assert not np.array_equal(outs[1], outs[2])                      # fresh noise, moving v
    mp.set_global_policy("float32")
    v2, ms2 = mp.Variable(np.ones(3, np.float32)), mp.Variable(np.zeros(3, np.float32))
    for _ in range(3):
        mp.ops.rmsprop_update(v2, mp.ops.full((3,), 0.5), ms2, None, 0.1, 0.9, 0.0, 1e-7)
    np.testing.assert_array_equal(v.numpy(), v2.numpy())              # three real updates
    np.testing.assert_array_equal(ms.numpy(), ms2.numpy())


@pytest.mark.parametrize("n", [0, 1, 7, 1000])
def test_random_permutation_is_a_seeded_order_of_range_n(backend: mp.Backend, n: int) -> None:
    a = np.asarray(mp.ops.random_permutation(n, seed=3, backend=backend))
    assert a.dtype == np.int64 and sorted(a.tolist()) == list(range(n))
    np.testing.assert_array_equal(a, np.asarray(mp.ops.random_permutation(n, seed=3,
                                                                          backend=backend)))
    if n == 1000:   # every built-in backend draws the CPU's order
        np.testing.assert_array_equal(a, np.asarray(mp.ops.random_permutation(n, seed=3,
                                                                              backend="cpu")))


@pytest.mark.parametrize("n", [-1, 2.0, True, "3"])
def test_random_permutation_refuses_what_is_not_a_count(n: object) -> None:
    with pytest.raises(ValueError, match="whole number n >= 0"):
        mp.ops.random_permutation(n)  # type: ignore[arg-type]


def test_a_traced_permutation_draws_a_fresh_order_at_each_replay() -> None:
    mp.random.set_seed(9)
    f = mp.function(lambda x: mp.ops.take(x, mp.ops.random_permutation(50), 0))
    x = mp.constant(np.arange(50, dtype=np.float32))
    traced = [np.asarray(f(x)) for _ in range(3)]
    mp.random.set_seed(9)
    eager = [np.asarray(mp.ops.take(x, mp.ops.random_permutation(50), 0)) for _ in range(3)]
    for a, b in zip(traced, eager, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(traced[1], traced[2])


def test_the_fused_cross_entropy_backward_equals_the_composite_bit_for_bit() -> None:
    be = mp.get_backend("cpu")
    fused = be.kernels()["sparse_softmax_cross_entropy_grad"]
    logits = RNG.normal(0, 4, (33, 7)).astype(np.float32)
    labels = RNG.integers(0, 7, 33)
    g = RNG.random(33, dtype=np.float32)
    g[3] = np.inf                                       # a non-finite upstream row too
    _, probs = be.kernels()["sparse_softmax_cross_entropy"](logits, labels)
    want = (probs - (labels[:, None] == np.arange(7)).astype(np.float32)) * g[:, None]
    np.testing.assert_array_equal(fused(probs, labels, g), want)
