"""Warnings Keras and tf.function give that mpcore lacked (issue 33, item 10): excessive
retracing (tf.function's, once, after 5 retraces), variables without gradients (Keras 3's
"Gradients do not exist for variables ... when minimizing the loss"), and warnings raised in a
traced step's replay naming the user's line, not ``<mpcore traced step>``."""

from __future__ import annotations

import warnings

import numpy as np

import mpcore as mp


def _caught(fn: object, *args: object) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn(*args)  # type: ignore[operator]
    return list(caught)


def test_retracing_for_new_shapes_is_warned_once_after_five_retraces() -> None:
    @mp.function
    def double(x: mp.Tensor) -> mp.Tensor:
        return x * 2.0

    messages = []
    for n in range(1, 40):                      # 39 shapes: 39 traces
        messages += [str(w.message) for w in _caught(double, mp.constant(np.ones(n, "f")))
                     if "retracing" in str(w.message)]
    assert double.tracing_count == 39
    assert len(messages) == 1
    assert messages[0].startswith("5 calls to double triggered mpcore.function retracing")
    assert "pad or bucket the batches" in messages[0]


def test_replays_and_one_signature_do_not_warn() -> None:
    @mp.function
    def double(x: mp.Tensor) -> mp.Tensor:
        return x * 2.0

    for _ in range(10):
        assert not [w for w in _caught(double, mp.constant(np.ones(3, "f")))
                    if "retracing" in str(w.message)]


def test_variables_without_gradients_are_named() -> None:
    used, unused = mp.Variable([1.0], name="used"), mp.Variable([2.0], name="unused")
    with mp.GradientTape() as tape:
        loss = mp.ops.sum(used * 3.0)
    grads = tape.gradient(loss, [used, unused])
    caught = _caught(mp.optimizers.SGD(0.1).apply_gradients, zip(grads, [used, unused]))
    assert [str(w.message) for w in caught] == [
        "Gradients do not exist for variables ['unused'] when minimizing the loss. If using "
        "`model.compile()`, did you forget to provide a `loss` argument?"]
    assert caught[0].filename == __file__
    np.testing.assert_allclose(used.numpy(), [0.7], rtol=1e-6)
    assert unused.numpy()[0] == 2.0


def test_a_warning_from_a_replayed_call_names_the_users_line() -> None:
    """The replay is compiled code named ``<mpcore traced step>``: a warning of a call it
    replays (here Adam's apply_gradients with a schedule written in Python, kept whole) named
    that pseudo-file."""
    v, w = mp.Variable([1.0], name="v"), mp.Variable([2.0], name="w")
    opt = mp.optimizers.Adam(lambda step: 0.1)

    @mp.function
    def step(x: mp.Tensor) -> mp.Tensor:
        with mp.GradientTape() as tape:
            loss = mp.ops.sum(v * x)
        opt.apply_gradients(zip(tape.gradient(loss, [v, w]), [v, w]))
        return loss

    x = mp.constant([1.0])
    for _ in range(3):                # variables made, a trace, then replays
        caught = [c for c in _caught(step, x) if "Gradients do not exist" in str(c.message)]
        assert [c.filename for c in caught] == [__file__]
    assert step.tracing_count == 1 and step.graph is not None   # two replays
