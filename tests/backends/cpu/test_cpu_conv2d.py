"""``mp.ops.conv2d`` on the CPU backend and its gradients, against a float64 NumPy reference, by
both routes: the fused ``conv2d`` kernels where the backend has them (the oneDNN provider's,
unless MPCORE_ONEDNN=off) and the im2col composite (those kernels taken out of the table), for
stride 1 and 2, valid and same padding, odd sizes, 1x1 and 3x3 windows, 1 to 64 channels."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import mpcore as mp

pytestmark = pytest.mark.usefixtures("on_cpu")

FUSED = ("conv2d", "conv2d_backprop_input", "conv2d_backprop_filter")

# (N, H, W, C, filters, window, stride, padding)
GEOMETRIES = [
    (2, 7, 9, 3, 5, 3, 1, "same"),
    (2, 7, 9, 3, 5, 3, 2, "same"),
    (3, 8, 8, 16, 16, 3, 1, "valid"),
    (2, 9, 7, 16, 32, 3, 2, "valid"),
    (2, 6, 5, 1, 16, 3, 1, "same"),
    (1, 5, 5, 64, 64, 3, 2, "same"),
    (2, 7, 7, 16, 32, 1, 2, "same"),
    (2, 5, 6, 64, 16, 1, 1, "valid"),
]


@pytest.fixture(params=["fused", "composite"])
def route(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The route conv2d takes: the backend's fused kernels (skipped where it has none, as with
    MPCORE_ONEDNN=off) or the composite (the fused kernels taken out of the table)."""
    table = mp.get_backend("cpu").kernels()
    has = all(name in table for name in FUSED)
    if request.param == "fused" and not has:
        pytest.skip("the CPU backend has no fused conv2d kernels here (oneDNN off or missing)")
    if request.param == "composite":
        for name in FUSED:
            monkeypatch.delitem(table, name, raising=False)
    yield request.param


def _pad(x: np.ndarray, k: int, stride: int, padding: str) -> np.ndarray:
    if padding == "valid":
        return x
    _, h, w, _ = x.shape
    oh, ow = -(-h // stride), -(-w // stride)
    ph, pw = max((oh - 1) * stride + k - h, 0), max((ow - 1) * stride + k - w, 0)
    return np.pad(x, ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))


def reference(x: np.ndarray, w: np.ndarray, dy: np.ndarray | None, stride: int,
              padding: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(y, dx, dw) in float64 by direct loops over the window; dy defaults to ones."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    k = w.shape[0]
    xp = _pad(x, k, stride, padding)
    oh, ow = (xp.shape[1] - k) // stride + 1, (xp.shape[2] - k) // stride + 1
    y = np.zeros((x.shape[0], oh, ow, w.shape[3]))
    g = np.ones_like(y) if dy is None else dy.astype(np.float64)
    dxp = np.zeros_like(xp)
    dw = np.zeros_like(w)
    for i in range(k):
        for j in range(k):
            window = xp[:, i:i + stride * oh:stride, j:j + stride * ow:stride, :]
            y += window @ w[i, j]
            dxp[:, i:i + stride * oh:stride, j:j + stride * ow:stride, :] += g @ w[i, j].T
            dw[i, j] = np.einsum("nhwc,nhwf->cf", window, g)
    top = (xp.shape[1] - x.shape[1]) // 2
    left = (xp.shape[2] - x.shape[2]) // 2
    dx = dxp[:, top:top + x.shape[1], left:left + x.shape[2], :]
    return y, dx, dw


def _run(x: np.ndarray, w: np.ndarray, dy: np.ndarray, stride: int, padding: str,
         dtype: str) -> tuple[np.ndarray, ...]:
    xv, wv = mp.Variable(x, dtype=dtype), mp.Variable(w, dtype=dtype)
    with mp.GradientTape() as tape:
        y = mp.ops.conv2d(xv, wv, stride, padding)
        loss = mp.ops.sum(mp.ops.cast(y, "float32") * mp.constant(dy))
    dx, dw = tape.gradient(loss, [xv, wv])
    return tuple(np.asarray(t).astype(np.float64) for t in (y, dx, dw))


def _close(got: np.ndarray, want: np.ndarray, magnitude: np.ndarray, eps: float,
           what: str) -> None:
    """Within ``eps`` (the dtype's resolution, a few times) of the sum of magnitudes."""
    bound = eps * (magnitude + np.abs(want)) + 1e-30
    bad = np.abs(got - want) > bound
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} values off; worst "
                           f"{np.max(np.abs(got - want) / bound):.2f}x the bound")


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_conv2d_and_its_gradients_match_float64(route: str, geometry: tuple[Any, ...],
                                                dtype: str) -> None:
    n, h, w, c, f, k, stride, padding = geometry
    rng = np.random.default_rng(sum(geometry[:6]))
    low = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    # operands exact in the dtype, so the reference sees what the kernels see
    x = rng.uniform(-2, 2, (n, h, w, c)).astype(low).astype(np.float32)
    kernel = rng.uniform(-1, 1, (k, k, c, f)).astype(low).astype(np.float32)
    y0 = reference(x, kernel, None, stride, padding)[0]
    dy = rng.uniform(-1, 1, y0.shape).astype(low).astype(np.float32)
    want = reference(x, kernel, dy, stride, padding)
    mags = reference(np.abs(x), np.abs(kernel), np.abs(dy), stride, padding)
    got = _run(x, kernel, dy, stride, padding, dtype)
    # float32 accumulation, each result rounded once to the dtype; the composite's col2im adds
    # the image gradient's k*k window terms in the dtype, rounding each time
    eps = 4 * float(np.finfo(low).eps)
    for name, g, wv, m in zip(("y", "dx", "dw"), got, want, mags):
        assert g.shape == wv.shape, name
        scale = k * k if name == "dx" and route == "composite" else 1
        _close(g, wv, m, eps * scale, f"{route} {dtype} {name}")


def test_fused_conv2d_is_one_recorded_op(route: str) -> None:
    x = mp.Variable(np.ones((1, 4, 4, 2), np.float32))
    w = mp.Variable(np.ones((3, 3, 2, 3), np.float32))
    with mp.GradientTape(persistent=True) as tape:
        mp.ops.conv2d(x, w, 1, "same")
        ops = [node.op for node in tape._nodes]
    if route == "fused":
        assert ops == ["conv2d"]
    else:
        assert "conv2d" not in ops and "extract_patches" in ops


@pytest.mark.parametrize("stride,padding", [(1, "same"), (2, "valid")])
def test_gradient_of_the_gradient(route: str, stride: int, padding: str) -> None:
    """d/dkernel of |d loss/d image|^2 and d/dimage of |d loss/d kernel|^2: under a recording
    tape the fused gradient is built of differentiable ops; both routes agree with float64."""
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, (2, 6, 5, 3))
    w = rng.uniform(-1, 1, (3, 3, 3, 4))

    def second(dtype: str) -> tuple[np.ndarray, np.ndarray]:
        xv, wv = mp.Variable(x, dtype=dtype), mp.Variable(w, dtype=dtype)
        with mp.GradientTape(persistent=True) as outer:
            with mp.GradientTape() as inner:
                y = mp.ops.conv2d(xv, wv, stride, padding)
                loss = mp.ops.sum(y * y)
            dx, dw = inner.gradient(loss, [xv, wv])
            a, b = mp.ops.sum(dx * dx), mp.ops.sum(dw * dw)
        return (np.asarray(outer.gradient(a, wv), np.float64),
                np.asarray(outer.gradient(b, xv), np.float64))

    got = second("float32")
    want = second("float64")   # float64: the composite everywhere (no oneDNN float64)
    for g, wv in zip(got, want):
        np.testing.assert_allclose(g, wv, rtol=2e-4, atol=2e-4 * np.abs(wv).max())
