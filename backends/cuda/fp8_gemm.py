"""Which GEMMs cuBLASLt's FP8 kernels could take: the pure decisions of the native FP8 path, so
that they are tested before the path exists. The cuBLASLt call itself is not wired yet (the
``mixed_float8`` verdict says "emulated: cuBLASLt FP8 GEMMs not yet wired"); every FP8 GEMM runs
emulated today (:mod:`mpcore_xp.float8`).

cuBLASLt's FP8 matmuls (``cublasLtMatmul`` with CUDA_R_8F_E4M3/E5M2 operands, cuBLAS 12.x) need:
compute capability 8.9 or later; the TN layout (A transposed, B not, column-major), which a
row-major ``x @ w`` gives for free by computing ``(w^T x^T)^T``; and every dimension and leading
dimension a multiple of 16 (16-byte aligned FP8 rows). A GEMM that misses one stays in bfloat16,
and the reason is logged once per layer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

FP8_CAPABILITY = (8, 9)
ALIGNMENT = 16

logger = logging.getLogger("mpcore")


@dataclass(frozen=True)
class Fp8GemmRoute:
    """Where one GEMM would run: ``native`` (cuBLASLt FP8) or not, and why."""

    native: bool
    reason: str


def fp8_gemm_route(m: int, k: int, n: int, capability: tuple[int, int]) -> Fp8GemmRoute:
    """The route of an (m, k) @ (k, n) GEMM on a GPU of ``capability``."""
    for name, value in (("m", m), ("k", k), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"fp8_gemm_route: {name} must be a positive int, got {value!r}")
    cc = f"{capability[0]}.{capability[1]}"
    if tuple(capability) < FP8_CAPABILITY:
        return Fp8GemmRoute(False, f"compute capability {cc} < 8.9 has no FP8 tensor cores: "
                                   "the GEMM stays in bfloat16")
    odd = [f"{name}={value}" for name, value in (("m", m), ("k", k), ("n", n))
           if value % ALIGNMENT]
    if odd:
        return Fp8GemmRoute(False, f"dimensions {', '.join(odd)} are not multiples of "
                                   f"{ALIGNMENT}, which cuBLASLt's FP8 GEMMs need: the GEMM "
                                   "stays in bfloat16")
    return Fp8GemmRoute(True, f"({m}, {k}) @ ({k}, {n}) on compute capability {cc}: cuBLASLt "
                              "FP8 GEMM, TN layout")


class RouteLog:
    """Logs a layer's reason for staying in bfloat16 once (not once per step)."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()

    def note(self, layer: str, route: Fp8GemmRoute) -> bool:
        """Log ``route``'s reason for ``layer`` if it is not native and not logged before;
        whether it logged."""
        key = (layer, route.reason)
        if route.native or key in self._seen:
            return False
        self._seen.add(key)
        logger.info("FP8 GEMM of layer %r: %s", layer, route.reason)
        return True
