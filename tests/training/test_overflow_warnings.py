"""A loss-scale overflow is routine: the all-finite check skips the step, and the CPU's GEMM
and softmax/cross-entropy kernels print no NumPy warning about the Inf/NaN it makes (NumPy's
would name a line of mpcore's kernels, not anything of the user's). Elementwise and reduction
kernels keep NumPy's float32 warnings (see test_traced_program's non-finite step)."""

from __future__ import annotations

import numpy as np
import pytest
from mpcore_cpu import CpuBackend

import mpcore as mp
from mpcore import layers

pytestmark = [pytest.mark.usefixtures("on_cpu"), pytest.mark.filterwarnings("error")]


def _fit(jit: bool, inputs_inf: bool) -> mp.mixed_precision.DynamicLossScale:
    mp.set_global_policy("mixed_float16")
    mp.random.set_seed(1)
    model = mp.Sequential([mp.Input((8,)), layers.Dense(16, activation="relu"), layers.Dense(4),
                           layers.Activation("softmax", dtype="float32")])
    scale = mp.mixed_precision.DynamicLossScale(initial_loss_scale=2**30)
    opt = mp.mixed_precision.LossScaleOptimizer(mp.optimizers.SGD(0.01), scale)
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, jit_compile=jit)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype(np.float32) * 100
    if inputs_inf:
        x[3, 1] = np.inf
    model.fit(x, rng.integers(0, 4, 64), batch_size=16, epochs=1, verbose=0)
    return scale


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("inputs_inf", [False, True], ids=["overflow", "inf-input"])
def test_a_skipped_step_prints_no_numpy_warning(jit: bool, inputs_inf: bool) -> None:
    try:
        scale = _fit(jit, inputs_inf)
    finally:
        mp.set_global_policy("float32")
    # every step overflowed at 2**30 and was skipped: the scale halved each time
    assert scale() == 2**30 / 2**4


def test_softmax_and_cross_entropy_of_non_finite_logits_are_quiet() -> None:
    cpu = CpuBackend()
    logits = np.array([[np.inf, 1.0, -np.inf], [np.nan, 0.0, 2.0]], np.float32)
    assert np.isnan(cpu.softmax(logits, -1)[0]).any()
    assert np.isnan(cpu.log_softmax(logits, -1)[0]).any()
    loss, probs = cpu.sparse_softmax_cross_entropy(logits, np.array([0, 2]))
    assert np.isnan(loss).all()
    grad = cpu.sparse_softmax_cross_entropy_grad(probs, np.array([0, 2]),
                                                 np.array([np.inf, 0.0], np.float32))
    assert np.isnan(grad).any()
    w = np.array([[np.inf], [0.0]], np.float32)
    assert np.isnan(cpu.matmul(np.array([[0.0, 1.0]], np.float32), w, False, False)).all()
    out = cpu.dense(np.array([[1.0, 0.0]], np.float16), w.astype(np.float16),
                    np.array([-np.inf], np.float16), None)
    assert np.isnan(out).all()
