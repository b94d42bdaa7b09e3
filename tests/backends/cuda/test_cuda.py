"""The CUDA backend: availability, rules and messages (anywhere); its Python and kernel sources
are checked in test_cuda_sources.py (NVRTC, no GPU needed), and the kernels themselves against
the CPU backend in test_cuda_device.py (on a GPU).

The backend-generic suites (test_ops, test_gradients, ...) also run on CUDA through the
``backend`` fixture when a GPU is present; the GPU tests in test_cuda_device.py add what they
do not cover: batched 16-bit GEMMs, bit-exact casts, the device flag, the fused optimizer
kernels, image kernels and random numbers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
from mpcore_cuda import (
    CudaBackend,
    TensorCoreWarning,
    check_tensor_core_dims,
    linalg,
    rules,
)
from mpcore_cuda.rules import compatibility_check, cuda_policy_support, device_string
from mpcore_cuda.tensor_cores import reset_warnings

import mpcore as mp
from mpcore.core.backend import OPTIONAL_KERNELS, Device
from mpcore.plugins.extras import install_command
from mpcore.plugins.settings import SettingError

# --- described devices ---------------------------------------------------------------------
P100 = Device("Tesla P100-PCIE-16GB", "NVIDIA", "gpu", "6.0")
GTX1080 = Device("NVIDIA GeForce GTX 1080", "NVIDIA", "gpu", "6.1")
V100 = Device("Tesla V100-SXM2-16GB", "NVIDIA", "gpu", "7.0")
T4 = Device("Tesla T4", "NVIDIA", "gpu", "7.5")
A100 = Device("NVIDIA A100-SXM4-40GB", "NVIDIA", "gpu", "8.0")
H100 = Device("NVIDIA H100 80GB HBM3", "NVIDIA", "gpu", "9.0")
NO_CC = Device("Radeon RX 7900", "AMD", "gpu", "")

SEE = ("See https://developer.nvidia.com/cuda-gpus for a list of GPUs and their compute "
       "capabilities.")
SUFFIX = ("If you will use compatible GPU(s) not attached to this host, e.g. by running a "
          "multi-worker model, you can ignore this warning. This message will only be logged once")


# --- availability: cheap, no CuPy import -----------------------------------------------------
def test_import_mpcore_does_not_import_cupy() -> None:
    code = ("import sys, mpcore, mpcore_cuda; b = mpcore.get_backend('cuda') "
            "if mpcore_cuda.CudaBackend().is_available() else None; "
            "[x.unavailable_reason() for x in mpcore.backends()]; "
            "print('cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "MPCORE_BACKEND": "cpu"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_backend_is_registered_with_every_kernel() -> None:
    be = next(b for b in mp.backends() if b.name == "cuda")
    assert isinstance(be, CudaBackend) and be.priority == 300
    assert be.missing_kernels() == []
    missing_optional = [k for k in OPTIONAL_KERNELS if not callable(getattr(be, k, None))]
    # the convolutions compose im2col and a GEMM on CUDA until cuDNN's are wired (a GPU session);
    # the schedules' cosine is composed of float64 ops (a kernel needs nvcc's --fmad=false)
    assert missing_optional == ["conv2d", "conv2d_backprop_input", "conv2d_backprop_filter",
                                "ieee_cos"]


def test_hidden_devices_make_it_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    reason = CudaBackend().unavailable_reason()
    assert reason is not None and "no CUDA device" in reason


@pytest.mark.parametrize(("present", "found"), [
    ((), False),
    (("/dev/nvidia0",), True),
    (("/proc/driver/nvidia/gpus/0000:00:06.0",), True),
    (("/dev/dxg", "/usr/lib/wsl/lib/libcuda.so.1"), True),   # WSL2 with NVIDIA's driver
    (("/dev/dxg",), False)])                                 # WSL2, another GPU's driver
def test_device_nodes_decide_whether_a_gpu_is_there(monkeypatch: pytest.MonkeyPatch,
                                                    present: tuple[str, ...],
                                                    found: bool) -> None:
    import fnmatch

    from mpcore_cuda import devices

    monkeypatch.setattr(devices.glob, "glob",
                        lambda pattern: [p for p in present if fnmatch.fnmatch(p, pattern)])
    assert devices.no_device.__wrapped__() == (None if found else "no CUDA device")


_REASON = CudaBackend().unavailable_reason()


@pytest.mark.skipif(_REASON is None, reason="a CUDA GPU is present")
def test_unavailable_reason_and_error_without_gpu() -> None:
    assert _REASON in ("CuPy not installed", "no CUDA device") or "no CUDA device" in _REASON
    with pytest.raises(RuntimeError, match="backend 'cuda' is not available: ") as info:
        mp.set_backend("cuda")
    # the pip command only where a GPU lacks CuPy (the reason names the GPU first)
    first = str(info.value).splitlines()[0]
    assert (install_command("cuda") in first) == (_REASON == "CuPy not installed"), first


@pytest.mark.parametrize(("cupy", "gpu", "hidden", "reason"), [
    (False, True, False, "CuPy not installed"),
    (False, False, False, "no CUDA device"),
    (False, True, True, "no CUDA device (CUDA_VISIBLE_DEVICES hides every GPU)"),
    (True, False, False, "no CUDA device"),
    (True, True, False, None)])
def test_install_advice_only_where_a_gpu_lacks_cupy(monkeypatch: pytest.MonkeyPatch,
                                                    cupy: bool, gpu: bool, hidden: bool,
                                                    reason: str | None) -> None:
    from mpcore_cuda import backend as cuda_backend

    monkeypatch.setattr(cuda_backend, "cupy_missing",
                        lambda: None if cupy else "CuPy not installed")
    monkeypatch.setattr(cuda_backend, "no_device", lambda: None if gpu else "no CUDA device")
    if hidden:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    else:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    be = CudaBackend()
    assert be.unavailable_reason() == reason
    advice = install_command("cuda") if reason == "CuPy not installed" else ""
    assert be.install_advice() == advice
    if advice:
        assert advice == CudaBackend.install_hint


# --- rules: pure functions of device descriptions -----------------------------------------
@pytest.mark.parametrize(("device", "f16_fast", "bf16_fast"), [
    (P100, False, False), (GTX1080, False, False), (V100, True, False), (T4, True, False),
    (A100, True, True), (H100, True, True)])
def test_policy_rules(device: Device, f16_fast: bool, bf16_fast: bool) -> None:
    for policy in ("mixed_float16", "float16"):
        s = cuda_policy_support(policy, device.capability, (14, 0))
        assert s.supported and s.fast == f16_fast
        assert f"compute capability {device.capability}" in s.reason
        assert ("tensor cores" in s.reason) and (("< 7.0" in s.reason) != f16_fast)
    s = cuda_policy_support("mixed_bfloat16", device.capability, (14, 0))
    assert s.supported and s.fast == bf16_fast
    assert ("< 8.0" in s.reason) != bf16_fast
    for policy in ("float32", "float64"):
        assert cuda_policy_support(policy, device.capability).fast


def test_bfloat16_needs_cupy_14() -> None:
    s = cuda_policy_support("mixed_bfloat16", "9.0", (13, 6))
    assert not s.supported and not s.fast
    assert "CuPy 13.6 has no bfloat16" in s.reason and install_command("cuda") in s.reason
    assert cuda_policy_support("mixed_float16", "9.0", (13, 6)).fast
    assert cuda_policy_support("mixed_bfloat16", "9.0", None).fast  # version unknown
    ok, text = compatibility_check("mixed_bfloat16", [H100], (13, 6))
    assert not ok and "CuPy 13.6" in text


def test_rule_errors_name_the_choices() -> None:
    with pytest.raises(ValueError, match=r"valid names: .*mixed_float16"):
        cuda_policy_support("mixed_float4", "8.0")   # mixed_float8 is a policy now
    with pytest.raises(ValueError, match=r"looks like '8\.0'"):
        cuda_policy_support("mixed_float16", "eight")
    s = cuda_policy_support("mixed_float16", "")
    assert not s.supported and "no CUDA compute capability" in s.reason
    assert rules.parse_capability((8, 6)) == (8, 6) and rules.parse_capability("3.10") == (3, 10)


def test_gemm16_route_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MPCORE_CUDA_GEMM16", raising=False)
    assert linalg.gemm16_route() == "cupy"
    monkeypatch.setenv("MPCORE_CUDA_GEMM16", " CUBLAS ")
    assert linalg.gemm16_route() == "cublas"
    monkeypatch.setenv("MPCORE_CUDA_GEMM16", "cutlass")
    with pytest.raises(SettingError, match=r"^MPCORE_CUDA_GEMM16='cutlass' is not valid; valid "
                                           r"values: cupy, cublas$"):
        linalg.gemm16_route()


def test_message_one_fast_gpu() -> None:
    ok, text = compatibility_check("mixed_float16", [T4])
    assert ok
    header = "Mixed precision compatibility check (mixed_float16): OK"
    assert f"{header}\n{text}" == (
        "Mixed precision compatibility check (mixed_float16): OK\n"
        "Your GPU will likely run quickly with dtype policy mixed_float16 as it has compute "
        "capability of at least 7.0. Your GPU: Tesla T4, compute capability 7.5")


def test_message_several_fast_gpus() -> None:
    ok, text = compatibility_check("mixed_float16", [V100, A100, H100])
    assert ok and text == ("Your GPUs will likely run quickly with dtype policy mixed_float16 as "
                           "they all have compute capability of at least 7.0")


def test_message_one_slow_gpu() -> None:
    ok, text = compatibility_check("mixed_float16", [P100])
    assert not ok and text == (
        "Your GPU may run slowly with dtype policy mixed_float16 because it does not have "
        "compute capability of at least 7.0. Your GPU:\n"
        "  Tesla P100-PCIE-16GB, compute capability 6.0\n" + SEE + "\n" + SUFFIX)


def test_message_several_slow_gpus_merges_identical_lines() -> None:
    ok, text = compatibility_check("mixed_float16", [GTX1080, GTX1080, GTX1080, P100])
    assert not ok and text == (
        "Your GPUs may run slowly with dtype policy mixed_float16 because they do not have "
        "compute capability of at least 7.0. Your GPUs:\n"
        "  NVIDIA GeForce GTX 1080, compute capability 6.1 (x3)\n"
        "  Tesla P100-PCIE-16GB, compute capability 6.0\n" + SEE + "\n" + SUFFIX)


def test_message_some_of_several_slow() -> None:
    ok, text = compatibility_check("mixed_float16", [V100, V100, P100])
    assert not ok and text == (
        "Some of your GPUs may run slowly with dtype policy mixed_float16 because they do not "
        "all have compute capability of at least 7.0. Your GPUs:\n"
        "  Tesla V100-SXM2-16GB, compute capability 7.0 (x2)\n"
        "  Tesla P100-PCIE-16GB, compute capability 6.0\n" + SEE + "\n" + SUFFIX)
    # fast GPUs are listed first, then the slow ones (as in the guide's check)
    ok, text = compatibility_check("mixed_float16", [P100, H100])
    assert text.splitlines()[1:3] == ["  NVIDIA H100 80GB HBM3, compute capability 9.0",
                                      "  Tesla P100-PCIE-16GB, compute capability 6.0"]


def test_message_gpu_without_compute_capability() -> None:
    ok, text = compatibility_check("mixed_float16", [NO_CC])
    assert not ok
    assert text.splitlines()[1] == ("  Radeon RX 7900, no compute capability (probably not an "
                                    "Nvidia GPU)")
    assert device_string(Device("", capability="")) == (
        "Unknown GPU, no compute capability (probably not an Nvidia GPU)")


def test_message_no_gpu() -> None:
    ok, text = compatibility_check("mixed_float16", [])
    assert not ok and text == (
        "The dtype policy mixed_float16 may run slowly because this machine does not have a "
        "GPU. Only Nvidia GPUs with compute capability of at least 7.0 run quickly with "
        "mixed_float16.\n" + SUFFIX)


def test_message_bfloat16_uses_8_0() -> None:
    ok, text = compatibility_check("mixed_bfloat16", [A100])
    assert ok and text.endswith("at least 8.0. Your GPU: NVIDIA A100-SXM4-40GB, compute "
                                "capability 8.0")
    ok, text = compatibility_check("mixed_bfloat16", [T4, A100])
    assert not ok and text.startswith("Some of your GPUs may run slowly with dtype policy "
                                      "mixed_bfloat16")
    assert compatibility_check("float32", [P100]) == (True, "float32 runs natively on CUDA GPUs")


# --- the tensor-core tip ----------------------------------------------------------------------
def test_tensor_core_tip_warns_once_per_layer() -> None:
    reset_warnings()
    with pytest.warns(TensorCoreWarning, match=r"'dense_1': units=4095 not a multiple of 8"):
        assert check_tensor_core_dims("dense_1", {"units": 4095, "inputs": 784},
                                      "mixed_float16") == ["units=4095"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_tensor_core_dims("dense_1", {"units": 4095, "inputs": 784},
                                      mp.Policy("mixed_float16")) == ["units=4095"]
        assert check_tensor_core_dims("dense_2", {"units": 4096}, "mixed_float16") == []
        assert check_tensor_core_dims("dense_3", [10], "mixed_bfloat16") == []
        assert check_tensor_core_dims("dense_4", [10], "float32") == []
        mp.get_backend("cpu").layer_hint("dense_5", {"units": 10}, "mixed_float16")
    with pytest.warns(TensorCoreWarning, match="'conv': filters=12, channels=3"):
        CudaBackend().layer_hint("conv", {"filters": 12, "channels": 3}, "mixed_float16")
    with pytest.warns(TensorCoreWarning, match="dim0=10"):
        check_tensor_core_dims("logits", [10], "float16")
    reset_warnings()
