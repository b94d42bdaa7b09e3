"""The OpenCL backend: its kernels on the real PoCL device here, its device description and
selection, and its verdict rules for described devices (Arc, UHD, Radeon, NVIDIA, PoCL). Bad
indices, random numbers, loss scaling and training steps: test_opencl_steps.py."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from mpcore_opencl import OpenCLBackend
from mpcore_opencl import devices as cl_devices
from mpcore_opencl.rules import INTEL_MATRIX, opencl_policy_support
from opencl_cases import cl, cpu, host, needs_device  # noqa: F401 - cl, cpu: fixtures

import mpcore as mp
from mpcore.core.backend import Device

BF16 = ml_dtypes.bfloat16


# --- detection, devices, selection ------------------------------------------------------
def test_import_does_not_load_pyopencl() -> None:
    code = ("import sys, mpcore; mpcore.get_backend(); "
            "print('pyopencl' in sys.modules, mpcore.get_backend().name)")
    env = {k: v for k, v in os.environ.items() if k != "MPCORE_BACKEND"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    assert out[0] == "False"


def test_icd_registry_classifies_drivers(tmp_path: Any) -> None:
    (tmp_path / "intel.icd").write_text("libigdrcl.so\n")
    (tmp_path / "pocl.icd").write_text("/usr/lib/libpocl.so.2\n")
    (tmp_path / "nvidia.icd").write_text("libnvidia-opencl.so.1\n")
    icds = {os.path.basename(i.file): i.is_gpu for i in cl_devices.read_icds([str(tmp_path)])}
    assert icds == {"intel.icd": True, "pocl.icd": False, "nvidia.icd": True}


def test_pocl_alone_is_never_auto_selected(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Any) -> None:
    (tmp_path / "pocl.icd").write_text("libpocl.so.2\n")
    monkeypatch.setenv("OCL_ICD_VENDORS", str(tmp_path))
    cl_devices.gpu_driver_present.cache_clear()
    be = OpenCLBackend()  # not get_backend: the rule holds where PyOpenCL is not installed
    try:
        assert not be.auto_select()
        (tmp_path / "amd.icd").write_text("libamdocl64.so\n")
        cl_devices.gpu_driver_present.cache_clear()
        monkeypatch.setattr(cl_devices, "has_gpu_node", lambda: True)
        assert be.auto_select() is be.is_available()
    finally:
        cl_devices.gpu_driver_present.cache_clear()


@needs_device
def test_devices_are_described(cl: Any) -> None:
    devs = cl.devices()
    assert devs and all(":" in d.index for d in devs)
    d = cl.device()
    info = d.describe()
    for key in ("name", "vendor", "kind", "features", "compute_units", "global_memory_bytes",
                "native_vector_width_half", "preferred_vector_width_half", "platform"):
        assert key in info
    assert d.kind in ("cpu", "gpu", "accelerator") and d.details["compute_units"] >= 1


def test_device_choice_prefers_gpu_and_rejects_bad_values() -> None:
    cpu_dev = Device("pocl cpu", kind="cpu", index="0:0", details={"compute_units": 16})
    gpu_dev = Device("Arc A770", kind="gpu", index="1:0", details={"compute_units": 32})
    found = [(cpu_dev, "c"), (gpu_dev, "g")]
    assert cl_devices.choose(found, None)[0] is gpu_dev
    assert cl_devices.choose(found, "0:0")[0] is cpu_dev
    with pytest.raises(ValueError, match=r"valid values.*0:0 = pocl cpu.*1:0 = Arc A770"):
        cl_devices.choose(found, "3:1")


@needs_device
def test_invalid_device_env_names_valid_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    from mpcore_opencl import OpenCLBackend

    monkeypatch.setenv("MPCORE_OPENCL_DEVICE", "9:9")
    with pytest.raises(ValueError, match="0:0"):
        OpenCLBackend().device()
    monkeypatch.setenv("MPCORE_OPENCL_DEVICE", "0:0")
    assert OpenCLBackend().device().index == "0:0"


# --- verdict rules for described devices ---------------------------------------------
def _dev(name: str, vendor: str, kind: str, ext: set[str], half: int = 0) -> Device:
    return Device(name=name, vendor=vendor, kind=kind, features=frozenset(ext),
                  details={"native_vector_width_half": half})


ARC = _dev("Intel(R) Arc(TM) A770 Graphics", "Intel(R) Corporation", "gpu",
           {"cl_khr_fp16", "cl_khr_fp64", INTEL_MATRIX}, half=8)
UHD = _dev("Intel(R) UHD Graphics 770", "Intel(R) Corporation", "gpu", {"cl_khr_fp16"}, half=8)
RX7900 = _dev("gfx1100", "Advanced Micro Devices, Inc.", "gpu", {"cl_khr_fp16", "cl_khr_fp64"})
NVIDIA = _dev("NVIDIA GeForce RTX 3090", "NVIDIA Corporation", "gpu",
              {"cl_khr_fp64", "cl_khr_fp16"})
OLD_GPU = _dev("Some GPU", "Vendor", "gpu", {"cl_khr_fp64"})
POCL = _dev("pthread-Intel(R) Xeon(R)", "GenuineIntel", "cpu", {"cl_khr_fp64"})
#: Intel's CPU runtime (pip install intel-opencl-rt): cl_khr_fp16 and a native half width, on
#: a CPU without AVX512-FP16
INTEL_CPU = _dev("Intel(R) Xeon(R) Processor @ 2.80GHz", "Intel(R) Corporation", "cpu",
                 {"cl_khr_fp16", "cl_khr_fp64", "cl_intel_bfloat16"}, half=32)


@pytest.mark.parametrize(("device", "fp16_hw", "bf16_hw"), [
    (ARC, True, True), (UHD, True, False), (RX7900, True, False), (NVIDIA, False, False),
    (OLD_GPU, False, False), (POCL, False, False), (INTEL_CPU, False, False)])
def test_verdicts_for_described_devices(device: Device, fp16_hw: bool, bf16_hw: bool) -> None:
    """Fast needs the hardware *and* kernels that use it: float16 is fast exactly where the
    hardware has native half throughput and the native-half kernels run there; bfloat16 where
    a matrix engine is exposed and used (no kernels use one yet)."""
    for kernels in (False, True):
        fp16 = opencl_policy_support("mixed_float16", device, native_half_kernels=kernels)
        bf16 = opencl_policy_support("mixed_bfloat16", device, matrix_kernels=kernels)
        assert fp16.supported and bf16.supported
        assert (fp16.fast, bf16.fast) == (fp16_hw and kernels, bf16_hw and kernels)
    assert opencl_policy_support("float32", device).fast
    default = opencl_policy_support("mixed_float16", device)
    assert default == opencl_policy_support("mixed_float16", device, native_half_kernels=True)
    assert not opencl_policy_support("mixed_bfloat16", device).fast


def test_verdict_reasons_say_what_runs() -> None:
    arc16 = opencl_policy_support("mixed_float16", ARC, native_half_kernels=False,
                                  half_note="MPCORE_OPENCL_HALF=convert").reason
    assert "native half throughput" in arc16 and "convert kernels" in arc16
    assert "MPCORE_OPENCL_HALF=convert" in arc16
    for policy, device in [("mixed_float16", ARC), ("mixed_float16", OLD_GPU),
                           ("mixed_bfloat16", ARC), ("mixed_bfloat16", RX7900),
                           ("mixed_float16", POCL)]:
        reason = opencl_policy_support(policy, device, native_half_kernels=False).reason
        assert "halves memory traffic" in reason and "matmuls included" in reason, reason
    assert "runs native-half kernels" in opencl_policy_support(
        "mixed_float16", UHD, native_half_kernels=True).reason
    assert "do not use it" in opencl_policy_support("mixed_bfloat16", ARC).reason
    assert "XMX" in opencl_policy_support("mixed_bfloat16", ARC, matrix_kernels=True).reason
    assert "cl_khr_fp16" in opencl_policy_support("mixed_float16", OLD_GPU).reason
    assert "CPU device" in opencl_policy_support("mixed_float16", POCL).reason
    native_cpu = opencl_policy_support("mixed_float16", INTEL_CPU, half_note="why").reason
    assert "native-half kernels (why)" in native_cpu and "AVX512-FP16" in native_cpu
    convert_cpu = opencl_policy_support("mixed_float16", INTEL_CPU, native_half_kernels=False)
    assert "compute it in float32" in convert_cpu.reason and not convert_cpu.fast
    assert "cuda" in opencl_policy_support("mixed_float16", NVIDIA).reason
    with pytest.raises(ValueError, match="valid names"):
        opencl_policy_support("mixed_float4", ARC)   # mixed_float8 is a policy now


@needs_device
def test_backend_judges_with_its_own_kernels(cl: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A described device (not the backend's own) is judged by what MPCORE_OPENCL_HALF would
    run there; a backend without native-half kernels is never fast on float16."""
    monkeypatch.delenv("MPCORE_OPENCL_HALF", raising=False)
    auto = cl.policy_support("mixed_float16", UHD)
    assert auto.fast and "MPCORE_OPENCL_HALF=auto" in auto.reason
    monkeypatch.setenv("MPCORE_OPENCL_HALF", "convert")
    assert not cl.policy_support("mixed_float16", UHD).fast
    monkeypatch.setenv("MPCORE_OPENCL_HALF", "native")
    assert cl.policy_support("mixed_float16", UHD).fast
    assert not cl.policy_support("mixed_float16", INTEL_CPU).fast
    monkeypatch.setattr(cl, "native_half_kernels", False)
    assert not cl.policy_support("mixed_float16", UHD).fast


@needs_device
def test_check_policy_on_the_real_device(cl: Any) -> None:
    v = mp.check_policy("mixed_float16", backend=cl)
    assert v.supported and not v.fast and "CPU device" in v.reason
    assert "MPCORE_OPENCL_HALF=" in v.reason  # which float16 variant runs, and why


# --- kernels against NumPy --------------------------------------------------------------
@needs_device
@pytest.mark.parametrize(("m", "k", "n"), [
    (5, 7, 40),      # fewer rows than a register block: A packed
    (40, 7, 9),      # fewer columns than a block: B packed
    (6, 3, 16),      # exactly one block, both read in place
    (13, 33, 35),    # A and B in place, their last blocks shifted back to the edge
    (20, 300, 300),  # B above the in-place limit: packed, A in place
    (700, 200, 17),  # A above the in-place limit: packed, B in place
])
@pytest.mark.parametrize(("ta", "tb"), [(False, False), (True, False), (False, True)])
def test_packed_gemm_in_place_and_packed_operands(cl: Any, monkeypatch: pytest.MonkeyPatch,
                                                  m: int, k: int, n: int, ta: bool,
                                                  tb: bool) -> None:
    # the packed GEMM reads float32 operands in place or packs them by shape (linalg.py); each
    # case takes another mix, batched so that the batch offsets of both ways are used
    monkeypatch.setattr(cl, "gemm_variant", "packed")
    rng = np.random.default_rng(m * k + n)
    a = rng.standard_normal((3, k, m) if ta else (3, m, k)).astype(np.float32)
    b = rng.standard_normal((3, n, k) if tb else (3, k, n)).astype(np.float32)
    got = host(cl, cl.matmul(cl.asarray(a, "float32"), cl.asarray(b, "float32"), ta, tb))
    fa, fb = a.astype(np.float64), b.astype(np.float64)
    want = (np.swapaxes(fa, -1, -2) if ta else fa) @ (np.swapaxes(fb, -1, -2) if tb else fb)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@needs_device
@pytest.mark.parametrize("variant", ["packed", "tiled"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize(("ta", "tb"), [(False, False), (True, False), (False, True),
                                        (True, True)])
def test_matmul_any_shape_and_transpose(cl: Any, monkeypatch: pytest.MonkeyPatch,
                                        variant: str, dtype: str, ta: bool, tb: bool) -> None:
    monkeypatch.setattr(cl, "gemm_variant", variant)
    rng = np.random.default_rng(0)
    m, k, n = 67, 45, 83  # not multiples of any tile
    a = rng.standard_normal((2, k, m) if ta else (2, m, k)).astype(np.float32)
    b = rng.standard_normal((2, n, k) if tb else (2, k, n)).astype(np.float32)
    npd = {"bfloat16": BF16}.get(dtype, dtype)
    a16, b16 = a.astype(npd), b.astype(npd)
    got = host(cl, cl.matmul(cl.asarray(a16, dtype), cl.asarray(b16, dtype), ta, tb))
    fa = a16.astype(np.float64)
    fb = b16.astype(np.float64)
    want = (np.swapaxes(fa, -1, -2) if ta else fa) @ (np.swapaxes(fb, -1, -2) if tb else fb)
    assert got.dtype == np.dtype(npd) and got.shape == (2, m, n)
    tol = {"float32": 1e-4, "float64": 1e-10, "float16": 2e-3, "bfloat16": 1e-2}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * 10)


@needs_device
def test_bfloat16_rounds_to_nearest_even(cl: Any) -> None:
    bits = np.array([0x3F808000, 0x3F818000, 0x3F80C000, 0x7F7FFFFF, 0x7FC00001, 0xFF800000,
                     0x00000001, 0x80000000], dtype=np.uint32)
    x = bits.view(np.float32)
    got = host(cl, cl.cast(cl.asarray(x, "float32"), "bfloat16"))
    want = x.astype(BF16)
    assert np.array_equal(got.view(np.uint16)[~np.isnan(x)], want.view(np.uint16)[~np.isnan(x)])
    assert np.isnan(got[4].astype(np.float32))


@needs_device
def test_float16_storage_and_overflow(cl: Any) -> None:
    x = np.array([1e-8, 0.1, 65504, 70000, -1e5, 3.14159], dtype=np.float32)
    got = host(cl, cl.cast(cl.asarray(x, "float32"), "float16"))
    with np.errstate(over="ignore"):
        assert np.array_equal(got, x.astype(np.float16))
    y = cl.multiply(cl.asarray(np.float16([60000.0]), "float16"), 2.0)
    assert np.isinf(host(cl, y)[0])


@needs_device
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32"])
def test_broadcasting_and_scalars(cl: Any, cpu: Any, dtype: str) -> None:
    rng = np.random.default_rng(1)
    npd = {"bfloat16": BF16}.get(dtype, dtype)
    a = (rng.standard_normal((3, 1, 5)) * 4).astype(npd)
    b = (rng.standard_normal((4, 1)) * 4).astype(npd)
    for op in ("add", "subtract", "multiply", "maximum", "minimum", "less", "equal"):
        got = host(cl, getattr(cl, op)(cl.asarray(a, dtype), cl.asarray(b, dtype)))
        want = np.asarray(cpu[op](a, b))
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=1e-2 if dtype == "bfloat16" else 1e-3)
    got = host(cl, cl.subtract(3, cl.asarray(a, dtype)))
    np.testing.assert_allclose(got.astype(np.float64), np.asarray(cpu["subtract"](3, a),
                                                                  dtype=np.float64))


@needs_device
def test_reductions_over_any_axes(cl: Any) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4, 5, 6)).astype(np.float32)
    d = cl.asarray(x, "float32")
    for axis in [None, (0,), (1,), (3,), (0, 2), (1, 3), (0, 1, 2, 3), (1, 2)]:
        for kind in ("sum", "max", "min", "mean"):
            got = host(cl, getattr(cl, kind)(d, axis, True))
            want = getattr(np, kind)(x, axis=axis, keepdims=True)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(host(cl, cl.argmax(d, 2)), np.argmax(x, axis=2))
    big = rng.standard_normal(1_000_003).astype(np.float32)  # multi-pass, every core
    assert host(cl, cl.sum(cl.asarray(big, "float32"), None, False)) == pytest.approx(
        float(big.astype(np.float64).sum()), abs=1e-2)
    nan = np.array([[1.0, np.nan, 3.0]], dtype=np.float32)
    assert np.isnan(host(cl, cl.max(cl.asarray(nan, "float32"), (1,), False))[0])


@needs_device
def test_views_transpose_getitem_concat(cl: Any) -> None:
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    d = cl.asarray(x, "float32")
    np.testing.assert_array_equal(host(cl, cl.transpose(d, (2, 0, 1))), x.transpose(2, 0, 1))
    for key in [(slice(None, None, -1),), (1, slice(0, 3, 2)), (Ellipsis, -1), (None, 0),
                (slice(None), None, slice(1, None), 2)]:
        np.testing.assert_array_equal(host(cl, cl.getitem(d, key)), x[key])
        g = x[key]
        back = host(cl, cl.getitem_grad(cl.asarray(g, "float32"), key, x.shape))
        want = np.zeros_like(x)
        want[key] = g
        np.testing.assert_array_equal(back, want)
    np.testing.assert_array_equal(host(cl, cl.concat([d, d], 1)), np.concatenate([x, x], 1))
    np.testing.assert_array_equal(host(cl, cl.broadcast_to(cl.asarray(x[:, :1], "float32"),
                                                           (2, 3, 4))),
                                  np.broadcast_to(x[:, :1], (2, 3, 4)))


@needs_device
def test_take_grad_adds_duplicates(cl: Any) -> None:
    g = np.ones((4, 3), dtype=np.float32)
    idx = np.array([0, 2, 2, -1])
    out = host(cl, cl.take_grad(cl.asarray(g, "float32"), cl.asarray(idx, "int64"), 0, (5, 3)))
    want = np.zeros((5, 3), np.float32)
    np.add.at(want, idx, g)
    np.testing.assert_array_equal(out, want)


@needs_device
def test_image_kernels_match_cpu(cl: Any, cpu: Any) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 7, 6, 3)).astype(np.float32)
    pads = (1, 1, 0, 1)
    want = cpu["extract_patches"](x, 3, 2, 2, 1, pads)
    got = host(cl, cl.extract_patches(cl.asarray(x, "float32"), 3, 2, 2, 1, pads))
    np.testing.assert_array_equal(got, want)
    g = rng.standard_normal(want.shape).astype(np.float32)
    np.testing.assert_allclose(
        host(cl, cl.extract_patches_grad(cl.asarray(g, "float32"), x.shape, 3, 2, 2, 1, pads)),
        cpu["extract_patches_grad"](g, x.shape, 3, 2, 2, 1, pads), rtol=1e-5, atol=1e-6)
    y = cpu["max_pool2d"](x, 2, 2, 2, 2, pads)
    dy = cl.max_pool2d(cl.asarray(x, "float32"), 2, 2, 2, 2, pads)
    np.testing.assert_array_equal(host(cl, dy), y)
    gy = rng.standard_normal(y.shape).astype(np.float32)
    np.testing.assert_allclose(
        host(cl, cl.max_pool2d_grad(cl.asarray(gy, "float32"), cl.asarray(x, "float32"), dy,
                                    2, 2, 2, 2, pads)),
        cpu["max_pool2d_grad"](gy, x, y, 2, 2, 2, 2, pads), rtol=1e-6)


@needs_device
def test_softmax_cross_entropy_and_label_check(cl: Any, cpu: Any) -> None:
    rng = np.random.default_rng(4)
    z = (rng.standard_normal((6, 10)) * 30).astype(np.float32)
    labels = np.array([0, 9, 3, 3, 5, 1])
    loss, probs = cl.sparse_softmax_cross_entropy(cl.asarray(z, "float32"),
                                                  cl.asarray(labels, "int32"))
    wl, wp = cpu["sparse_softmax_cross_entropy"](z, labels)
    np.testing.assert_allclose(host(cl, loss), wl, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(host(cl, probs), wp, rtol=1e-5, atol=1e-7)
    for axis in (0, 1):
        np.testing.assert_allclose(host(cl, cl.log_softmax(cl.asarray(z, "float32"), axis)),
                                   cpu["log_softmax"](z, axis), rtol=1e-5, atol=1e-4)
    g = rng.standard_normal(6).astype(np.float32)
    grad = host(cl, cl.sparse_softmax_cross_entropy_grad(probs, cl.asarray(labels, "int32"),
                                                         cl.asarray(g, "float32")))
    np.testing.assert_allclose(grad, (wp - np.eye(10, dtype=np.float32)[labels]) * g[:, None],
                               rtol=1e-5, atol=1e-7)


@needs_device
def test_every_kernel_gets_fast_argument_packing(cl: Any) -> None:
    """Each kernel's by-value argument types are declared (a launch packs them with struct
    instead of pyopencl's generic path, about 4x less host time per small op)."""
    x = cl.asarray(np.ones((4, 3), np.float16), "float16")
    cl.add(x, cl.asarray(np.ones((1, 3), np.float16), "float16"))  # broadcast: int8 vectors
    cl.matmul(x, x, False, True)
    cl.take(x, cl.asarray(np.array([0]), "int64"), 0)
    cl.sum(x, None, False)
    cl.random_uniform((3,), "float32", 1, 0.0, 1.0)
    cl.adam_update(cl.full((2,), 1, "float32"), cl.full((2,), 1, "float32"),
                   cl.full((2,), 0, "float32"), cl.full((2,), 0, "float32"),
                   cl.adam_rates(cl.full((), 0, "int64"), 0.1, 0.9, 0.999, 0.0), 0.9, 0.999,
                   1e-7, 0.0, None)
    programs = list(cl.runtime._programs.values())
    assert len(programs) >= 6
    assert [name for p in programs if p.arg_info for name in p.generic] == []
    if "Portable Computing Language" in cl.device().details["platform"]:
        assert all(p.arg_info for p in programs)  # PoCL describes every kernel's arguments
