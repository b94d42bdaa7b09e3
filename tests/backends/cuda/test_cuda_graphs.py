"""Traced steps as CUDA graphs, on a GPU (skipped elsewhere with the reason): a replay through
the graphs equals the eager step bit for bit over several steps (float32, mixed_float16 with a
skipped non-finite step, dropout drawing fresh numbers), the graph path is taken, a variable
given a new array is captured again, outputs do not alias the graphs' memory, a host upload is
kept out of the graph, and capture can be turned off. The plan these runners follow is tested
on the CPU in test_cuda_graph_plan.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import custom_training_step, mlp_and_optimizer, spy_on_compile_program
from mpcore_cuda import CudaBackend, graphs
from mpcore_cuda import graph_plan as gp

import mpcore as mp

_REASON = CudaBackend().unavailable_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"cuda: {_REASON}")

RNG = np.random.default_rng(21)
STEPS = 7
XS = [RNG.random((32, 20), dtype=np.float32) for _ in range(STEPS)]
YS = [RNG.integers(0, 4, 32) for _ in range(STEPS)]
#: A batch whose float16 cast overflows: the gradients are Inf/NaN and the step is skipped.
BAD = 4
XS_BAD = [x * np.float32(1e30) if n == BAD else x for n, x in enumerate(XS)]


@pytest.fixture
def runners(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The cuda backend, current; the runners its compile_program makes, in a list."""
    previous = mp.get_backend()
    be = mp.get_backend("cuda")
    mp.set_backend("cuda")
    yield spy_on_compile_program(monkeypatch, be)
    mp.set_backend(previous.name)
    mp.set_global_policy(None)


def train(policy: str, traced: bool, xs: list[np.ndarray],
          between: Any = None) -> tuple[list[float], list[np.ndarray], Any]:
    model, opt = mlp_and_optimizer(policy)
    step = custom_training_step(model, opt)
    if traced:
        step = mp.function(step)
    losses = []
    for n, (x, y) in enumerate(zip(xs, YS)):
        if between is not None:
            between(n, model)
        losses.append(float(np.asarray(step(mp.constant(x), mp.constant(y)))))
    return losses, model.get_weights(), opt


def same_training(policy: str, xs: list[np.ndarray], between: Any = None) -> Any:
    eager_losses, eager_weights, eager_opt = train(policy, False, xs, between)
    losses, weights, opt = train(policy, True, xs, between)
    np.testing.assert_array_equal(np.array(losses), np.array(eager_losses))
    for a, b in zip(weights, eager_weights, strict=True):
        np.testing.assert_array_equal(a, b)
    return eager_losses, eager_opt, opt


def the_graph_runner(made: list[Any]) -> graphs.GraphRunner:
    runner = [r for r in made if isinstance(r, graphs.GraphRunner)]
    assert runner, [getattr(r, "reason", None) for r in made]
    return runner[-1]


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_graph_replay_equals_eager_bit_for_bit(runners: list[Any], policy: str) -> None:
    xs = XS_BAD if policy == "mixed_float16" else XS
    eager_losses, eager_opt, opt = same_training(policy, xs)
    runner = the_graph_runner(runners)
    assert runner.captured and runner.graphs and runner.reason is None
    assert runner.launches >= len(runner.graphs)     # the graphs ran, not just got made
    steps = runner.program.steps
    for n, why in runner.plan.host.items():
        if type(steps[n]).__name__ == "KernelCall" and steps[n].name == "dropout_mask":
            assert why == gp.SEED                     # fresh numbers at each replay
    if policy == "mixed_float16":
        assert not np.isfinite(eager_losses[BAD])      # the skipped step ...
        assert opt.loss_scale.state_dict() == eager_opt.loss_scale.state_dict()
        assert opt.loss_scale() < 2.0 ** 15             # ... halved the scale, as eagerly


def test_a_replaced_variable_array_is_captured_again(runners: list[Any]) -> None:
    saved: dict[str, Any] = {}

    def restore(n: int, model: Any) -> None:    # set_weights assigns: new variable arrays
        if n == 2:
            saved["w"] = model.get_weights()
        if n == 4:
            model.set_weights(saved["w"])

    same_training("mixed_float16", XS, restore)
    runner = the_graph_runner(runners)
    assert any(seg.variables for seg in runner.plan.segments)
    assert sum(runner.recaptures.values()) >= 1 and runner.captured


def test_outputs_do_not_alias_graph_memory(runners: list[Any]) -> None:
    f = mp.function(lambda t: mp.ops.multiply(mp.ops.exp(mp.ops.negative(t)), 2.0))
    xs = [mp.constant(RNG.random(64, dtype=np.float32)) for _ in range(4)]
    outs = [f(x) for x in xs]
    runner = the_graph_runner(runners)
    assert runner.captured and runner.launches == 3
    for x, out in zip(xs, outs):     # earlier outputs survive the later launches
        np.testing.assert_array_equal(
            np.asarray(out), np.asarray(mp.ops.multiply(mp.ops.exp(mp.ops.negative(x)), 2.0)))


def test_a_host_upload_stays_out_of_the_graph(runners: list[Any]) -> None:
    import cupy as cp

    def fn(t: Any) -> Any:
        c = mp.constant(np.arange(64, dtype=np.float32))
        return mp.ops.add(mp.ops.exp(mp.ops.negative(t)), mp.ops.multiply(c, 3.0))

    f = mp.function(fn)
    for n in range(4):
        x = mp.constant(RNG.random(64, dtype=np.float32))
        got = np.asarray(f(x))
        cp.asarray(np.full(64, 7.0 + n, np.float32))  # recycles CuPy's pinned staging buffers
        np.testing.assert_array_equal(got, np.asarray(fn(x)))
    runner = the_graph_runner(runners)
    upload = next(n for n, s in enumerate(runner.program.steps) if s.name == "asarray")
    assert upload in runner.plan.host and runner.captured


def test_dropout_draws_fresh_numbers_between_graph_launches(runners: list[Any]) -> None:
    def fn(t: Any) -> Any:
        return mp.ops.exp(mp.ops.negative(mp.ops.dropout(mp.ops.tanh(mp.ops.abs(t)), 0.5)))

    x = mp.constant(RNG.random(256, dtype=np.float32))
    mp.random.set_seed(5)
    f = mp.function(fn)
    traced = [np.asarray(f(x)) for _ in range(4)]
    mp.random.set_seed(5)
    eager = [np.asarray(fn(x)) for _ in range(4)]
    for a, b in zip(traced, eager):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(traced[2], traced[3])
    assert the_graph_runner(runners).captured


def test_capture_can_be_turned_off(runners: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(graphs.ENV, "0")
    same_training("float32", XS)
    assert runners and all(getattr(r, "captured", None) is False for r in runners)
    assert not any(isinstance(r, graphs.GraphRunner) for r in runners)


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_fit_with_jit_compile_equals_eager_fit(runners: list[Any], policy: str) -> None:
    x = np.concatenate(XS_BAD if policy == "mixed_float16" else XS)
    y = np.concatenate(YS)
    results = []
    for jit in (False, True):
        model, opt = mlp_and_optimizer(policy)
        model.compile(loss="sparse_categorical_crossentropy", optimizer=opt,
                      metrics=["accuracy"], jit_compile=jit)
        history = model.fit(x, y, batch_size=32, epochs=2, verbose=0, shuffle=False)
        results.append((history.history, model.get_weights()))
    np.testing.assert_array_equal(np.array(results[0][0]["loss"]),
                                  np.array(results[1][0]["loss"]))
    for a, b in zip(results[0][1], results[1][1], strict=True):
        np.testing.assert_array_equal(a, b)
    the_graph_runner(runners)       # the train step's (fit traces other steps too)
    assert any(r.captured for r in runners if isinstance(r, graphs.GraphRunner))
