"""The ONNX Runtime conversion provider for the CPU backend (mpcore_onnxruntime): its float16
<-> float32 conversions must be NumPy's ``astype`` bit for bit, so that a training step with it
is the same step, only faster. Skipped, with the reason, where onnxruntime is not installed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import mpcore_cpu.creation as cpu_creation
import mpcore_onnxruntime
import numpy as np
import pytest
from conftest import assert_same_bits
from mpcore_cpu import CpuBackend
from mpcore_onnxruntime import MIN_ELEMENTS, FastCast, cast_model

import mpcore as mp
from mpcore.plugins.extras import install_command

pytestmark = pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None,
                                reason="onnxruntime is not installed: "
                                       + install_command("onnxruntime"))

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)


@pytest.fixture
def fast() -> FastCast:
    return FastCast(cpu_creation.convert)


def test_every_float16_to_float32(fast: FastCast) -> None:
    every = np.arange(2**16, dtype=np.uint16).view(F16)
    assert_same_bits(fast(every, F32), every.astype(F32))
    assert fast.calls == 1


def test_float32_to_float16_rounding_overflow_subnormals_and_specials(fast: FastCast) -> None:
    rng = np.random.default_rng(0)
    special = np.array([0.0, -0.0, 1e-8, -1e-8, 2.98e-8, 2.9802322e-8, 5.96e-8, 6.1e-5,
                        65504.0, 65519.99, 65520.0, -7e4, 1e38, np.inf, -np.inf, np.nan,
                        -np.nan, 1.0 + 2**-11, 1.0 + 3 * 2**-11], F32)   # ties round to even
    patterns = rng.integers(0, 2**32, 300_000, dtype=np.uint32).view(F32)
    # every float16 value and the midpoints between neighbours (ties), as float32
    halves = np.arange(2**16, dtype=np.uint16).view(F16).astype(F32)
    with np.errstate(all="ignore"):   # inf and NaN neighbours make NaN midpoints: fine
        mids = ((halves[:-1].astype(np.float64) + halves[1:]) / 2).astype(F32)
        x = np.concatenate([special, patterns, halves, mids])
        want = x.astype(F16)
    assert_same_bits(fast(x, F16), want)


def test_shapes_small_arrays_views_and_other_dtypes_fall_back(fast: FastCast) -> None:
    x = np.random.default_rng(1).standard_normal((3, 128, 64), dtype=F32)
    got = fast(x, F16)
    assert got.shape == x.shape and fast.calls == 1
    assert_same_bits(got, x.astype(F16))
    for other in (x[:1, :2], x[:, ::2], x.astype(np.float64)):
        assert_same_bits(fast(other, F16), other.astype(F16))
    assert_same_bits(fast(x, "float64"), x.astype(np.float64))
    assert fast.calls == 1   # below MIN_ELEMENTS, strided, or not float16/float32: NumPy
    assert x[:1, :2].size < MIN_ELEMENTS


def test_results_land_in_the_allocated_arrays() -> None:
    given: list[np.ndarray] = []

    def alloc(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        given.append(np.empty(shape, dtype))
        return given[-1]

    fast = FastCast(cpu_creation.convert, alloc)
    x = np.linspace(-3, 3, MIN_ELEMENTS, dtype=F32)
    out = fast(x, F16)
    assert out is given[0]
    assert_same_bits(out, x.astype(F16))


def test_the_model_is_a_valid_onnx_cast() -> None:
    import onnxruntime as ort

    sess = ort.InferenceSession(cast_model(F32, F16), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["x"]
    assert sess.get_inputs()[0].type == "tensor(float)"
    assert sess.get_outputs()[0].type == "tensor(float16)"


def test_the_cpu_backend_converts_through_it() -> None:
    be = CpuBackend()
    assert "mpcore_onnxruntime" in [s.provider for s in be.kernel_sets]
    fast = be.kernels()["convert"]
    before = fast.calls
    x = np.random.default_rng(2).standard_normal((256, 256), dtype=F32)
    assert_same_bits(be.cast(x, "float16"), x.astype(F16))
    h = x.astype(F16)
    assert_same_bits(be.matmul(h, h, False, True), (h.astype(F32) @ h.astype(F32).T).astype(F16))
    assert fast.calls >= before + 3   # the cast, the operand upcast and the rounding
    assert "used" in mpcore_onnxruntime.status()


def _train(steps: int) -> list[np.ndarray]:
    """A few mixed_float16 Model.fit steps of a small MLP with dropout; the weights after."""
    mp.set_global_policy("mixed_float16")
    mp.random.set_seed(0)   # the same initial weights in every process
    try:
        rng = np.random.default_rng(3)
        inputs = mp.Input(shape=(256,))
        h = mp.layers.Dense(256, activation="relu")(inputs)
        h = mp.layers.Dropout(0.1, seed=1)(h)
        h = mp.layers.Dense(10)(h)
        outputs = mp.layers.Activation("softmax", dtype="float32")(h)
        model = mp.Model(inputs=inputs, outputs=outputs)
        model.compile(loss="sparse_categorical_crossentropy",
                      optimizer=mp.optimizers.RMSprop())
        x = rng.random((128 * steps, 256), dtype=np.float32)
        y = rng.integers(0, 10, 128 * steps)
        model.fit(x, y, batch_size=128, epochs=1, verbose=0, shuffle=False)
        return [np.array(w) for w in model.get_weights()]
    finally:
        mp.set_global_policy("float32")


def test_training_with_it_is_the_same_training(tmp_path: Path) -> None:
    """Bit for bit the same weights after mixed_float16 steps with and without the provider
    (each in its own process: the kernel table is made once per backend)."""
    here = Path(__file__).parent  # this module, and tests/ for the conftest it imports
    code = (f"import sys, numpy as np; sys.path[:0] = {[str(here), str(here.parents[1])]!r};"
            "from test_onnxruntime import _train; import mpcore as mp;"
            "w = _train(3); np.savez(sys.argv[1], *w);"
            "print([s.provider for s in mp.get_backend().kernel_sets])")
    runs = {}
    for setting in ("auto", "off"):
        path = tmp_path / f"{setting}.npz"
        env = {**os.environ, "MPCORE_ONNXRUNTIME": setting, "MPCORE_BACKEND": "cpu"}
        proc = subprocess.run([sys.executable, "-c", code, str(path)],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert ("mpcore_onnxruntime" in proc.stdout) == (setting == "auto")
        with np.load(path) as data:
            runs[setting] = [data[k] for k in data.files]
    for a, b in zip(runs["auto"], runs["off"], strict=True):
        assert np.array_equal(a, b)


def test_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPCORE_ONNXRUNTIME", "sometimes")
    with pytest.raises(ValueError, match=r"MPCORE_ONNXRUNTIME='sometimes'.*auto, off"):
        mpcore_onnxruntime.mpcore_kernels(CpuBackend())
    monkeypatch.setenv("MPCORE_ONNXRUNTIME", "off")
    be = CpuBackend()
    chain = [be.kernels().get("convert")]   # oneDNN may still convert bfloat16
    while hasattr(chain[-1], "fallback"):
        chain.append(chain[-1].fallback)
    assert not any(isinstance(k, mpcore_onnxruntime.FastCast) for k in chain)
    assert mpcore_onnxruntime.status().startswith("off")


def test_import_mpcore_does_not_import_onnxruntime() -> None:
    out = subprocess.run([sys.executable, "-c", "import sys, mpcore; mp = mpcore;"
                          "print('onnxruntime' in sys.modules)"],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
