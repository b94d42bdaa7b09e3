"""cuBLASLt's FP8 GEMMs on a GPU (skipped elsewhere with the reason): native against emulated for
the forward, dgrad and wgrad GEMMs within fp8_check's bound, the quantised transposes bit for
bit, the public ``mp.ops.fp8_matmul``, and the verdict. What runs without a GPU:
test_cublaslt.py; the same comparisons at more shapes, with the speed: ``python -m
mpcore_cuda.fp8_check`` (the checklist's ``fp8 gemms``)."""

from __future__ import annotations

import numpy as np
import pytest
from mpcore_cuda import CudaBackend, fp8_check

import mpcore as mp

_REASON = CudaBackend().unavailable_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"cuda: {_REASON}")


@pytest.fixture(scope="module")
def cuda() -> CudaBackend:
    be = mp.get_backend("cuda")
    be.kernels()
    return be  # type: ignore[return-value]


def _fp8_gpu(be: CudaBackend) -> bool:
    major, minor = (int(p) for p in be.device().capability.split("."))
    return (major, minor) >= (8, 9)


@pytest.mark.parametrize("shape", [(256, 512, 384), (96, 80, 48), (128, 784, 10)])
def test_native_gemms_agree_with_the_emulated_ones(cuda: CudaBackend,
                                                   shape: tuple[int, int, int]) -> None:
    if not _fp8_gpu(cuda):
        pytest.skip(f"compute capability {cuda.device().capability} < 8.9: no FP8 tensor cores")
    results = fp8_check.compare(cuda, *shape)
    bad = [r for r in results if not r["ok"]]
    assert not bad, bad[:3]
    assert any(r.get("native") for r in results) == fp8_check.native_dims(*shape)


@pytest.mark.parametrize("shape", [(1, 1), (33, 65), (1000, 17), (64, 4096)])
def test_quantised_transposes_are_exact(cuda: CudaBackend, shape: tuple[int, int]) -> None:
    cp = cuda.cp
    codes = cp.asarray(np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8))
    out = cuda.fp8_transpose(codes)
    assert out.flags.c_contiguous and bool(cp.array_equal(out, codes.T))


def test_the_public_op_takes_the_native_route(cuda: CudaBackend) -> None:
    if not _fp8_gpu(cuda):
        pytest.skip("no FP8 tensor cores")
    from mpcore_xp.float8 import decode_table

    from mpcore.ops.float8 import FORMATS, Quantized

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 128)), rng.standard_normal((128, 32))
    sa, sb = (mp.constant(s, dtype="float32", backend=cuda) for s in (8.0, 2.0))
    qa = mp.ops.quantize_fp8(mp.constant(a, dtype="float32", backend=cuda), sa, "e4m3")[0]
    qb = mp.ops.quantize_fp8(mp.constant(b, dtype="float32", backend=cuda), sb, "e4m3")[0]
    y = mp.ops.fp8_matmul(Quantized(qa, sa, FORMATS["e4m3"]), Quantized(qb, sb, FORMATS["e4m3"]),
                          dtype="bfloat16")
    table = decode_table("e4m3").astype(np.float64)     # the exact product, on the host
    want = (table[qa.numpy()] / 8) @ (table[qb.numpy()] / 2)
    assert y.dtype == "bfloat16"
    np.testing.assert_allclose(y.numpy().astype(np.float64), want, rtol=1e-2, atol=1e-2)
    assert cuda._fp8_route(64, 128, 32, "e4m3", "e4m3").native


def test_the_verdict_says_native_where_cublaslt_loads(cuda: CudaBackend) -> None:
    verdict = cuda.policy_support("mixed_float8", cuda.device())
    if _fp8_gpu(cuda):
        assert verdict.fast and "native: FP8 GEMMs through cuBLASLt" in verdict.reason
    else:
        assert not verdict.fast and "no FP8 tensor cores" in verdict.reason
