"""The oneDNN provider's convolution kernels (``conv2d``, ``conv2d_backprop_input``,
``conv2d_backprop_filter``): oneDNN's primitives for float32 and bfloat16 against a float64
reference, the composite for everything else, a failing primitive falling back (logged, never
fatal), the MPCORE_ONEDNN_FLOAT32 switch, and a traced step replaying them."""

from __future__ import annotations

import logging
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from mpcore_cpu import CpuBackend
from mpcore_onednn.conv import output_shape
from mpcore_onednn.dnnl import DnnlError
from onednn_isa import library_or_skip

import mpcore as mp

pytestmark = pytest.mark.usefixtures("on_cpu")

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)

# (x shape, kernel shape, stride, pads (top, bottom, left, right)) as ops.image computes them
PROBLEMS = [
    ((2, 7, 9, 3), (3, 3, 3, 5), 1, (1, 1, 1, 1)),
    ((2, 7, 9, 3), (3, 3, 3, 5), 2, (1, 1, 1, 1)),
    ((2, 8, 8, 16), (3, 3, 16, 32), 2, (0, 1, 0, 1)),
    ((3, 5, 6, 1), (1, 1, 1, 4), 1, (0, 0, 0, 0)),
    ((2, 6, 6, 64), (3, 3, 64, 64), 1, (0, 0, 0, 0)),
    ((2, 7, 7, 16), (1, 1, 16, 32), 2, (0, 0, 0, 0)),
]


def _kernels(monkeypatch: pytest.MonkeyPatch, float32: str = "on") -> tuple[CpuBackend, Any]:
    """A fresh CPU backend with the provider's kernels (MPCORE_ONEDNN=force: bfloat16 too, on
    any CPU with a oneDNN that has it) and their ConvKernels."""
    library_or_skip()
    monkeypatch.setenv("MPCORE_ONEDNN", "force")
    monkeypatch.setenv("MPCORE_ONEDNN_FLOAT32", float32)
    backend = CpuBackend()
    kernel = backend.kernels().get("conv2d")
    if kernel is None:
        pytest.skip("the oneDNN provider installed no convolution kernels")
    return backend, kernel.conv


def _reference(x: np.ndarray, w: np.ndarray, dy: np.ndarray, stride: int,
               pads: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """(y, dx, dw) in float64, by loops over the window."""
    top, bottom, left, right = pads
    x, w, dy = (a.astype(np.float64) for a in (x, w, dy))
    xp = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
    k = w.shape[0]
    oh, ow = dy.shape[1], dy.shape[2]
    y = np.zeros(dy.shape)
    dxp = np.zeros_like(xp)
    dw = np.zeros_like(w)
    for i in range(k):
        for j in range(w.shape[1]):
            win = (slice(None), slice(i, i + stride * oh, stride),
                   slice(j, j + stride * ow, stride))
            y += xp[win] @ w[i, j]
            dxp[win] += dy @ w[i, j].T
            dw[i, j] = np.einsum("nhwc,nhwf->cf", xp[win], dy)
    return y, dxp[:, top:top + x.shape[1], left:left + x.shape[2]], dw


def _operands(x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: int,
              pads: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(sum(x_shape) + sum(w_shape))
    x = rng.uniform(-2, 2, x_shape).astype(dtype)
    w = rng.uniform(-1, 1, w_shape).astype(dtype)
    dy = rng.uniform(-1, 1, output_shape(x_shape, w_shape, stride, stride, pads)).astype(dtype)
    return x, w, dy


def _check(got: np.ndarray, want: np.ndarray, magnitude: np.ndarray, dtype: np.dtype,
           what: str) -> None:
    assert got.dtype == dtype and got.shape == want.shape, what
    bound = 4 * float(np.finfo(dtype).eps) * (magnitude + np.abs(want)) + 1e-30
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= bound).all(), f"{what}: worst {np.max(err / bound):.2f}x the bound"


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: f"{p[0]}-{p[1]}-s{p[2]}")
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["float32", "bfloat16"])
def test_primitives_match_float64(monkeypatch: pytest.MonkeyPatch, problem: Any,
                                  dtype: np.dtype) -> None:
    _, conv = _kernels(monkeypatch)
    x_shape, w_shape, s, pads = problem
    x, w, dy = _operands(x_shape, w_shape, s, pads, dtype)
    want = _reference(x, w, dy, s, pads)
    mags = _reference(np.abs(x.astype(F32)), np.abs(w.astype(F32)), np.abs(dy.astype(F32)), s,
                      pads)
    got = (conv.conv2d(x, w, s, s, pads), conv.conv2d_backprop_input(dy, w, x_shape, s, s, pads),
           conv.conv2d_backprop_filter(x, dy, w_shape, s, s, pads))
    for name, g, wv, m in zip(("conv2d", "backprop_input", "backprop_filter"), got, want, mags):
        _check(g, wv, m, dtype, f"{name} {dtype.name}")
    if dtype in conv.dtypes:
        assert not conv.failures
        assert len(conv.cache) == 3, "not run by oneDNN"


def test_float32_primitives_are_not_the_reference_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ResNet's 3x3 problems get oneDNN's JIT kernels (the kernel reordered to the layout
    they want), not its reference loops nor, here, its im2col GEMM fallback."""
    _, conv = _kernels(monkeypatch)
    for kind in ("forward", "backward_data", "backward_weights"):
        impl = conv.cache.implementation(kind, (64, 14, 14, 32), (3, 3, 32, 32), 1, 1,
                                         (1, 1, 1, 1), "float32")
        assert "ref" not in impl, impl
        if conv.cache.library.isa.startswith("avx512"):
            assert "gemm" not in impl, impl


def test_float64_takes_the_composite(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, conv = _kernels(monkeypatch)
    dtype = np.dtype(np.float64)
    x, w, dy = _operands((2, 5, 6, 3), (3, 3, 3, 4), 1, (1, 1, 1, 1), dtype)
    got = conv.conv2d(x, w, 1, 1, (1, 1, 1, 1))
    cols = backend.extract_patches(x, 3, 3, 1, 1, (1, 1, 1, 1)).reshape(-1, 27)
    want = backend.kernels()["matmul"](cols, w.reshape(27, 4), False, False)
    np.testing.assert_array_equal(got, want.reshape(got.shape))
    assert conv.conv2d_backprop_input(dy, w, x.shape, 1, 1, (1, 1, 1, 1)).dtype == dtype
    assert conv.conv2d_backprop_filter(x, dy, w.shape, 1, 1, (1, 1, 1, 1)).shape == w.shape
    assert len(conv.cache) == 0


def test_float16_runs_as_float32_rounded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # no float16 convolution without avx512_fp16: widened operands, the float32 primitive,
    # the result rounded once to float16 (as the GEMMs treat float16)
    _, conv = _kernels(monkeypatch)
    f16 = np.dtype(np.float16)
    x, w, dy = _operands((2, 5, 6, 3), (3, 3, 3, 4), 1, (1, 1, 1, 1), f16)
    pads = (1, 1, 1, 1)
    cases = [(conv.conv2d(x, w, 1, 1, pads), conv.conv2d(x.astype(F32), w.astype(F32), 1, 1,
                                                          pads)),
             (conv.conv2d_backprop_input(dy, w, x.shape, 1, 1, pads),
              conv.conv2d_backprop_input(dy.astype(F32), w.astype(F32), x.shape, 1, 1, pads)),
             (conv.conv2d_backprop_filter(x, dy, w.shape, 1, 1, pads),
              conv.conv2d_backprop_filter(x.astype(F32), dy.astype(F32), w.shape, 1, 1, pads))]
    for got, wide in cases:
        assert got.dtype == f16
        np.testing.assert_array_equal(got, wide.astype(f16))
    assert len(conv.cache) > 0


def test_a_failing_primitive_falls_back_logged_and_is_not_retried(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    _, conv = _kernels(monkeypatch)
    calls = []

    def broken(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        raise DnnlError("dnnl_convolution_forward_primitive_desc_create failed: "
                        "dnnl_unimplemented")

    monkeypatch.setattr(conv.cache, "forward", broken)
    x, w, _ = _operands((2, 5, 6, 3), (3, 3, 3, 4), 1, (1, 1, 1, 1), F32)
    with caplog.at_level(logging.WARNING, logger="mpcore"):
        first = conv.conv2d(x, w, 1, 1, (1, 1, 1, 1))
        second = conv.conv2d(x, w, 1, 1, (1, 1, 1, 1))
    assert len(calls) == 1 and len(conv.failures) == 1
    assert "dnnl_unimplemented" in caplog.text and "composite" in caplog.text
    want = _reference(x, w, np.ones(first.shape, F32), 1, (1, 1, 1, 1))[0]
    np.testing.assert_allclose(first, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(first, second)


def test_float32_off_leaves_float32_to_the_composite(monkeypatch: pytest.MonkeyPatch) -> None:
    _, conv = _kernels(monkeypatch, float32="off")
    assert "float32" not in conv.dtypes.values()
    x, w, _ = _operands((2, 5, 6, 3), (3, 3, 3, 4), 1, (1, 1, 1, 1), F32)
    conv.conv2d(x, w, 1, 1, (1, 1, 1, 1))
    assert len(conv.cache) == 0


def test_a_traced_step_replays_the_fused_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, conv = _kernels(monkeypatch)
    mp.set_backend(backend)
    x0, w0, _ = _operands((2, 7, 7, 3), (3, 3, 3, 4), 2, (1, 1, 1, 1), F32)
    x, w = mp.Variable(x0), mp.Variable(w0)

    def step() -> Any:
        with mp.GradientTape() as tape:
            loss = mp.ops.sum(mp.ops.square(mp.ops.conv2d(x, w, 2, "same")))
        return tape.gradient(loss, [x, w])

    traced = mp.function(step)
    for _ in range(3):
        got = traced()
    want = step()
    for g, wv in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(wv))
    assert len(conv.cache) == 3
