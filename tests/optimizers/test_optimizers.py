"""Optimizers: Keras' formulas, fused kernel path == composite op path, skipped steps leave
everything untouched, schedules; LossScaleOptimizer per the contract."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import mpcore as mp
from mpcore import optimizers
from mpcore.optimizers.loss_scale_optimizer import LossScaleOptimizer

RNG = np.random.default_rng(2)

CASES = {
    "sgd": lambda: optimizers.SGD(0.1),
    "sgd_momentum": lambda: optimizers.SGD(0.1, momentum=0.9),
    "sgd_nesterov": lambda: optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    "rmsprop": lambda: optimizers.RMSprop(0.01),
    "rmsprop_momentum": lambda: optimizers.RMSprop(0.01, momentum=0.5),
    "adam": lambda: optimizers.Adam(0.01),
    "adamw": lambda: optimizers.AdamW(0.01, weight_decay=0.1),
}


def _run(opt: optimizers.Optimizer, fused: bool, steps: int = 4,
         flags: list[bool] | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    opt.use_fused_kernels = fused
    var = mp.Variable(W0)
    for i in range(steps):
        grad = mp.constant(GRADS[i])
        if flags is None:
            opt.apply_gradients([(grad, var)])
        else:
            opt._apply([grad], [var], mp.constant(flags[i]))
    return np.array(var.numpy()), [np.array(s.numpy()) for s in opt.variables()]


W0 = RNG.standard_normal((3, 4)).astype(np.float32)
GRADS = [RNG.standard_normal((3, 4)).astype(np.float32) for _ in range(6)]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.usefixtures("on_cpu")   # the CPU kernels' promise (OpenCL's differ by an ulp)
def test_fused_kernel_and_composite_paths_agree(case: str) -> None:
    assert "sgd_update" in mp.get_backend("cpu").kernels()
    fused, fused_slots = _run(CASES[case](), True)
    composite, composite_slots = _run(CASES[case](), False)
    np.testing.assert_array_equal(fused, composite)
    for a, b in zip(fused_slots, composite_slots):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("fused", [True, False])
def test_false_flag_leaves_variables_and_slots_untouched(case: str, fused: bool) -> None:
    flags = [True, False, True, False]
    got, slots = _run(CASES[case](), fused, flags=flags)
    opt = CASES[case]()
    opt.use_fused_kernels = fused
    var = mp.Variable(W0)
    for i, flag in enumerate(flags):
        if flag:
            opt.iterations = i  # the same step number as the flagged run
            opt.apply_gradients([(mp.constant(GRADS[i]), var)])
    np.testing.assert_array_equal(got, np.asarray(var))
    for a, b in zip(slots, opt.variables()):
        np.testing.assert_array_equal(a, np.asarray(b))


def _keras_reference(case: str, steps: int) -> np.ndarray:
    w = W0.astype(np.float64)
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t in range(1, steps + 1):
        g = GRADS[t - 1].astype(np.float64)
        if case == "sgd":
            w = w - 0.1 * g
        elif case == "sgd_momentum":
            m = 0.9 * m - 0.1 * g
            w = w + m
        elif case == "sgd_nesterov":
            m = 0.9 * m - 0.1 * g
            w = w + 0.9 * m - 0.1 * g
        elif case == "rmsprop":
            v = 0.9 * v + 0.1 * g * g
            w = w - 0.01 * g / np.sqrt(v + 1e-7)
        elif case == "rmsprop_momentum":
            v = 0.9 * v + 0.1 * g * g
            m = 0.5 * m + 0.01 * g / np.sqrt(v + 1e-7)
            w = w - m
        else:
            if case == "adamw":
                w = w - 0.01 * 0.1 * w
            m = m + (g - m) * 0.1
            v = v + (g * g - v) * 0.001
            alpha = 0.01 * math.sqrt(1 - 0.999**t) / (1 - 0.9**t)
            w = w - alpha * m / (np.sqrt(v) + 1e-7)
    return w


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_keras_formulas(case: str) -> None:
    got, _ = _run(CASES[case](), True, steps=4)
    np.testing.assert_allclose(got, _keras_reference(case, 4), rtol=2e-5, atol=2e-6)


def test_learning_rate_schedule_is_called_with_iterations() -> None:
    seen = []

    def schedule(step: int) -> float:
        seen.append(step)
        return 0.1 / (1 + step)

    opt = optimizers.SGD(schedule)
    var = mp.Variable([1.0])
    for _ in range(3):
        opt.apply_gradients([(mp.constant([1.0]), var)])
    assert seen == [0, 1, 2]
    assert float(var.numpy()[0]) == pytest.approx(1 - 0.1 - 0.05 - 0.1 / 3, rel=1e-6)


def test_optimizer_errors() -> None:
    with pytest.raises(ValueError, match="valid names: adam, adamw, rmsprop, sgd"):
        optimizers.get("adagradx")
    with pytest.raises(ValueError, match="learning_rate"):
        optimizers.SGD(-1.0)
    with pytest.raises(ValueError, match="shape"):
        optimizers.SGD().apply_gradients([(mp.constant([1.0, 2.0]), mp.Variable([1.0]))])
    with pytest.raises(TypeError, match="Variable"):
        optimizers.SGD().apply_gradients([(mp.constant([1.0]), mp.constant([1.0]))])


# --- LossScaleOptimizer --------------------------------------------------------------------------
def test_lso_scaled_loss_and_unscaled_gradients() -> None:
    opt = LossScaleOptimizer(optimizers.SGD(0.1), loss_scale=1024)
    assert isinstance(opt.loss_scale, mp.FixedLossScale)
    assert float(opt.get_scaled_loss(mp.constant(2.0))) == 2048.0
    g16 = mp.constant([1024.0, 2048.0], dtype="float16")
    out = opt.get_unscaled_gradients([g16, None])
    assert out[1] is None
    assert out[0].dtype == "float32"
    np.testing.assert_array_equal(np.asarray(out[0]), [1.0, 2.0])
    assert isinstance(LossScaleOptimizer(optimizers.SGD()).loss_scale, mp.DynamicLossScale)


def test_lso_skips_non_finite_steps_and_counts_them() -> None:
    opt = LossScaleOptimizer(optimizers.Adam(0.1),
                             mp.DynamicLossScale(initial_loss_scale=8.0, increment_period=2))
    var = mp.Variable([1.0, 2.0])
    before = np.array(var.numpy())
    grads = opt.get_unscaled_gradients([mp.constant([np.inf, 1.0], dtype="float16")])
    assert opt.apply_gradients(zip(grads, [var])) is False
    np.testing.assert_array_equal(np.asarray(var), before)
    np.testing.assert_array_equal(np.asarray(opt.get_slot(var, "m")), [0.0, 0.0])
    # Keras 3 counts no skipped step in iterations
    assert opt.iterations == 0 and opt.skipped_steps == 1 and opt.loss_scale() == 4.0
    grads = opt.get_unscaled_gradients([mp.constant([4.0, 4.0])])
    assert opt.apply_gradients(zip(grads, [var])) is True
    assert opt.iterations == 1 and opt.skipped_steps == 1
    assert not np.array_equal(np.asarray(var), before)
    nan = opt.get_unscaled_gradients([mp.constant([np.nan, 0.0])])
    assert opt.apply_gradients(zip(nan, [var])) is False
    assert opt.skipped_steps == 2


def test_lso_reads_the_flag_once_per_step() -> None:
    reads = []

    class CountingScale(mp.FixedLossScale):
        def update(self, grads_finite: object) -> bool:
            reads.append(grads_finite)
            return super().update(grads_finite)

    opt = LossScaleOptimizer(optimizers.RMSprop(), CountingScale(4.0))
    var = mp.Variable([1.0])
    grads = opt.get_unscaled_gradients([mp.constant([4.0])])
    opt.apply_gradients(zip(grads, [var]))
    assert len(reads) == 1 and isinstance(reads[0], mp.Tensor)


def test_lso_type_errors_and_warning() -> None:
    inner = optimizers.SGD()
    lso = LossScaleOptimizer(inner)
    with pytest.raises(TypeError, match="another LossScaleOptimizer"):
        LossScaleOptimizer(lso)
    with pytest.raises(TypeError, match="Optimizer"):
        LossScaleOptimizer("sgd")  # type: ignore[arg-type]
    var = mp.Variable([1.0])
    with pytest.warns(UserWarning, match=r"You forgot to call LossScaleOptimizer"
                                         r"\.get_scaled_loss\(\) and"):
        assert lso.apply_gradients([(mp.constant([np.inf]), var)]) is False
    assert float(var.numpy()[0]) == 1.0
    lso = LossScaleOptimizer(optimizers.SGD())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lso.get_scaled_loss(mp.constant(1.0))
        grads = lso.get_unscaled_gradients([mp.constant([1.0])])
        lso.apply_gradients(zip(grads, [var]))


def test_lso_custom_loop_with_mixed_float16_dense() -> None:
    mp.set_global_policy("mixed_float16")
    layer = mp.layers.Dense(3)
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    layer(x)
    opt = LossScaleOptimizer(optimizers.SGD(0.1))
    with mp.GradientTape() as tape:
        loss = mp.ops.mean(mp.ops.square(mp.ops.cast(layer(x), "float32")))
        scaled = opt.get_scaled_loss(loss)
    grads = opt.get_unscaled_gradients(tape.gradient(scaled, layer.trainable_variables))
    assert all(g.dtype == "float32" for g in grads)
    assert opt.apply_gradients(zip(grads, layer.trainable_variables))
    assert layer.kernel.dtype == "float32"


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("case", ["sgd_momentum", "rmsprop", "adam"])
def test_a_plain_optimizer_never_applies_a_non_finite_step(case: str, fused: bool) -> None:
    # DESIGN: "a NaN/Inf step never touches the weights", with or without loss scaling.
    opt = CASES[case]()
    opt.use_fused_kernels = fused
    var = mp.Variable([1.0, 2.0, 3.0])
    assert opt.apply_gradients([(mp.constant([0.1, 0.2, 0.3]), var)])
    before = var.numpy().copy()
    slots = [s.numpy().copy() for s in opt.variables()]
    applied = opt.apply_gradients([(mp.constant([0.1, float("nan"), 0.3]), var)])
    assert not applied
    np.testing.assert_array_equal(var.numpy(), before)
    for slot, old in zip(opt.variables(), slots):
        np.testing.assert_array_equal(slot.numpy(), old)
    assert opt.apply_gradients([(mp.constant([0.1, 0.2, 0.3]), var)])
    assert not np.array_equal(var.numpy(), before)


def test_lso_checks_gradients_changed_after_unscaling() -> None:
    # The flag of get_unscaled_gradients vouches for the tensors it returned only: a gradient
    # the caller changed afterwards (here made infinite) is checked again before applying.
    opt = LossScaleOptimizer(optimizers.SGD(0.1), loss_scale=8.0)
    var = mp.Variable([1.0, 2.0])
    grads = opt.get_unscaled_gradients([mp.constant([8.0, 8.0])])
    assert opt.apply_gradients(zip([grads[0] * float("inf")], [var])) is False
    np.testing.assert_array_equal(var.numpy(), [1.0, 2.0])
    assert opt.skipped_steps == 1
    grads = opt.get_unscaled_gradients([mp.constant([8.0, 8.0])])
    assert opt.apply_gradients(zip([grads[0] * 0.5], [var])) is True  # changed, finite
    np.testing.assert_allclose(var.numpy(), [0.95, 1.95])
