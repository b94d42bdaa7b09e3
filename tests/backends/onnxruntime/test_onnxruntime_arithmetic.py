"""The ONNX Runtime provider's float16 ``add``/``subtract``/``multiply`` of large arrays
(mpcore_onnxruntime.arithmetic): computed in float32 between two vectorised conversions, they
must give NumPy's float16 loops' bits (which compute in float32 and round once), special values
and broadcasting included; small, mixed-dtype and scalar operands keep the CPU's kernel.
Skipped, with the reason, where onnxruntime is not installed."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from conftest import assert_same_bits
from hypothesis import given, settings
from hypothesis import strategies as st
from mpcore_cpu import CpuBackend
from mpcore_onnxruntime import MIN_ELEMENTS
from mpcore_onnxruntime.arithmetic import NAMES, WidenedArithmetic

import mpcore as mp
from mpcore.plugins.extras import install_command

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None,
                                 reason="onnxruntime is not installed: "
                                        + install_command("onnxruntime")),
              pytest.mark.usefixtures("on_cpu")]

F16 = np.dtype(np.float16)


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> CpuBackend:
    monkeypatch.setenv("MPCORE_ONNXRUNTIME", "auto")
    return CpuBackend()


def _same(got: np.ndarray, a: np.ndarray, b: np.ndarray, want: np.ndarray) -> None:
    """NumPy's bits, except where both operands are NaN: IEEE 754 lets the result be either
    NaN (NumPy's scalar float16 loop returns the second, the float32 SIMD add the first), so
    there it only needs to be a NaN."""
    a, b = np.broadcast_arrays(a, b)
    both = np.isnan(a) & np.isnan(b)
    assert np.isnan(got[both]).all()
    assert_same_bits(got[~both], want[~both])


def _halves(n: int, seed: int) -> np.ndarray:
    """Random float16 bit patterns: every class of value (subnormals, infinities, NaNs, large
    values whose sums and products overflow), as often as the patterns give them."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**16, n, dtype=np.uint16).view(F16)


@pytest.mark.parametrize("name", NAMES)
def test_large_float16_operands_give_numpys_bits(backend: CpuBackend, name: str) -> None:
    kernel = backend.kernels()[name]
    assert isinstance(kernel, WidenedArithmetic)
    a, b = _halves(MIN_ELEMENTS * 4, 1), _halves(MIN_ELEMENTS * 4, 2)
    with np.errstate(all="ignore"):
        want = getattr(np, name)(a, b)
    _same(kernel(a, b), a, b, want)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shapes", [((256, 128), (128,)), ((1, 128), (256, 128)),
                                    ((64, 1, 32), (1, 16, 32))], ids=str)
def test_broadcasting_operands(backend: CpuBackend, name: str,
                               shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    a = _halves(int(np.prod(shapes[0])), 3).reshape(shapes[0])
    b = _halves(int(np.prod(shapes[1])), 4).reshape(shapes[1])
    with np.errstate(all="ignore"):
        want = getattr(np, name)(a, b)
    got = backend.kernels()[name](a, b)
    assert got.shape == want.shape
    _same(got, a, b, want)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**16 - 1), st.integers(0, 2**16 - 1), st.sampled_from(NAMES))
def test_any_pair_of_values(a_bits: int, b_bits: int, name: str) -> None:
    # one pair broadcast over a large array: the float32 route, compared with NumPy's loop
    kernel = CpuBackend().kernels()[name]
    a = np.full(MIN_ELEMENTS, a_bits, np.uint16).view(F16)
    b = np.full(MIN_ELEMENTS, b_bits, np.uint16).view(F16)
    with np.errstate(all="ignore"):
        want = getattr(np, name)(a, b)
    _same(kernel(a, b), a, b, want)


def test_small_mixed_and_scalar_operands_keep_the_cpu_kernel(backend: CpuBackend) -> None:
    kernel = backend.kernels()["add"]
    calls: list[tuple[object, object]] = []
    previous = kernel.previous
    kernel.previous = lambda a, b: calls.append((a, b)) or previous(a, b)
    small = np.ones(8, F16)
    big = np.ones(MIN_ELEMENTS, F16)
    kernel(small, small)
    kernel(big, np.float16(2.0))
    kernel(big.astype(np.float32), big.astype(np.float32))
    assert len(calls) == 3


def test_a_mixed_float16_train_step_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    # the same residual step with the provider and without it (MPCORE_ONNXRUNTIME=off): the
    # same bits, as the conversions and the float16 arithmetic are NumPy's bit for bit
    from mpcore import layers

    def run(setting: str) -> tuple[list[np.ndarray], int]:
        monkeypatch.setenv("MPCORE_ONNXRUNTIME", setting)
        backend = CpuBackend()
        mp.set_backend(backend)
        mp.set_global_policy("mixed_float16")
        try:
            inputs = mp.Input((64, 64))
            h = layers.Dense(64, kernel_initializer="glorot_uniform")(inputs)
            h = layers.add([h, inputs])
            out = layers.Dense(4)(layers.Flatten()(h))
            model = mp.Model(inputs, out)
            rng = np.random.default_rng(0)
            for v in model.trainable_variables:
                v.assign(rng.standard_normal(v.shape).astype(np.float32) * 0.1)
            model.compile(optimizer=mp.optimizers.SGD(0.01),
                          loss=mp.losses.SparseCategoricalCrossentropy(from_logits=True))
            x = rng.standard_normal((32, 64, 64)).astype(np.float32)
            y = rng.integers(0, 4, 32)
            model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
            widened = getattr(backend.kernels()["add"], "calls", 0)
            return [v.numpy().copy() for v in model.trainable_variables], widened
        finally:
            mp.set_global_policy(None)

    (fast, widened), (plain, none) = run("auto"), run("off")
    assert widened > 0 and none == 0
    for a, b in zip(fast, plain):
        np.testing.assert_array_equal(a, b)
