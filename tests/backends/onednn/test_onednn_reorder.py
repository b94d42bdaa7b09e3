"""float32 <-> bfloat16 conversions as oneDNN reorders, and the probes that decide where oneDNN's
bfloat16 rounding can be trusted.

Conversions must give ``astype``'s bits (a NaN may lose its payload, not its sign) on every CPU.
oneDNN rounds bfloat16 with ``vcvtneps2bf16`` where it uses avx512_bf16 (a float32 subnormal
becomes 0), in software on avx512_core, and its avx2 code turns bfloat16 -0 into +0: each
direction is used only after its probe passes, and one whose only fault is flushing float32
subnormals only for arrays that hold none. The code each instruction set runs is checked for
real in processes whose oneDNN is capped at it (onednn_isa.py), where this CPU has it.
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
    from mpcore_onednn.creation import EXACT, FLUSHES_SUBNORMALS, subnormals

    # the sweep holds subnormals: where the reorder flushes them, ml_dtypes converted it all
    narrowing = cast.verdicts[(F32, BF16)]
    assert cast.calls == 1 + (narrowing == EXACT)
    normal = patterns[~subnormals(patterns)]
    with np.errstate(invalid="ignore"):
        assert_same_bits(cast(normal, BF16), normal.astype(BF16))
    assert cast.calls == 2 + (narrowing == EXACT)
    isa = cast.cache.library.isa
    if isa in NATIVE_BF16_ISAS:   # vcvtneps2bf16 flushes subnormals: checked for, each array
        assert cast.verdicts == {(BF16, F32): EXACT, (F32, BF16): FLUSHES_SUBNORMALS}
    elif isa == "avx512_core":
        assert cast.verdicts == {(BF16, F32): EXACT, (F32, BF16): EXACT}


def test_a_subnormal_anywhere_sends_a_flushing_reorder_to_the_kernel_it_wraps() -> None:
    """Where oneDNN's narrowing flushes subnormals (vcvtneps2bf16), one subnormal at any place
    of an array, of either sign, and the smallest and largest of them, make the whole array
    ml_dtypes' (eagerly and in a traced step's bound converter), and equal astype's bits."""
    from mpcore_onednn.creation import FLUSHES_SUBNORMALS, MIN_ELEMENTS, has_subnormal

    cast = _reorder_cast()
    x = np.random.default_rng(1).standard_normal(MIN_ELEMENTS * 2, dtype=np.float32)
    cast(x, BF16)
    if cast.verdicts[(F32, BF16)] != FLUSHES_SUBNORMALS:
        pytest.skip(f"oneDNN at {cast.cache.library.isa} rounds float32 -> bfloat16 exactly")
    bound = cast.bind(x, BF16)
    scratch = np.empty(x.size, np.uint32)
    for place in (0, 1, 4097, x.size - 1):
        for bits in (0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00400000):
            y = x.copy()
            y.view(np.uint32)[place] = bits
            assert has_subnormal(y, scratch)
            calls = cast.calls
            assert_same_bits(cast(y, BF16), y.astype(BF16))
            assert_same_bits(bound(y, BF16), y.astype(BF16))
            assert cast.calls == calls
    # zeros of both signs, the smallest normals, infinities and NaNs are not subnormal
    edges = np.array([0, 0x80000000, 0x00800000, 0x80800000, 0x7F800000, 0xFFC00000],
                     np.uint32).view(np.float32)
    y = np.resize(edges, x.size)
    assert not has_subnormal(y, scratch)
    calls = cast.calls
    with np.errstate(invalid="ignore"):
        assert_same_bits(bound(y, BF16), y.astype(BF16))
    assert cast.calls == calls + 1


@pytest.mark.parametrize("isa", ["AVX2", "AVX512_CORE", "ALL"])
def test_the_probes_are_right_under_every_isa_this_cpu_runs(isa: str) -> None:
    """Under oneDNN capped at ``isa`` (ALL: this CPU's own), each probe trusts oneDNN exactly
    where its results are right, and conversions give astype's bits whatever it decides."""
    library_or_skip()
    found = probes_under(isa)
    if isa != "ALL" and found["isa"] != isa.lower():
        pytest.skip(f"this CPU runs oneDNN at {found['isa']}, not {isa.lower()}")
    for direction, verdict in found["reorder"].items():
        # the probe's values hold more ties and NaNs than the sweep: it may reject what the
        # sweep passes (avx2's narrowing), never pass what the sweep rejects
        where = (found["isa"], direction)
        if verdict["verdict"] == "exact":
            assert verdict["reorder_exact"], where
        elif verdict["verdict"] == "flushes subnormals":
            assert verdict["exact_but_subnormals"] and not verdict["reorder_exact"], where
        else:
            assert verdict["verdict"] is None, where
        if verdict["reorder_exact"] and isa != "AVX2":
            assert verdict["verdict"] == "exact", where
        assert verdict["cast_exact"], where
    assert found["relu"]["float32"]
    if found["isa"] == "avx512_core":   # bfloat16 rounded in software: all of it on oneDNN
        assert found["relu"]["bfloat16"]
        assert all(v["verdict"] == "exact" for v in found["reorder"].values())
    if found["isa"] in NATIVE_BF16_ISAS:
        assert not found["relu"]["bfloat16"]
        assert found["reorder"]["float32->bfloat16"]["verdict"] == "flushes subnormals"


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
    # widening 16384 elements: ml_dtypes' loop is faster (see MIN_ELEMENTS_WIDENING)
    cast(big[:64].astype(BF16), F32)
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
