"""The OpenCL kernel probe and build checks: every device here passes the probe (a failing test,
not a skip, where one does not), a crashing driver is reported instead of ending the run, a
program that lacks a kernel is rebuilt uncached once and then named in a KernelBuildError, and
the GEMM shapes follow the device description (pure functions, for devices not here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from mpcore_opencl import OpenCLBackend
from mpcore_opencl import probe as cl_probe
from mpcore_opencl.tiling import (
    VECTOR_WIDTHS,
    candidate_widths,
    gemm_variant,
    packed_shape,
    packed_vectors,
    reported_width,
    tiled_shape,
)

import mpcore as mp
from mpcore.core.backend import Device
from mpcore.plugins.extras import install_command


def _devices() -> list[Device]:
    try:
        be = mp.get_backend("opencl")
    except mp.BackendUnavailableError:   # PyOpenCL not installed (a GPU machine's image)
        return []
    try:
        return be.devices()
    except Exception:  # enumeration failing is test_opencl's subject; here: no device
        return []


DEVICES = _devices()
needs_device = pytest.mark.skipif(not DEVICES, reason="no OpenCL device here "
                                  f"({install_command('pocl')} adds one)")


@pytest.fixture
def private_cache(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe cache of the test's own (the other tests share the user's: probing PoCL from
    scratch costs tens of seconds)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


# --- every device passes the probe ------------------------------------------------------
@needs_device
@pytest.mark.parametrize("device", DEVICES, ids=lambda d: f"{d.index}-{d.name}")
def test_every_opencl_device_passes_the_kernel_probe(device: Device) -> None:
    result = cl_probe.probe(device)
    assert result.ok, (f"OpenCL device {device.index} ({device.name}, driver "
                       f"{device.details.get('driver_version')}) fails the kernel probe: "
                       f"{result.summary()}")
    assert result.vector_width in candidate_widths(device)
    if not result.cached:  # the widest that worked, after every wider one failed
        assert [a.outcome for a in result.attempts][-1] == "ok"
        assert all(a.outcome != "ok" for a in result.attempts[:-1])


# --- outcomes of one attempt ------------------------------------------------------------
def test_a_driver_that_aborts_is_reported_with_its_last_words() -> None:
    code = ("import os, sys; sys.stderr.write('4 warnings generated.\\nLLVM ERROR: Cannot "
            "select: fadd\\n'); sys.stderr.flush(); os.abort()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    attempt = cl_probe.classify(16, done.returncode, done.stdout, done.stderr)
    assert attempt.outcome == "crashed"
    assert attempt.detail == "SIGABRT: LLVM ERROR: Cannot select: fadd"
    assert str(attempt) == "width 16: crashed (SIGABRT: LLVM ERROR: Cannot select: fadd)"


@pytest.mark.parametrize(("returncode", "stdout", "stderr", "outcome", "detail"), [
    (0, 'noise\n{"ok": true, "problems": []}\n', "", "ok", ""),
    (1, '{"ok": false, "problems": ["tiled GEMM float32: wrong"]}', "", "failed",
     "tiled GEMM float32: wrong"),
    (2, "", "Traceback ...\nImportError: no pyopencl\n", "failed",
     "exit status 2: ImportError: no pyopencl"),
    (-9, "", "", "crashed", "SIGKILL: nothing on stderr"),
    (-250, "", "last line\n", "crashed", "signal 250: last line"),
    (None, "", "", "timed out", "no answer within 12 s"),
])
def test_classify_outcomes(returncode: int | None, stdout: str, stderr: str, outcome: str,
                           detail: str) -> None:
    attempt = cl_probe.classify(4, returncode, stdout, stderr, seconds=12.0)
    assert (attempt.width, attempt.outcome, attempt.detail) == (4, outcome, detail)


@needs_device
def test_an_attempt_past_its_deadline_is_stopped_and_reported() -> None:
    attempt = cl_probe.run_attempt(DEVICES[0].index, 1, timeout=0.05)
    assert attempt.outcome == "timed out"


# --- cache and failure ------------------------------------------------------------------
@needs_device
def test_a_cached_result_is_used_without_a_subprocess(private_cache: None) -> None:
    device = DEVICES[0]
    key = cl_probe.cache_key(device)
    stored = cl_probe.ProbeResult("d", 2, (cl_probe.Attempt(2, "ok", "", 1.0),))
    cl_probe.store(key, stored)
    found = cl_probe.probe(device)
    assert found.cached and found.vector_width == 2 and found.attempts == stored.attempts
    other = Device(device.name, device.vendor, device.kind, device.capability,
                   device.features, {**device.details, "driver_version": "another"},
                   device.index)
    assert cl_probe.cache_key(other) != key  # a new driver is probed again


@needs_device
def test_a_device_that_fails_every_width_is_a_kernel_build_error_and_not_cached(
        private_cache: None) -> None:
    # a description of a device that is not there: every attempt's child fails to open it
    ghost = Device("ghost", "nobody", "cpu", "OpenCL 3.0", frozenset(),
                   {"native_vector_width_float": 2, "driver_version": "0.0"}, "9:9")
    result = cl_probe.probe(ghost)
    assert not result.ok and [a.width for a in result.attempts] == [2, 1]
    assert all(a.outcome == "failed" and "9:9" in a.detail for a in result.attempts)
    assert cl_probe.load_cached(cl_probe.cache_key(ghost)) is None
    be = OpenCLBackend()
    be._device = ghost  # the backend's device, as if it had chosen this one
    with pytest.raises(mp.KernelBuildError) as info:
        be.verified_vector_width()
    message = str(info.value)
    assert "9:9 (ghost, driver 0.0) fails mpcore's kernel probe" in message
    assert "width 2: failed" in message and "width 1: failed" in message


@pytest.mark.parametrize("value", ["3", "32", "wide", "-8"])
def test_a_bad_fixed_width_names_the_valid_ones(monkeypatch: pytest.MonkeyPatch,
                                                value: str) -> None:
    monkeypatch.setenv(cl_probe.WIDTH_ENV, value)
    with pytest.raises(ValueError, match=r"MPCORE_OPENCL_VECTOR_WIDTH=.* valid values: "
                                         r"1, 2, 4, 8, 16"):
        OpenCLBackend().verified_vector_width()


def test_a_fixed_width_skips_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cl_probe.WIDTH_ENV, " 2 ")
    assert OpenCLBackend().verified_vector_width() == 2


# --- build checks -----------------------------------------------------------------------
def activated_opencl() -> Any:
    """The opencl backend with its kernels built, or a skip (a device failing the probe is
    test_every_opencl_device_passes_the_kernel_probe's failure, not every test's)."""
    try:
        be = mp.get_backend("opencl")
        be.kernels()
    except Exception as exc:  # (BackendUnavailableError where PyOpenCL is not installed)
        pytest.skip(f"opencl: {type(exc).__name__}: {exc}")
    return be


@pytest.fixture
def runtime() -> Any:
    return activated_opencl().runtime


def test_a_missing_kernel_is_rebuilt_uncached_then_named(runtime: Any) -> None:
    slots = (("A", "float32"), ("O", "float32"))
    options = ("-DTSM=64", "-DTSN=64", "-DTSK=16", "-DWPM=8", "-DVW=4", "-DMPCORE_TEST=1")
    prog = runtime.program("gemm.cl", slots, options=options)
    assert "gemm_nn" in prog.kernels  # the tiled variant: no "pack_k" in it
    with pytest.raises(mp.KernelBuildError) as info:
        prog["pack_k"]
    message = str(info.value)
    device = runtime.device
    assert "gemm.cl (A=float32, O=float32) built without kernel 'pack_k'" in message
    assert "even with the caches bypassed" in message
    assert device.name.strip() in message and device.driver_version.strip() in message
    assert "-DTSM=64" in message and "build log:" in message
    # the options as the backend gave them (Intel's build log, after them, echoes the real
    # command line, cache-bypass define included)
    shown_options = message.split("build options:")[1].split("build log:")[0]
    assert "-DTSM=64" in shown_options and "MPCORE_UNCACHED_BUILD" not in shown_options


def test_a_program_without_any_kernel_is_an_error(runtime: Any) -> None:
    # neither variant's macros: gemm.cl then declares no kernel at all
    with pytest.raises(mp.KernelBuildError, match="built without any kernel, even with the "
                                                  "caches bypassed"):
        runtime.program("gemm.cl", (("A", "float32"), ("O", "float32")),
                        options=("-DVW=4", "-DMPCORE_TEST=2"))


def test_a_program_that_does_not_compile_names_the_device(runtime: Any) -> None:
    with pytest.raises(mp.KernelBuildError) as info:
        runtime.program("random.cl", (("O", "float32"),), "this is not OpenCL C;")
    assert "random.cl (O=float32) did not build" in str(info.value)
    assert runtime.device.name.strip() in str(info.value)


# --- every program at every vector width ------------------------------------------------
_BUILD_ALL = textwrap.dedent("""
    import json, sys
    import mpcore as mp
    from mpcore_opencl.tiling import PackedShape, TiledShape

    width = int(sys.argv[1])
    be = mp.get_backend("opencl")
    rt = be.runtime
    built = {}
    def record(label, prog):
        built[label] = sorted(prog.kernels)
    dtypes = ["float32", "float16", "bfloat16"] + (["float64"] if rt.fp64 else [])
    for dt in dtypes:
        acc = "float32" if dt in ("float16", "bfloat16") else dt
        packed = PackedShape(width).options()
        record(f"gemm packed pack {dt}",
               rt.program("gemm.cl", (("A", dt), ("O", acc)), options=(*packed, f"-DPW={width}")))
        record(f"gemm packed {dt}",
               rt.program("gemm.cl", (("A", acc), ("O", dt)), options=(*packed, "-DPW=16")))
        tiled = TiledShape(vector_width=width, tile_n=max(64, width)).options()
        record(f"gemm tiled {dt}", rt.program("gemm.cl", (("A", dt), ("O", dt)), options=tiled))
        opts = (f"-DVW={width}",)
        record(f"elementwise {dt}", be._elementwise(dt, dt))
        record(f"random {dt}", rt.program("random.cl", (("O", dt),), options=opts))
        record(f"reduce {dt}", rt.program("reduce.cl", (("A", dt), ("O", dt)), options=opts))
        record(f"image {dt}", rt.program("image.cl", (("A", dt), ("O", dt)), options=opts))
        for template in ("nn.cl", "index.cl"):
            record(f"{template} {dt}", rt.program(template, (("A", dt), ("O", dt),
                                                             ("L", "int32")), options=opts))
    record("optim", rt.program("optim.cl", (("A", "float32"),), options=(f"-DVW={width}",)))
    print(json.dumps(built))
""")
EXPECTED = {
    "gemm packed pack": {"pack_k", "gemm_packed", "gemm_packed_k"},
    "gemm packed": {"pack_k", "gemm_packed", "gemm_packed_k"},
    "gemm tiled": {"gemm_nn", "gemm_nt", "gemm_tn", "gemm_tt"},
    "elementwise": {"k_add", "k_copy", "k_copy_s", "copy_w", "fill", "where_bc", "bias_add"},
    "random": {"random_uniform", "random_normal", "dropout_mask"},
    "reduce": {"reduce_sum", "reduce_max", "reduce_argmax"},
    "image": {"extract_patches", "max_pool2d"},
    "nn.cl": {"relu_grad", "softmax", "sparse_xent", "sparse_xent_grad"},
    "index.cl": {"take", "take_rows", "take_grad", "one_hot"},
    "optim": {"unscale", "all_finite", "sgd", "rmsprop", "adam"},
}


@needs_device
@pytest.mark.parametrize("width", VECTOR_WIDTHS)
def test_every_program_builds_at_every_vector_width(width: int) -> None:
    # in a subprocess: only the builds are asked for, but a driver may compile fully there
    env = {**os.environ, cl_probe.WIDTH_ENV: str(width)}
    env.pop("MPCORE_BACKEND", None)
    done = subprocess.run([sys.executable, "-c", _BUILD_ALL, str(width)], capture_output=True,
                          text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    built = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(built) >= 30
    for label, kernels in built.items():
        family = next(f for f in sorted(EXPECTED, key=len, reverse=True) if label.startswith(f))
        missing = EXPECTED[family] - set(kernels)
        assert not missing, f"{label} at width {width} lacks {sorted(missing)}"


@pytest.fixture(scope="module")
def verified_width() -> int:
    return int(activated_opencl().verified_vector_width())


@needs_device
@pytest.mark.parametrize("width", VECTOR_WIDTHS)
@pytest.mark.parametrize("variant", ["packed", "tiled"])
def test_gemm_computes_at_every_verified_width(verified_width: int, width: int,
                                               variant: str) -> None:
    if width > verified_width:
        pytest.skip(f"the kernel probe found width {width} failing on this device; it "
                    f"uses {verified_width}")
    be = OpenCLBackend()
    be.vector_width, be.gemm_variant = width, variant
    rng = np.random.default_rng(width)
    for dtype, np_dtype, rtol in (("float32", np.float32, 1e-5),
                                  ("bfloat16", ml_dtypes.bfloat16, 1e-2),
                                  ("float64", np.float64, 1e-12)):
        if dtype == "float64" and "cl_khr_fp64" not in be.device().features:
            continue
        a = rng.uniform(-1, 1, (3, 21, 35)).astype(np_dtype)
        b = rng.uniform(-1, 1, (3, 19, 35)).astype(np_dtype)
        got = np.asarray(be.to_host(be.matmul(be.asarray(a, dtype), be.asarray(b, dtype),
                                              False, True)), np.float64)
        want = a.astype(np.float64) @ np.swapaxes(b.astype(np.float64), -1, -2)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, err_msg=dtype)


# --- shapes from device descriptions (pure) --------------------------------------------
def _device(kind: str = "cpu", **details: Any) -> Device:
    return Device("described", "vendor", kind, "OpenCL 3.0", frozenset(), details, "0:0")


ZEN4_POCL = _device(native_vector_width_float=16, max_work_group_size=4096,
                    max_work_item_sizes=[4096, 4096, 4096], local_memory_bytes=1 << 20)
NVIDIA = _device("gpu", native_vector_width_float=1, max_work_group_size=1024,
                 max_work_item_sizes=[1024, 1024, 64], local_memory_bytes=49152)


def test_candidate_widths_start_from_what_the_device_reports() -> None:
    assert candidate_widths(ZEN4_POCL) == (16, 8, 4, 2, 1)
    assert candidate_widths(_device(native_vector_width_float=8)) == (8, 4, 2, 1)
    assert candidate_widths(_device(native_vector_width_float=0,
                                    preferred_vector_width_float=4)) == (4, 2, 1)
    assert candidate_widths(_device(native_vector_width_float=3)) == (2, 1)
    assert candidate_widths(_device()) == (1,)
    assert reported_width(_device(native_vector_width_float=64)) == 16
    # GPUs: the tiled GEMM's 4 columns per work-item are a register block, whatever is native
    assert gemm_variant(NVIDIA) == "tiled" and candidate_widths(NVIDIA) == (4, 2, 1)


def test_packed_shape_keeps_vector_bytes_and_fits_the_work_group() -> None:
    assert packed_shape(ZEN4_POCL, 8).options() == ("-DPACKED", "-DWPM=6", "-DVW=8", "-DNV=2")
    assert packed_shape(ZEN4_POCL, 8, itemsize=8).vector_width == 4  # double4 = float8
    assert packed_shape(ZEN4_POCL, 1, itemsize=8).vector_width == 1
    assert packed_shape(ZEN4_POCL, 16).group == (4, 1)
    assert packed_shape(_device(max_work_group_size=2), 16).group == (2, 1)
    assert packed_shape(_device(max_work_group_size=1), 4).group == (1, 1)
    narrow = _device(max_work_group_size=256, max_work_item_sizes=[2, 256, 256])
    assert packed_shape(narrow, 4).group == (2, 1)


def test_packed_block_is_two_registers_of_at_most_32_bytes_a_row() -> None:
    # 12 accumulators of AVX2 registers: a 16-float vector (reported by PoCL on Zen 4, built
    # for AVX2) counts as two registers, so one per row; 8 floats or 4 doubles, two per row
    for width, itemsize, vectors in ((16, 4, 1), (8, 4, 2), (4, 4, 2), (1, 4, 2), (8, 8, 1),
                                     (4, 8, 2)):
        assert packed_vectors(width, itemsize) == vectors, (width, itemsize)
    shape = packed_shape(ZEN4_POCL, 16)
    assert (shape.rows, shape.vector_width, shape.vectors, shape.columns) == (6, 16, 1, 16)
    assert packed_shape(ZEN4_POCL, 16, itemsize=8).columns == 8  # 8 doubles: one row of 64 B
    assert packed_shape(ZEN4_POCL, 8, itemsize=8).columns == 8  # two double4
    with pytest.raises(ValueError, match=r"not one of \(1, 2, 4, 8, 16\)"):
        packed_shape(ZEN4_POCL, 3)


def test_tiled_shape_fits_work_group_and_local_memory() -> None:
    shape = tiled_shape(NVIDIA)
    assert (shape.tile_m, shape.tile_n, shape.tile_k, shape.group) == (64, 64, 16, (16, 8))
    assert tiled_shape(NVIDIA, 16).vector_width == 4
    assert tiled_shape(NVIDIA, 4, itemsize=8, acc_itemsize=8).vector_width == 2
    small_groups = tiled_shape(_device("gpu", max_work_group_size=64, local_memory_bytes=32768))
    assert small_groups.group[0] * small_groups.group[1] <= 64
    small_local = tiled_shape(_device("gpu", max_work_group_size=256, local_memory_bytes=4096))
    assert small_local.local_bytes(4) <= 4096 and small_local.tile_k < 16
    with pytest.raises(ValueError, match="too small for the tiled GEMM"):
        tiled_shape(_device("gpu", max_work_group_size=1, local_memory_bytes=64))
