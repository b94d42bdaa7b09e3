"""The inspector's FP8 view: each GEMM operand of the step scaled as a recipe would scale it,
with the share of values FP8 saturates or flushes to zero; gradients in the backward format."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import mpcore as mp
from mpcore.core.tensor import Tensor
from mpcore.debugging.float8_gemms import recipe_scale
from mpcore.mixed_precision import CurrentScaling, DelayedScaling


def _model(policy: str = "float32") -> mp.Model:
    with mp.policy_scope(policy):
        inputs = mp.Input((20,))
        x = mp.layers.Dense(16, activation="relu", name="hidden")(inputs)
        outputs = mp.layers.Dense(4, name="logits")(x)
    model = mp.Model(inputs, outputs)
    model.compile(loss="sparse_categorical_crossentropy", optimizer="sgd")
    return model


def _batch(scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return ((rng.standard_normal((32, 20)) * scale).astype(np.float32),
            rng.integers(0, 4, 32))


def test_forward_and_backward_operands_in_their_formats() -> None:
    report = mp.debugging.inspect_numerics(_model(), *_batch(), float8_recipe=CurrentScaling())
    ops = report.float8_gemms
    forward = [o for o in ops if o.phase == "forward"]
    assert {(o.layer, o.operand) for o in forward} == {("hidden", 0), ("hidden", 1),
                                                       ("logits", 0), ("logits", 1)}
    assert all(o.format == "float8_e4m3fn" and not o.gradient for o in forward)
    backward = [o for o in ops if o.phase == "backward"]
    grads = [o for o in backward if o.gradient]
    # dgrad (g w^T) and wgrad (x^T g) of each layer read one gradient each (the first
    # layer's dgrad is not computed: its input needs no gradient; the bias gradient's
    # ones @ g is no FP8 GEMM)
    assert [(o.layer, o.operand) for o in grads] == [("logits", 0), ("logits", 1),
                                                     ("hidden", 1)]
    assert all(o.format == "float8_e5m2" for o in grads) and len(backward) == 6
    assert all(o.format == "float8_e4m3fn" for o in backward if not o.gradient)
    # current scaling from the operand's own amax: nothing saturates
    assert all(o.overflow == 0.0 for o in ops)
    assert all(o.scale == 2.0 ** np.floor(np.log2(448.0 / o.amax)) for o in forward)
    assert "most affected" in report.float8_table()
    assert json.loads(report.to_json())["float8_gemms"][0]["format"] == "float8_e4m3fn"


def _hidden_gradient(monkeypatch: pytest.MonkeyPatch,
                     extra: Callable[[Tensor, Tensor], Tensor]) -> None:
    """Hand the hidden layer's weight-gradient GEMM the gradient ``extra(dz, y)`` returns, in
    place of relu's backward ``dz`` (``y``: the layer's forward output)."""
    real = mp.ops.nn.relu_grad_bias

    def relu_grad_bias(g: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        dz, db = real(g, y)
        return extra(dz, y), db

    monkeypatch.setattr(mp.ops.nn, "relu_grad_bias", relu_grad_bias)


@pytest.mark.usefixtures("on_cpu")  # the CPU's relu_grad_bias route is patched
def test_a_gradient_at_the_address_of_a_dead_value_is_a_gradient(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The flaky failure, made to happen: a value of the backward pass (a mask of the forward
    # output, as the loss's clip gradient makes) dies, and the gradient the wgrad GEMM reads
    # is a new tensor at its address, as CPython's allocator gave it in a full-suite run. The
    # inspector once told values by id() alone and took that gradient for a value.
    found: list[bool] = []

    def at_a_dead_value(dz: Tensor, y: Tensor) -> Tensor:
        mask = mp.ops.greater(y, 0.0)   # computed from a value only: a value
        dead = id(mask)
        del mask
        held = []   # kept alive, so each try takes another free block; freed ones go first
        while len(held) < 100_000:
            t = Tensor(dz._data, dz._backend, dz._dtype)
            if id(t) == dead:
                found.append(True)
                return t
            held.append(t)
        pytest.fail("the allocator never reused the dead mask's address: the test set-up "
                    "does not hold on this interpreter")

    _hidden_gradient(monkeypatch, at_a_dead_value)
    report = mp.debugging.inspect_numerics(_model(), *_batch(), float8_recipe=CurrentScaling())
    assert found
    grads = [(o.layer, o.operand) for o in report.float8_gemms if o.gradient]
    assert grads == [("logits", 0), ("logits", 1), ("hidden", 1)]


@pytest.mark.usefixtures("on_cpu")  # the CPU's relu_grad_bias route is patched
def test_ops_of_another_thread_are_not_the_inspected_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the per-op hook is a module global that every thread's ops call: a thread computing
    # while the step is inspected (a data loader's, one an earlier test left running) ran
    # into the report as ops of "other", its GEMMs into the FP8 view
    seen: list[Any] = []

    def with_a_thread(dz: Tensor, y: Tensor) -> Tensor:
        def work() -> None:
            a = mp.constant(np.ones((4, 4), np.float32))
            seen.append(mp.ops.matmul(a, a))
            with mp.GradientTape() as tape:
                tape.watch(a)
                b = mp.ops.sum(mp.ops.matmul(a, a))
            seen.append(tape.gradient(b, a))

        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        return dz

    _hidden_gradient(monkeypatch, with_a_thread)
    report = mp.debugging.inspect_numerics(_model(), *_batch(), float8_recipe=CurrentScaling())
    assert len(seen) == 2   # the thread ran its ops while the inspector watched
    assert {r.layer for r in report.ops} <= {"hidden", "logits", "loss"}
    assert {o.layer for o in report.float8_gemms} == {"hidden", "logits"}
    assert len(report.float8_gemms) == 10


def test_underflow_is_measured_against_ml_dtypes() -> None:
    x, y = _batch()
    x[:, 0] = 1e6            # one large feature: the others flush to zero after scaling
    report = mp.debugging.inspect_numerics(_model(), x, y,
                                           float8_recipe=CurrentScaling(margin=0))
    first = next(o for o in report.float8_gemms if o.layer == "hidden" and o.operand == 0)
    scaled = (np.abs(x[x != 0]) * np.float32(first.scale)).astype(np.float32)
    want = np.mean(scaled.astype(ml_dtypes.float8_e4m3fn).astype(np.float32) == 0)
    assert first.underflow == pytest.approx(want) and first.underflow > 0.5


def test_delayed_scaling_without_power_of_two_and_a_mixed_float8_model() -> None:
    model = _model("mixed_float8")
    model(np.zeros((1, 20), np.float32))
    report = mp.debugging.inspect_numerics(model, *_batch(),
                                           float8_recipe=DelayedScaling(margin=1))
    o = report.float8_gemms[0]
    assert o.scale == 448.0 / o.amax / 2
    assert all(v.numpy().max() == 1.0 for v in model.non_trainable_weights
               if v.name.endswith("_scale"))   # the inspection changed no state


def test_no_recipe_no_view_and_bad_recipes() -> None:
    assert mp.debugging.inspect_numerics(_model(), *_batch()).float8_gemms == []
    with pytest.raises(ValueError, match="CurrentScaling, a DelayedScaling"):
        mp.debugging.inspect_numerics(_model(), *_batch(), float8_recipe="hybrid")


def test_recipe_scale_is_the_largest_power_of_two_that_fits() -> None:
    recipe = CurrentScaling()
    for amax in (448.0, 449.0, 1.0, 3.0, 2.0 ** -30, 1e30):
        s = recipe_scale(amax, 448.0, recipe)
        assert amax * s <= 448.0 < amax * s * 2
    assert recipe_scale(0.0, 448.0, recipe) == 1.0


def test_the_table_names_no_operand_most_affected_when_none_is() -> None:
    from mpcore.debugging.float8_gemms import Float8Operand, table

    def operand(layer: str, overflow: float, underflow: float) -> Float8Operand:
        return Float8Operand(layer, "forward", "dense", 0, False, "float8_e4m3fn", 1.0, 256.0,
                             overflow, underflow)

    clean = table([operand("first", 0.0, 0.0), operand("second", 0.0, 0.0)])
    assert clean.splitlines()[-1] == ("most affected: none (no operand saturates or flushes a "
                                      "value to zero)")
    assert table([operand("first", 0.0, 0.0), operand("second", 0.0, 0.25)]).splitlines()[
        -1] == "most affected: second (forward dense, value operand 0)"
