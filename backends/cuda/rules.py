"""Verdict rules for NVIDIA GPUs: pure functions of device descriptions (testable anywhere).

float16 tensor cores need compute capability 7.0, bfloat16 ones 8.0. Below that a 16-bit
policy still runs (CuPy computes 16-bit elementwise math through float32 on any GPU, and the
backend runs the GEMMs in float32) but it is not faster than float32. bfloat16 needs CuPy 14
(its ml_dtypes bfloat16 support); CuPy 13 has no bfloat16 arrays.

:func:`compatibility_check` writes the Keras mixed precision guide's log text, word for word
for ``mixed_float16`` (keras/mixed_precision/device_compatibility_check.py), for any number of
GPUs.

>>> cuda_policy_support("mixed_float16", "7.5").fast
True
>>> cuda_policy_support("mixed_bfloat16", "7.5").fast
False
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from mpcore.core.backend import Device, Support
from mpcore.mixed_precision.policy import POLICIES
from mpcore.plugins.extras import install_command

#: The compute capability whose tensor cores run each 16-bit dtype.
TENSOR_CORE_CAPABILITY: dict[str, tuple[int, int]] = {"float16": (7, 0), "bfloat16": (8, 0)}
#: The first CuPy major version with bfloat16 arrays.
CUPY_BFLOAT16_MAJOR = 14

_PREFIX_SUFFIX = ("If you will use compatible GPU(s) not attached to this host, e.g. by running "
                  "a multi-worker model, you can ignore this warning. This message will only be "
                  "logged once")
_GPU_LIST = "https://developer.nvidia.com/cuda-gpus"


def parse_capability(capability: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """(major, minor) from "8.6" or (8, 6); None when there is none (not an NVIDIA GPU)."""
    if capability is None or capability == "":
        return None
    if isinstance(capability, tuple):
        return int(capability[0]), int(capability[1])
    major, _, minor = str(capability).partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        raise ValueError(f"a compute capability looks like '8.0', got {capability!r}") from None


def _fmt(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


def _compute_dtype(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid names: {', '.join(POLICIES)}")
    return POLICIES[policy][0]


def cuda_policy_support(policy: str, capability: str | tuple[int, int] | None,
                        cupy_version: tuple[int, int] | None = None,
                        cublaslt: str | None = None) -> Support:
    """Judge ``policy`` on a GPU of compute ``capability``, with CuPy ``cupy_version``
    ((major, minor); None when unknown, taken as new enough); ``cublaslt``: why FP8 GEMMs
    cannot go through cuBLASLt on this host (None: they can)."""
    compute = _compute_dtype(policy)
    cc = parse_capability(capability)
    if compute in ("float32", "float64"):
        return Support(True, True, f"{compute} runs natively on CUDA GPUs")
    if cc is None:
        return Support(False, False, "the device has no CUDA compute capability (probably not "
                                     "an NVIDIA GPU)")
    if (compute == "bfloat16" and cupy_version is not None
            and cupy_version[0] < CUPY_BFLOAT16_MAJOR):
        return Support(False, False,
                       f"CuPy {cupy_version[0]}.{cupy_version[1]} has no bfloat16 arrays; "
                       f"bfloat16 needs CuPy >= {CUPY_BFLOAT16_MAJOR} with ml_dtypes "
                       f"({install_command('cuda')})")
    if policy == "mixed_float8":
        return _float8_support(cc, cupy_version, cublaslt)
    need = TENSOR_CORE_CAPABILITY[compute]
    if cc >= need:
        return Support(True, True,
                       f"compute capability {_fmt(cc)} >= {_fmt(need)}: {compute} matmuls run on "
                       "tensor cores through cuBLAS, accumulating in float32")
    return Support(True, False,
                   f"compute capability {_fmt(cc)} < {_fmt(need)}: no {compute} tensor cores, so "
                   f"{compute} is stored in 16 bits and matmuls are computed in float32 (expect "
                   "float32 speed at best)")


#: FP8 tensor cores: Ada (8.9) and Hopper (9.0) and later.
FP8_CAPABILITY = (8, 9)
FP8_NATIVE = "native: FP8 GEMMs through cuBLASLt on FP8 tensor cores"


def _float8_support(cc: tuple[int, int], cupy_version: tuple[int, int] | None,
                    cublaslt: str | None) -> Support:
    """mixed_float8: native where the GPU has FP8 tensor cores and cuBLASLt loads (GEMMs whose
    dimensions are not all multiples of 16 stay emulated, each logged once), else emulated
    (the FP8 GEMMs decode their codes and multiply in float32), and why."""
    other = cuda_policy_support("mixed_bfloat16", cc, cupy_version)
    if cc >= FP8_CAPABILITY and cublaslt is None:
        return Support(other.supported, other.supported,
                       f"{FP8_NATIVE} (compute capability {_fmt(cc)} >= "
                       f"{_fmt(FP8_CAPABILITY)}), float32 accumulation, TN layout; GEMMs whose "
                       "dimensions are not all multiples of 16 run emulated; other ops as "
                       f"mixed_bfloat16: {other.reason}")
    if cc >= FP8_CAPABILITY:
        why = (f"emulated: {cublaslt} (compute capability {_fmt(cc)} >= "
               f"{_fmt(FP8_CAPABILITY)} has FP8 tensor cores)")
    else:
        why = (f"emulated: compute capability {_fmt(cc)} < {_fmt(FP8_CAPABILITY)} has no FP8 "
               "tensor cores")
    return Support(other.supported, False,
                   f"{why}; FP8 GEMMs decode their codes exactly and multiply in float32 "
                   f"(correct, not faster than float32); other ops as mixed_bfloat16: "
                   f"{other.reason}")


def device_string(device: Device) -> str:
    """ "<name>, compute capability X.Y", as the guide's log lists a GPU."""
    cc = parse_capability(device.capability)
    name = device.name or "Unknown GPU"
    if cc is None:
        return f"{name}, no compute capability (probably not an Nvidia GPU)"
    return f"{name}, compute capability {_fmt(cc)}"


def _dedup(lines: Sequence[str]) -> list[str]:
    """Consecutive identical lines merged as "<line> (xN)"."""
    out = []
    for line, group in itertools.groupby(lines):
        count = len(list(group))
        out.append(line if count == 1 else f"{line} (x{count})")
    return out


def compatibility_check(policy: str, devices: Sequence[Device],
                        cupy_version: tuple[int, int] | None = None,
                        cublaslt: str | None = None) -> tuple[bool, str]:
    """(ok, text): the body of "Mixed precision compatibility check (<policy>): OK|WARNING"
    for ``devices`` (all the GPUs of the host); ``cublaslt`` as for
    :func:`cuda_policy_support`."""
    compute = _compute_dtype(policy)
    if compute in ("float32", "float64"):
        return True, f"{compute} runs natively on CUDA GPUs"
    if (compute == "bfloat16" and cupy_version is not None
            and cupy_version[0] < CUPY_BFLOAT16_MAJOR):
        return False, cuda_policy_support(policy, "8.0", cupy_version).reason
    if policy == "mixed_float8":
        verdicts = [(d, cuda_policy_support(policy, d.capability, cupy_version, cublaslt))
                    for d in devices]
        lines = [f"  {device_string(d)}: {v.reason}" for d, v in verdicts]
        if not lines:
            return False, f"The dtype policy {policy} is emulated: this machine has no GPU."
        if all(v.fast for _, v in verdicts):
            return True, "\n".join([f"FP8 GEMMs run natively (cuBLASLt) with dtype policy "
                                    f"{policy}. Your GPUs:", *lines])
        return False, "\n".join([f"FP8 GEMMs are emulated on some or all GPUs with dtype policy "
                                 f"{policy} (correct, not faster than float32). Your GPUs:",
                                 *lines])
    need = TENSOR_CORE_CAPABILITY[compute]
    cc_text = _fmt(need)
    fast: list[str] = []
    slow: list[str] = []
    for device in devices:
        cc = parse_capability(device.capability)
        (fast if cc is not None and cc >= need else slow).append(device_string(device))
    if slow:
        if fast:
            head = (f"Some of your GPUs may run slowly with dtype policy {policy} because they "
                    f"do not all have compute capability of at least {cc_text}. Your GPUs:")
        elif len(slow) == 1:
            head = (f"Your GPU may run slowly with dtype policy {policy} because it does not "
                    f"have compute capability of at least {cc_text}. Your GPU:")
        else:
            head = (f"Your GPUs may run slowly with dtype policy {policy} because they do not "
                    f"have compute capability of at least {cc_text}. Your GPUs:")
        lines = [head, *(f"  {d}" for d in _dedup(fast + slow)),
                 f"See {_GPU_LIST} for a list of GPUs and their compute capabilities.",
                 _PREFIX_SUFFIX]
        return False, "\n".join(lines)
    if not fast:
        return False, (f"The dtype policy {policy} may run slowly because this machine does not "
                       f"have a GPU. Only Nvidia GPUs with compute capability of at least "
                       f"{cc_text} run quickly with {policy}.\n{_PREFIX_SUFFIX}")
    if len(fast) == 1:
        return True, (f"Your GPU will likely run quickly with dtype policy {policy} as it has "
                      f"compute capability of at least {cc_text}. Your GPU: {fast[0]}")
    return True, (f"Your GPUs will likely run quickly with dtype policy {policy} as they all "
                  f"have compute capability of at least {cc_text}")
