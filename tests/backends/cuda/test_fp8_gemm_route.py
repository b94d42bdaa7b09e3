"""The native FP8 GEMM's decisions (cuBLASLt: cc >= 8.9, every dimension a multiple of 16, not
e5m2 x e5m2), as pure functions: tested on machines without a GPU."""

from __future__ import annotations

import logging

import pytest
from mpcore_cuda.fp8_gemm import RouteLog, fp8_gemm_route


@pytest.mark.parametrize(("dims", "cc", "native", "why"), [
    ((128, 784, 64), (9, 0), True, "cuBLASLt FP8 GEMM, TN layout"),
    ((32, 64, 16), (8, 9), True, "compute capability 8.9"),
    ((128, 784, 10), (9, 0), False, "n=10 are not multiples of 16"),
    ((100, 30, 64), (9, 0), False, "m=100, k=30 are not multiples of 16"),
    ((128, 784, 64), (8, 0), False, "8.0 < 8.9 has no FP8 tensor cores"),
])
def test_routes(dims: tuple[int, int, int], cc: tuple[int, int], native: bool,
                why: str) -> None:
    route = fp8_gemm_route(*dims, cc)
    assert route.native is native and why in route.reason
    assert native or "the GEMM runs emulated" in route.reason


def test_no_e5m2_by_e5m2_kernel() -> None:
    route = fp8_gemm_route(128, 784, 64, (9, 0), ("e5m2", "e5m2"))
    assert not route.native and "no e5m2 x e5m2" in route.reason
    assert fp8_gemm_route(128, 784, 64, (9, 0), ("e5m2", "e4m3")).native


def test_bad_dimensions_are_refused() -> None:
    with pytest.raises(ValueError, match="k must be a positive int"):
        fp8_gemm_route(16, 0, 16, (9, 0))


def test_the_reason_is_logged_once_per_layer(caplog: pytest.LogCaptureFixture) -> None:
    log = RouteLog()
    odd = fp8_gemm_route(128, 784, 10, (9, 0))
    with caplog.at_level(logging.INFO, logger="mpcore"):
        assert log.note("dense_logits", odd) and not log.note("dense_logits", odd)
        assert log.note("other", odd)
        assert not log.note("dense_1", fp8_gemm_route(128, 784, 64, (9, 0)))
    assert [r.getMessage().count("n=10") for r in caplog.records] == [1, 1]
