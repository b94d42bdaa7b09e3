"""A LossScaleOptimizer counts in ``iterations`` only the steps it applies, as Keras 3 does,
eagerly and in a recorded step (the count gated on the device by the finite flag), with a
dynamic, a fixed and a user's loss scale, and under gradient accumulation.

Keras 3 (keras/src/optimizers/loss_scale_optimizer.py at commit 3422977a): ``_common_apply``
(lines 244-252) calls ``_stateful_handle_finite_grads`` (218-237), which calls
``self.inner_optimizer.apply`` (221-223), only where ``check_finite`` holds;
``_stateful_handle_non_finite_grads`` (239-242) assigns only ``step_counter`` and
``dynamic_scale``; ``iterations`` is the inner optimizer's (309-311), incremented only by
``BaseOptimizer.apply`` (keras/src/optimizers/base_optimizer.py, line 533). So a skipped step
leaves ``iterations`` as it was, and Adam's bias correction and a schedule see, after it, the
step they would have seen without it. (tf-keras' LossScaleOptimizer incremented it there.)"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from conftest import available_backends

import mpcore as mp
from mpcore.optimizers import schedules
from mpcore.plugins.registry import backend_scope

BACKENDS = available_backends("cpu", "opencl")
GRADS = [1.0, 2.0, np.inf, 0.5, np.nan, 1.5]          # two skipped steps


class _UsersScale(mp.FixedLossScale):
    """A LossScale with its own ``update`` (called with the flag on the host)."""

    def update(self, grads_finite: Any) -> bool:
        return super().update(grads_finite)


def _scale(kind: str) -> Any:
    return {"dynamic": "dynamic", "fixed": 8.0, "user": _UsersScale(8.0)}[kind]


def _adam() -> mp.optimizers.Optimizer:
    return mp.optimizers.Adam(schedules.ExponentialDecay(0.1, 1, 0.5))


def _run(backend: str, kind: str, traced: bool, grads: list[float],
         wrapped: bool = True) -> tuple[np.ndarray, int, int]:
    with backend_scope(backend):
        w = mp.Variable([1.0, -2.0])
        opt = mp.LossScaleOptimizer(_adam(), _scale(kind)) if wrapped else _adam()

        def step(x: mp.Tensor) -> Any:
            with mp.GradientTape() as tape:
                loss = mp.ops.sum(w * x)
                if wrapped:
                    loss = opt.get_scaled_loss(loss)
            g = tape.gradient(loss, [w])
            if wrapped:
                g = opt.get_unscaled_gradients(g)
            return opt.apply_gradients(zip(g, [w]))

        fn = mp.function(step) if traced else step
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)     # inf * 0 in a skipped step
            for value in grads:
                fn(mp.constant([value, value]))
        skipped = opt.skipped_steps if wrapped else 0
        return w.numpy(), opt.iterations, skipped


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("kind", ["dynamic", "fixed", "user"])
def test_a_skipped_step_is_not_counted_as_in_keras_3(backend: str, traced: bool,
                                                     kind: str) -> None:
    weights, iterations, skipped = _run(backend, kind, traced, GRADS)
    assert (iterations, skipped) == (4, 2)
    # Adam (its step t) and the schedule (its step) saw the finite steps alone: the weights
    # are those of the plain optimizer given only them (the scales are powers of 2: exact)
    finite = [g for g in GRADS if np.isfinite(g)]
    plain, count, _ = _run(backend, kind, traced, finite, wrapped=False)
    assert count == 4
    np.testing.assert_array_equal(weights, plain)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_recorded_count_is_gated_on_the_device(backend: str,
                                                   host_reads: list[str]) -> None:
    with backend_scope(backend):
        opt = mp.LossScaleOptimizer(_adam(), "dynamic")
        w = mp.Variable([1.0, -2.0])

        @mp.function
        def step(x: mp.Tensor) -> Any:
            return opt.apply_gradients(zip(opt.get_unscaled_gradients([x]), [w]))

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for value in (1.0, 1.0, 1.0):
                step(mp.constant([value, value]))
            host_reads.clear()
            for value in (np.inf, 1.0, np.nan, 1.0):
                step(mp.constant([value, value]))
        assert host_reads == [] and "[kept whole]" not in str(step.graph)
        assert opt.iterations == 5 and int(opt.iterations_variable.numpy()) == 5
        assert opt.skipped_steps == 2


@pytest.mark.usefixtures("on_cpu")  # counts the CPU's host reads
def test_an_eager_step_knows_its_count_from_the_flag_it_read(host_reads: list[str]) -> None:
    opt = mp.LossScaleOptimizer(_adam(), "dynamic")
    w = mp.Variable([1.0, -2.0])
    for value, count in ((1.0, 1), (np.inf, 1), (1.0, 2)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            host_reads.clear()
            opt.apply_gradients(zip(opt.get_unscaled_gradients([mp.constant([value] * 2)]),
                                    [w]))
        assert host_reads[0] == "cpu"             # the flag (a skipped step: the scale too)
        host_reads.clear()
        assert opt.iterations == count and host_reads == []     # the count: no read


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_an_accumulated_step_with_a_non_finite_micro_step_is_not_counted(traced: bool) -> None:
    opt = mp.LossScaleOptimizer(mp.optimizers.SGD(0.1, gradient_accumulation_steps=2),
                                "dynamic")
    w = mp.Variable([1.0])

    def step(x: mp.Tensor) -> Any:
        return opt.apply_gradients(zip(opt.get_unscaled_gradients([x]), [w]))

    fn = mp.function(step) if traced else step
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for value in (1.0, np.inf, 1.0, 1.0, 1.0, 1.0):    # updates at calls 2 (skipped), 4, 6
            fn(mp.constant([value]))
    assert opt.iterations == 2 and opt.skipped_steps == 1
