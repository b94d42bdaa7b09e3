"""Metrics inside traced steps (issue 33, item 1): a metric updated in ``@mp.function`` is
updated at every replay exactly as eagerly, its reset replays, and ``result()`` inside the
step is a device value the step can return (Keras' ``return {m.name: m.result() ...}``)."""

from __future__ import annotations

import numpy as np
import pytest

import mpcore as mp


def test_mean_updated_in_a_traced_step_does_not_freeze(backend: mp.Backend) -> None:
    # the trial's case: Mean read 1.0 after 1, 2, 3, and 0.0 forever after reset_state
    m = mp.metrics.Mean()

    @mp.function
    def step(x: mp.Tensor) -> mp.Tensor:
        m.update_state(x)
        return m.result()

    seen = [float(step(mp.constant(v))) for v in (1.0, 2.0, 3.0, 6.0)]
    assert seen == [1.0, 1.5, 2.0, 3.0]
    assert m.result() == 3.0
    m.reset_state()
    assert m.result() == 0.0
    assert float(step(mp.constant(5.0))) == 5.0
    assert step.tracing_count == 1      # the metric's variables exist before the trace


def test_reset_inside_the_step_replays() -> None:
    m = mp.metrics.Mean()

    @mp.function
    def step(x: mp.Tensor) -> mp.Tensor:
        m.reset_state()
        m.update_state(x)
        return m.result()

    assert [float(step(mp.constant(v))) for v in (4.0, 7.0)] == [4.0, 7.0]


@pytest.mark.parametrize("weighted", [False, True])
def test_traced_metric_equals_eager_bit_for_bit(weighted: bool) -> None:
    rng = np.random.default_rng(5)
    batches = [(rng.integers(0, 4, 16), rng.standard_normal((16, 4)).astype(np.float32),
                rng.random(16).astype(np.float32)) for _ in range(5)]
    results = []
    for traced in (False, True):
        acc, mean = mp.metrics.SparseCategoricalAccuracy(), mp.metrics.Mean()

        def update(y: mp.Tensor, p: mp.Tensor, w: mp.Tensor,
                   acc: mp.metrics.Metric = acc, mean: mp.metrics.Mean = mean) -> mp.Tensor:
            acc.update_state(y, p, w if weighted else None)
            mean.update_state(mp.ops.max(p, axis=-1), w if weighted else None)
            return mean.result()

        fn = mp.function(update) if traced else update
        for y, p, w in batches:
            fn(mp.constant(y), mp.constant(p), mp.constant(w))
        results.append((acc.totals(), mean.totals(), acc.result(), mean.result()))
    assert results[0] == results[1]


def test_keras_result_dict_from_a_traced_step() -> None:
    m = mp.metrics.Mean(name="m")

    @mp.function
    def step(x: mp.Tensor) -> dict[str, mp.Tensor]:
        m.update_state(x)
        return {m.name: m.result()}

    step(mp.constant([1.0, 3.0]))
    out = step(mp.constant([5.0, 7.0]))
    assert float(out["m"]) == 4.0 and m.variables[1].numpy() == 4.0
