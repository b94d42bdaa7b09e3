"""Native-half (cl_khr_fp16) OpenCL kernels, on a real OpenCL device that has cl_khr_fp16 (here:
Intel's CPU runtime from PyPI; PoCL lacks the extension), and the MPCORE_OPENCL_HALF choice.

The generic suite's float16 cases and the guide's MNIST bar run in a subprocess with
MPCORE_OPENCL_DEVICE and MPCORE_OPENCL_HALF=native set, because the registered backend and its
device are chosen once per process. In-process checks use fresh ``OpenCLBackend`` instances.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
from conftest import REPO_ROOT, check_close, rounded
from mpcore_opencl import OpenCLBackend
from mpcore_opencl.half import HALF_MODES, HalfMeasurement, measure_half_variants

import mpcore as mp

ROOT = REPO_ROOT
INSTALL = "pip install intel-opencl-rt intel-cmplr-lib-rt"


def _devices() -> list[Any]:
    try:
        be = mp.get_backend("opencl")
    except mp.BackendUnavailableError:   # PyOpenCL not installed (a GPU machine's image)
        return []
    try:
        return be.devices()
    except Exception:  # a driver that fails to enumerate offers no device
        return []


def _fp16_index() -> str | None:
    found = [d.index for d in _devices() if "cl_khr_fp16" in d.features]
    return found[0] if found else None


FP16_INDEX = _fp16_index()
if FP16_INDEX is None and os.environ.get("MPCORE_TEST_REQUIRE_FP16") == "1":
    # CI installs Intel's runtime for these tests: a silent skip there would hide a failure
    raise RuntimeError(f"MPCORE_TEST_REQUIRE_FP16=1 but no OpenCL device has cl_khr_fp16 "
                       f"(devices: {[(d.index, d.name) for d in _devices()]}); {INSTALL}")
needs_fp16 = pytest.mark.skipif(FP16_INDEX is None,
                                reason=f"no OpenCL device with cl_khr_fp16; {INSTALL}")
needs_opencl = pytest.mark.skipif(not _devices(), reason="no OpenCL device here")
_NO_FP16 = next((d.index for d in _devices() if "cl_khr_fp16" not in d.features), None)


def fresh(monkeypatch: pytest.MonkeyPatch, device: str | None, half: str | None,
          activate: bool = True) -> Any:
    """A new OpenCLBackend on ``device`` with MPCORE_OPENCL_HALF=``half`` (unset: None),
    activated (which settles a non-measured half choice) unless ``activate`` is False."""
    for var, value in (("MPCORE_OPENCL_DEVICE", device), ("MPCORE_OPENCL_HALF", half)):
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value)
    be = OpenCLBackend()
    if activate:
        be.kernels()
    return be


def run_suite(args: list[str], half: str = "native") -> str:
    """pytest ``args`` in a subprocess on the cl_khr_fp16 device; its output (it must pass)."""
    assert FP16_INDEX is not None
    env = {**os.environ, "MPCORE_OPENCL_DEVICE": FP16_INDEX, "MPCORE_OPENCL_HALF": half}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return proc.stdout


def passed(output: str) -> int:
    found = re.search(r"(\d+) passed", output)
    return int(found.group(1)) if found else 0


# --- the generic suite with native half --------------------------------------------------
@needs_fp16
def test_generic_float16_ops_and_gradients_with_native_half() -> None:
    """Every float16 op-forward, gradient and layer case of the backend-generic suite, plus
    the OpenCL kernel tests' float16 cases, with the native-half kernels: within the same
    float16 tolerances as the CPU backend."""
    out = run_suite(["tests/core/test_ops.py", "tests/core/test_ops_rules.py",
                     "tests/core/test_gradients.py", "tests/training/test_layers.py",
                     "tests/backends/opencl/test_opencl.py",
                     "tests/backends/opencl/test_opencl_steps.py", "-k", "opencl and float16"])
    assert passed(out) >= 100, out[-2000:]


@needs_fp16
def test_guide_mnist_bar_with_native_half() -> None:
    """The guide's model on the shared MNIST data reaches test_opencl_steps' bar (>= 0.88)
    with mixed_float16 and native half, as do the loss-scaled training steps."""
    out = run_suite(["tests/backends/opencl/test_opencl_steps.py", "-s", "-k",
                     "guide_mnist_accuracy_bar or training_step_mixed_float16 or "
                     "bad_label_step"])
    assert passed(out) >= 2, out[-2000:]


# --- native kernels in-process -----------------------------------------------------------
@needs_fp16
@pytest.mark.parametrize("variant", ["packed", "tiled"])
def test_native_gemm_accumulates_in_float32(monkeypatch: pytest.MonkeyPatch,
                                            variant: str) -> None:
    """Half tiles/panels, float32 accumulation: a long dot product of float16 values keeps
    float32 accuracy (a half accumulator would be off by far more than the tolerance)."""
    be = fresh(monkeypatch, FP16_INDEX, "native")
    be.gemm_variant = variant
    rng = np.random.default_rng(0)
    for ta, tb in ((False, False), (True, True)):
        a = rounded(rng.uniform(0, 1, (2, 2048, 37) if ta else (2, 37, 2048)), "float16")
        b = rounded(rng.uniform(0, 1, (2, 41, 2048) if tb else (2, 2048, 41)), "float16")
        got = be.to_host(be.matmul(be.asarray(a, "float16"), be.asarray(b, "float16"), ta, tb))
        want = (np.swapaxes(a, 1, 2) if ta else a) @ (np.swapaxes(b, 1, 2) if tb else b)
        check_close(got, want, "float16")
    programs = [key for key in be.runtime._programs if key[0] == "gemm.cl"]
    assert programs and all(key[-1] for key in programs)  # built as native-half programs


@needs_fp16
def test_native_elementwise_and_reductions_match_convert(monkeypatch: pytest.MonkeyPatch) -> None:
    native = fresh(monkeypatch, FP16_INDEX, "native")
    convert = fresh(monkeypatch, FP16_INDEX, "convert")
    assert native.half_choice().native and not convert.half_choice().native
    rng = np.random.default_rng(1)
    x = rounded(rng.standard_normal((64, 33)) * 3, "float16")
    y = rounded(rng.standard_normal((64, 33)), "float16")
    bias = rounded(rng.standard_normal(33), "float16")
    for be in (native, convert):
        dx, dy = be.asarray(x, "float16"), be.asarray(y, "float16")
        for op in ("add", "multiply", "divide", "maximum"):
            check_close(be.to_host(getattr(be, op)(dx, dy)),
                        getattr(np, op)(x, y), "float16")
        check_close(be.to_host(be.multiply(dx, 0.1)), x * rounded(0.1, "float16"), "float16")
        for op in ("exp", "tanh", "sigmoid", "relu", "sqrt"):
            want = {"sigmoid": lambda v: 1 / (1 + np.exp(-v)), "relu": lambda v: np.maximum(v, 0),
                    "sqrt": lambda v: np.sqrt(np.abs(v))}.get(op, getattr(np, op, None))
            arg = be.abs(dx) if op == "sqrt" else dx
            with np.errstate(over="ignore"):  # exp overflows float16 to inf, as on the CPU
                check_close(be.to_host(getattr(be, op)(arg)), rounded(want(x), "float16"),
                            "float16", scale=2)
        check_close(be.to_host(be.bias_add(dx, be.asarray(bias, "float16"))), x + bias,
                    "float16")
        # sums of 64 x 33 values: float32 accumulation, one rounding at the end
        check_close(be.to_host(be.sum(dx, None, False)), x.sum(), "float16")
        check_close(be.to_host(be.mean(dx, (0,), False)), x.mean(0), "float16")
        check_close(be.to_host(be.softmax(dx, 1)), np.exp(x) / np.exp(x).sum(1, keepdims=True),
                    "float16")
        cast = be.to_host(be.cast(be.asarray(np.float32([70000, 1e-8, 0.1]), "float32"),
                                  "float16"))
        with np.errstate(over="ignore"):
            assert np.array_equal(cast, np.float32([70000, 1e-8, 0.1]).astype(np.float16))
    assert any(key[-1] for key in native.runtime._programs)
    assert not any(key[-1] for key in convert.runtime._programs)


# --- MPCORE_OPENCL_HALF: values, errors, the auto decision ------------------------------
@needs_opencl
def test_invalid_half_mode_names_the_valid_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    be = fresh(monkeypatch, None, "fast", activate=False)
    with pytest.raises(ValueError, match=r"MPCORE_OPENCL_HALF='fast'.*auto, native, convert"):
        be.kernels()
    assert HALF_MODES == ("auto", "native", "convert")


@pytest.mark.skipif(_NO_FP16 is None, reason="no OpenCL device without cl_khr_fp16 here")
def test_native_on_a_device_without_fp16_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    be = fresh(monkeypatch, _NO_FP16, "native", activate=False)
    with pytest.raises(ValueError, match=r"MPCORE_OPENCL_HALF=native needs cl_khr_fp16.*lacks"
                                         r".*MPCORE_OPENCL_DEVICE"):
        be.kernels()
    auto = fresh(monkeypatch, _NO_FP16, None)
    assert not auto.half_choice().native and "lacks cl_khr_fp16" in auto.half_choice().reason
    with pytest.raises(ValueError, match="lacks cl_khr_fp16"):
        measure_half_variants(auto)


@needs_fp16
def test_auto_decides_per_kernel_family_from_one_measurement(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On the real cl_khr_fp16 CPU device: auto measures once, then the elementwise programs
    and the GEMM (with every other program) each run the variant that measured faster, and the
    verdict quotes the figures. Faked figures pin both outcomes of each decision."""
    for gemm_x, ew_x in ((0.7, 2.2), (1.5, 0.8)):
        be = fresh(monkeypatch, FP16_INDEX, "auto", activate=False)
        assert be.device().kind == "cpu"
        fake = HalfMeasurement(be.device().name, 64, 10.0 * gemm_x, 10.0, 1024, 4.0 * ew_x,
                               4.0, 0.01)
        calls: list[Any] = []
        monkeypatch.setattr("mpcore_opencl.half.measure_half_variants",
                            lambda backend, fake=fake, calls=calls, **kw: calls.append(1) or fake)
        choice = be.half_choice()
        assert calls == [1] and choice.measured is fake
        assert choice.native == (gemm_x > 1) and choice.native_elementwise == (ew_x > 1)
        verdict = mp.check_policy("mixed_float16", backend=be)
        assert not verdict.fast and str(fake) in verdict.reason   # a CPU device: never fast
        x = be.asarray(np.array([1.0, 2.0, 3.0, 4.0], np.float16), "float16")
        np.testing.assert_array_equal(be.to_host(be.multiply(x, x)), [1, 4, 9, 16])
        g = be.asarray(np.eye(4, dtype=np.float16), "float16")
        np.testing.assert_array_equal(be.to_host(be.matmul(g, g, False, False)), np.eye(4))
        variants = {key[0]: key[-1] for key in be.runtime._programs}
        assert variants["elementwise.cl"] == choice.native_elementwise
        assert variants["gemm.cl"] == choice.native
        assert len(calls) == 1  # once per device and process


@needs_fp16
def test_measurement_function(monkeypatch: pytest.MonkeyPatch) -> None:
    be = fresh(monkeypatch, FP16_INDEX, None)
    t0 = time.perf_counter()
    m = measure_half_variants(be)
    took = time.perf_counter() - t0
    assert isinstance(m, HalfMeasurement) and m.gemm_n == 512 and m.elements == 1 << 22
    for figure in (m.gemm_native_gflops, m.gemm_convert_gflops, m.ew_native_gbps,
                   m.ew_convert_gbps):
        assert np.isfinite(figure) and figure > 0
    assert m.gemm_native == (m.gemm_speedup > 1.05)
    assert m.elementwise_native == (m.ew_speedup > 1.05)
    assert "GFLOP/s" in str(m) and "GB/s" in str(m)
    print(f"{m.device}: {m} (measured in {m.seconds:.2f} s, {took:.2f} s with program builds)")
    assert m.seconds < 5  # "a second or so" on a GPU; a 2-core CPU device is the slow case


@needs_fp16
def test_auto_on_a_gpu_measures_once_and_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU path of auto, on the real cl_khr_fp16 device described as a GPU: one
    measurement decides, and its figures are in the float16 verdict (check_policy, measure)."""
    be = fresh(monkeypatch, FP16_INDEX, None, activate=False)
    be._device = dataclasses.replace(be.device(), kind="gpu")
    calls: list[HalfMeasurement] = []

    def counted(backend: Any, **kwargs: Any) -> HalfMeasurement:
        calls.append(measure_half_variants(backend, n=256, elements=1 << 20, repeats=2))
        return calls[-1]

    monkeypatch.setattr("mpcore_opencl.half.measure_half_variants", counted)
    verdict = mp.check_policy("mixed_float16", backend=be, measure=True, n=256)
    choice = be.half_choice()
    assert len(calls) == 1 and choice.measured is calls[0]
    assert choice.native == calls[0].gemm_native
    assert choice.native_elementwise == calls[0].elementwise_native
    assert "MPCORE_OPENCL_HALF=auto measured native vs convert" in verdict.reason
    assert f"{choice.variant} GEMM kernels" in verdict.reason
    assert verdict.measured is not None and verdict.measured.gflops > 0
    assert verdict.fast == choice.native  # a GPU with native half throughput (width 32)
    be.matmul(be.asarray(np.ones((4, 4), np.float16), "float16"),
              be.asarray(np.ones((4, 4), np.float16), "float16"), False, False)
    assert len(calls) == 1  # once per device and process
