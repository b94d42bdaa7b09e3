"""float32 <-> bfloat16 conversions as oneDNN reorders, and the probes that decide where oneDNN's
bfloat16 rounding can be trusted.

Conversions must give ``astype``'s bits (a NaN may lose its payload, not its sign) on every CPU.
oneDNN rounds bfloat16 with ``vcvtneps2bf16`` where it uses avx512_bf16 (a float32 subnormal
becomes 0), in software on avx512_core, and its avx2 code turns bfloat16 -0 into +0: each
direction is used only after its probe passes. The code each instruction set runs is checked
for real in processes whose oneDNN is capped at it (onednn_isa.py), where this CPU has it.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from conftest import assert_same_bits
from mpcore_cpu import CpuBackend
from onednn_isa import NATIVE_BF16_ISAS, library_or_skip, probes_under

import mpcore as mp

#: the CPU backend current, whatever MPCORE_BACKEND says (its own kernels are tested)
pytestmark = pytest.mark.usefixtures("on_cpu")

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)


def _reorder_cast(fallback: Any = None) -> Any:
    from mpcore_onednn.creation import ReorderCache, ReorderCast

    return ReorderCast(fallback or (lambda x, dtype: x.astype(dtype)),
                       ReorderCache(library_or_skip()))


def test_reorders_convert_bfloat16_as_astype_bit_for_bit() -> None:
    from mpcore_onednn.creation import MIN_ELEMENTS_WIDENING

    cast = _reorder_cast()
    # every bfloat16, repeated to the size from which widening takes the reorder
    every = np.tile(np.arange(1 << 16, dtype=np.uint16).view(BF16),
                    -(-MIN_ELEMENTS_WIDENING // (1 << 16)))
    with np.errstate(invalid="ignore"):     # signalling NaNs among them
        assert_same_bits(cast(every, np.float32), every.astype(np.float32))
    # float32 -> bfloat16 over a sweep of bit patterns (every 4093rd of the 2^32, so every
    # exponent and sign), round-to-even ties and their neighbours, subnormals and the
    # overflow edge; all 2^32 patterns were checked once where oneDNN rounds in software
    # (0 mismatches)
    sweep = np.arange(0, 1 << 32, 4093, dtype=np.uint64).astype(np.uint32)
    high = np.random.default_rng(0).integers(0, 1 << 16, 1 << 15, dtype=np.uint32) << 16
    ties = np.concatenate([high | 0x8000, high | 0x7FFF, high | 0x8001, high | 0x18000 >> 1])
    edges = np.array([0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0xFF7FFFFF, 0x00000001, 0x80008000,
                      0x007F8000, 0x807FFFFF, 0x00018000, 0x7F800000, 0xFF800000, 0x7FC00001,
                      0xFFFFFFFF], np.uint32)
    patterns = np.concatenate([sweep, ties, edges]).view(np.float32)
    with np.errstate(invalid="ignore"):
        want = patterns.astype(BF16)
        assert_same_bits(cast(patterns, BF16), want)
    assert cast.calls == sum(cast.trusted.values())
    isa = cast.cache.library.isa
    if isa in NATIVE_BF16_ISAS:   # vcvtneps2bf16 flushes subnormals: ml_dtypes' conversion
        assert cast.trusted == {(BF16, F32): True, (F32, BF16): False}
    elif isa == "avx512_core":
        assert cast.trusted == {(BF16, F32): True, (F32, BF16): True}


@pytest.mark.parametrize("isa", ["AVX2", "AVX512_CORE", "ALL"])
def test_the_probes_are_right_under_every_isa_this_cpu_runs(isa: str) -> None:
    """Under oneDNN capped at ``isa`` (ALL: this CPU's own), each probe trusts oneDNN exactly
    where its results are right, and conversions give astype's bits whatever it decides."""
    library_or_skip()
    found = probes_under(isa)
    if isa != "ALL" and found["isa"] != isa.lower():
        pytest.skip(f"this CPU runs oneDNN at {found['isa']}, not {isa.lower()}")
    for direction, verdict in found["reorder"].items():
        assert verdict["trusted"] == verdict["reorder_exact"], (found["isa"], direction)
        assert verdict["cast_exact"], (found["isa"], direction)
    assert found["relu"]["float32"]
    if found["isa"] == "avx512_core":   # bfloat16 rounded in software: all of it on oneDNN
        assert found["relu"]["bfloat16"]
        assert all(v["trusted"] for v in found["reorder"].values())
    if found["isa"] in NATIVE_BF16_ISAS:
        assert not found["relu"]["bfloat16"]
        assert not found["reorder"]["float32->bfloat16"]["trusted"]


def test_reorders_hand_what_they_do_not_convert_to_the_kernel_they_wrap() -> None:
    handed: list[tuple[np.dtype, np.dtype]] = []

    def fallback(x: np.ndarray, dtype: Any) -> np.ndarray:
        handed.append((x.dtype, np.dtype(dtype)))
        return x.astype(dtype)

    cast = _reorder_cast(fallback)
    big = np.ones((256, 256), np.float32)
    assert cast(big, BF16).dtype == BF16
    trusted = cast.trusted[(F32, BF16)]     # where the probe rejects it, all goes on
    assert cast.calls == int(trusted)
    cast(big[:8, :8], BF16)                           # small
    cast(big[:, ::2], BF16)                           # not contiguous
    cast(big, F16)                                    # a pair it does not make
    cast(big.astype(BF16), F16)
    # widening 65536 elements: ml_dtypes' loop is faster (see MIN_ELEMENTS_WIDENING)
    cast(big.astype(BF16), F32)
    assert cast.calls == int(trusted)
    assert handed == ([(F32, BF16)] * (3 - int(trusted))
                      + [(F32, F16), (BF16, F16), (BF16, F32)])


def test_the_cpu_backend_converts_bfloat16_through_onednn_and_float16_through_the_rest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from mpcore_onednn.creation import ReorderCast

    library_or_skip()
    monkeypatch.setenv("MPCORE_ONEDNN", "force")
    backend = CpuBackend()
    kernel = backend.kernels()["convert"]
    chain = [kernel]
    while hasattr(chain[-1], "fallback"):
        chain.append(chain[-1].fallback)
    reorder = next(k for k in chain if isinstance(k, ReorderCast))
    x = np.random.default_rng(3).standard_normal((300, 900), dtype=np.float32)  # 270000
    y = mp.ops.cast(mp.constant(x, backend=backend), "bfloat16")
    down = int(reorder.trusted[(F32, BF16)])
    assert reorder.calls == down and np.array_equal(y.numpy(), x.astype(BF16))
    back = mp.ops.cast(y, "float32")
    assert reorder.calls == down + int(reorder.trusted[(BF16, F32)])
    assert np.array_equal(back.numpy(), x.astype(BF16).astype(F32))
    calls = reorder.calls
    half = mp.ops.cast(mp.constant(x, backend=backend), "float16")
    assert reorder.calls == calls and np.array_equal(half.numpy(), x.astype(np.float16))
