"""CPU verdicts: pure rules for described CPUs, /proc/cpuinfo parsing, check_policy with a
measurement on the real CPU."""

from __future__ import annotations

import pytest
from mpcore_cpu import CpuBackend, cpu_device, cpu_policy_support, parse_cpuinfo

import mpcore as mp
from mpcore.core.backend import Device, KernelSet
from mpcore.plugins.extras import install_command

#: the CPU backend current, whatever MPCORE_BACKEND says (its own kernels are tested)
pytestmark = pytest.mark.usefixtures("on_cpu")

SKYLAKE = frozenset({"avx2", "fma", "f16c", "avx512f"})
COOPER_LAKE = SKYLAKE | {"avx512_bf16"}
SAPPHIRE_RAPIDS = COOPER_LAKE | {"amx_tile", "amx_bf16", "avx512_fp16"}
GRANITE_RAPIDS = SAPPHIRE_RAPIDS | {"amx_fp16"}
ONEDNN_BF16 = {"bfloat16": "oneDNN bf16 GEMM"}
BOTH = {"bfloat16": "oneDNN", "float16": "oneDNN"}


@pytest.mark.parametrize("features", [frozenset(), SKYLAKE, COOPER_LAKE, SAPPHIRE_RAPIDS])
@pytest.mark.parametrize("policy", ["float32", "float64"])
def test_full_precision_is_always_fast(policy: str, features: frozenset[str]) -> None:
    s = cpu_policy_support(policy, features, BOTH)
    assert (s.supported, s.fast) == (True, True)
    assert policy in s.reason


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16", "float16", "bfloat16"])
@pytest.mark.parametrize("features", [frozenset(), SKYLAKE, COOPER_LAKE, GRANITE_RAPIDS])
def test_16_bit_without_a_fast_kernel_is_supported_not_fast(policy: str,
                                                           features: frozenset[str]) -> None:
    s = cpu_policy_support(policy, features)
    assert (s.supported, s.fast) == (True, False)
    assert "float32" in s.reason  # says how it is really computed


def test_reasons_name_what_is_missing_or_present() -> None:
    lacking = cpu_policy_support("mixed_bfloat16", SKYLAKE)
    assert "lacks avx512_bf16 and amx_bf16" in lacking.reason
    having = cpu_policy_support("mixed_bfloat16", COOPER_LAKE)
    assert "avx512_bf16" in having.reason and "NumPy has no bfloat16 GEMM" in having.reason
    assert install_command("onednn") in having.reason
    fp16 = cpu_policy_support("mixed_float16", SAPPHIRE_RAPIDS)
    assert "avx512_fp16" in fp16.reason and not fp16.fast


@pytest.mark.parametrize(("features", "fast"), [
    (frozenset(), False), (SKYLAKE, False), (COOPER_LAKE, True),
    (frozenset({"amx_bf16"}), True), (frozenset({"avx512_fp16"}), False),
])
def test_a_fast_bf16_kernel_needs_the_instructions(features: frozenset[str], fast: bool) -> None:
    s = cpu_policy_support("mixed_bfloat16", features, ONEDNN_BF16)
    assert (s.supported, s.fast) == (True, fast)
    assert "oneDNN bf16 GEMM" in s.reason
    if not fast:
        assert "emulated" in s.reason
    # a bfloat16 kernel says nothing about float16
    assert not cpu_policy_support("mixed_float16", features | {"avx512_fp16"}, ONEDNN_BF16).fast


@pytest.mark.parametrize(("features", "fast"), [
    (SAPPHIRE_RAPIDS, True), (COOPER_LAKE, False), (frozenset({"amx_fp16"}), True)])
def test_a_fast_fp16_kernel_needs_the_instructions(features: frozenset[str], fast: bool) -> None:
    assert cpu_policy_support("mixed_float16", features, BOTH).fast is fast


def test_unknown_policy_in_the_rules() -> None:
    with pytest.raises(ValueError, match="mixed_float16"):
        cpu_policy_support("int8", SKYLAKE)


class _FastBf16Cpu(CpuBackend):
    """A CPU backend whose plugin kernel sets include a (claimed) fast bfloat16 GEMM."""

    name = "cpu-fast-bf16-test"

    def _activate(self) -> None:
        super()._activate()
        self._kernel_sets = (*self._kernel_sets, KernelSet(
            provider="test", kernels={}, fast_dtypes=frozenset({"bfloat16"}),
            reason="a bf16 test kernel"))


def test_backend_verdict_uses_its_kernel_sets_and_the_device() -> None:
    be = _FastBf16Cpu()
    with_bf16 = Device(name="Cooper Lake", features=COOPER_LAKE)
    without = Device(name="Skylake", features=SKYLAKE)
    assert be.policy_support("mixed_bfloat16", with_bf16).fast is True
    assert be.policy_support("mixed_bfloat16", without).fast is False
    assert be.policy_support("mixed_float16", with_bf16).fast is False
    plain = mp.get_backend("cpu")
    if not plain.fast_dtypes_from_plugins():
        assert plain.policy_support("mixed_bfloat16", with_bf16).fast is False


X86 = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse avx2 fma f16c avx512f avx512_bf16 avx512_fp16 amx_tile amx_bf16
bugs\t\t: spectre_v1

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse something_else
"""

ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp bf16 sve
CPU implementer\t: 0x41
CPU architecture: 8
CPU part\t: 0xd40

processor\t: 1
BogoMIPS\t: 50.00
Features\t: fp asimd
CPU implementer\t: 0x41
"""


def test_parse_cpuinfo_x86() -> None:
    name, vendor, flags = parse_cpuinfo(X86)
    assert name == "Intel(R) Xeon(R) Platinum 8480+"
    assert vendor == "GenuineIntel"
    assert {"avx512_bf16", "amx_bf16", "avx512_fp16", "avx2"} <= flags
    assert "something_else" not in flags  # the first processor only


def test_parse_cpuinfo_arm() -> None:
    name, vendor, flags = parse_cpuinfo(ARM)
    assert vendor == "0x41"
    assert {"asimd", "bf16", "sve", "fphp"} <= flags
    assert name == ""  # ARM kernels print no model name; cpu_device falls back to platform


def test_parse_cpuinfo_empty() -> None:
    assert parse_cpuinfo("") == ("", "", frozenset())


def test_this_cpu_is_described() -> None:
    dev = cpu_device()
    assert dev.kind == "cpu" and dev.name
    assert dev.features <= frozenset({
        "avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni",
        "amx_tile", "amx_bf16", "amx_fp16", "amx_int8", "asimd", "fphp", "asimdhp", "bf16",
        "sve"})
    described = dev.describe()
    assert described["cores"] >= 1 and described["features"] == sorted(dev.features)


def test_check_policy_on_the_cpu() -> None:
    cpu = mp.get_backend("cpu")
    v = mp.check_policy("float32", backend="cpu")
    assert (v.policy, v.backend, v.supported, v.fast) == ("float32", "cpu", True, True)
    assert v.device == cpu.device().name and v.measured is None
    mixed = mp.check_policy(mp.Policy("mixed_float16"), backend=cpu)
    expected = cpu.policy_support("mixed_float16", cpu.device())
    assert (mixed.supported, mixed.fast, mixed.reason) == (True, expected.fast, expected.reason)
    assert "mixed_float16 on cpu" in str(mixed)
    with pytest.raises(ValueError, match="valid names"):
        mp.check_policy("fp8")


def test_check_policy_measures() -> None:
    v = mp.check_policy("mixed_bfloat16", backend="cpu", measure=True, n=256)
    m = v.measured
    assert isinstance(m, mp.Measurement)
    assert m.dtype == "bfloat16" and m.n == 256
    assert m.gflops > 0 and m.float32_gflops > 0
    assert m.speedup == pytest.approx(m.gflops / m.float32_gflops)
    assert "GFLOP/s" in str(m) and "Measured:" in str(v)
