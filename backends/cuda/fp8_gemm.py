"""Which GEMMs cuBLASLt's FP8 kernels take, and how: the pure decisions of the native FP8 path
(:mod:`.cublaslt` makes the calls), tested on machines without a GPU.

cuBLASLt's FP8 matmuls (``cublasLtMatmul`` with CUDA_R_8F_E4M3/E5M2 operands, cuBLAS 12.x) need:
compute capability 8.9 or later; the TN layout (A transposed, B not, column-major); every
dimension and leading dimension a multiple of 16 (16-byte aligned FP8 rows); and at most one
e5m2 operand (there is no e5m2 x e5m2 kernel). A GEMM that misses one runs emulated (codes
decoded exactly, a float32 GEMM: :mod:`mpcore_xp.float8`), and the reason is logged once.

The TN mapping (:func:`tn_operands`, :func:`tn_layouts`). mpcore's ``fp8_matmul(a, b,
transpose_a, transpose_b)`` is the row-major ``Y = op(a) @ op(b)``, (M, K) @ (K, N). A row-major
matrix is its transpose in column-major order, so cuBLAS computes ``Y^T = op(b)^T op(a)^T``
(m, n, k = N, M, K): its A is ``op(b)^T`` held row-major as (N, K), read column-major as K x N
(lda = K) with ``transa = T``; its B is ``op(a)`` held row-major as (M, K), read as K x M
(ldb = K) with ``transb = N``; its D is N x M column-major (ldd = N), which is ``Y``
row-major. Both operands are thus K-contiguous rows; an operand stored the other way round is
transposed first (its FP8 codes, by ``transpose_u8`` in ``fp8.cu``). For a Dense layer
(``x`` (M, K), kernel ``w`` (K, N), gradient ``g`` (M, N)): forward ``x @ w`` transposes ``w``;
dgrad ``g @ w^T`` transposes nothing; wgrad ``x^T @ g`` transposes ``x`` and ``g``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpcore.plugins.settings import env_choice

FP8_CAPABILITY = (8, 9)
ALIGNMENT = 16

logger = logging.getLogger("mpcore")
EMULATED = "the GEMM runs emulated (codes decoded, float32 GEMM)"


@dataclass(frozen=True)
class Fp8GemmRoute:
    """Where one GEMM would run: ``native`` (cuBLASLt FP8) or not, and why."""

    native: bool
    reason: str


def fp8_gemm_route(m: int, k: int, n: int, capability: tuple[int, int],
                   formats: tuple[str, str] = ("e4m3", "e4m3")) -> Fp8GemmRoute:
    """The route of an (m, k) @ (k, n) GEMM on a GPU of ``capability``, its operands' codes
    in ``formats``."""
    for name, value in (("m", m), ("k", k), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"fp8_gemm_route: {name} must be a positive int, got {value!r}")
    cc = f"{capability[0]}.{capability[1]}"
    if tuple(capability) < FP8_CAPABILITY:
        return Fp8GemmRoute(False, f"compute capability {cc} < 8.9 has no FP8 tensor cores: "
                                   f"{EMULATED}")
    odd = [f"{name}={value}" for name, value in (("m", m), ("k", k), ("n", n))
           if value % ALIGNMENT]
    if odd:
        return Fp8GemmRoute(False, f"dimensions {', '.join(odd)} are not multiples of "
                                   f"{ALIGNMENT}, which cuBLASLt's FP8 GEMMs need: {EMULATED}")
    if tuple(formats) == ("e5m2", "e5m2"):
        return Fp8GemmRoute(False, f"cuBLASLt has no e5m2 x e5m2 FP8 GEMM: {EMULATED}")
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


#: ``MPCORE_CUDA_FP8_GEMM``: ``auto`` (cuBLASLt where the route allows and the library loads,
#: else emulated, the reason logged once), ``emulated`` (always), ``cublaslt`` (as auto, but
#: a library that does not load is an error, not a fallback). A switch for comparisons.
FP8_GEMM_ENV = "MPCORE_CUDA_FP8_GEMM"
FP8_GEMM_CHOICES = ("auto", "emulated", "cublaslt")


def fp8_gemm_choice() -> str:
    """The value of ``MPCORE_CUDA_FP8_GEMM`` (a SettingError, a ValueError naming the valid
    values, on a bad one)."""
    return env_choice(FP8_GEMM_ENV, FP8_GEMM_CHOICES)


@dataclass(frozen=True)
class TnOperands:
    """How ``op(a) @ op(b)`` becomes one TN GEMM ``x @ wt^T``: ``x`` = op(a) as (M, K) rows,
    ``wt`` = op(b)^T as (N, K) rows; ``transpose_x``/``transpose_w``: whether the codes of
    ``a``/``b`` must be transposed to get them (they are stored the other way round)."""

    m: int
    k: int
    n: int
    transpose_x: bool
    transpose_w: bool


def tn_operands(a_shape: tuple[int, int], b_shape: tuple[int, int], transpose_a: bool,
                transpose_b: bool) -> TnOperands:
    """The TN form of ``fp8_matmul(a, b, transpose_a, transpose_b)`` (module docstring)."""
    m, k = (a_shape[1], a_shape[0]) if transpose_a else tuple(a_shape)
    n = b_shape[0] if transpose_b else b_shape[1]
    return TnOperands(m, k, n, transpose_x=bool(transpose_a), transpose_w=not transpose_b)


@dataclass(frozen=True)
class TnLayouts:
    """cuBLASLt's arguments for row-major ``Y (M, N) = x (M, K) @ wt (N, K)^T``: the op of A
    and B, each matrix layout as (rows, cols, leading dimension) in column-major terms, and
    the problem size (m, n, k) as cuBLAS counts it."""

    transa: str
    transb: str
    a: tuple[int, int, int]
    b: tuple[int, int, int]
    d: tuple[int, int, int]
    mnk: tuple[int, int, int]


def tn_layouts(m: int, k: int, n: int) -> TnLayouts:
    """cuBLAS's A = ``wt`` (K x N column-major, lda K, op T), B = ``x`` (K x M, ldb K, op N),
    C = D = ``Y`` (N x M column-major, ldd N): D = A^T B = wt x^T = (x wt^T)^T."""
    return TnLayouts("T", "N", a=(k, n, k), b=(k, m, k), d=(n, m, n), mnk=(n, m, k))


def gemm_scale(xp: Any, a_scale: Any, b_scale: Any) -> Any:
    """The one float32 multiplier of the product, as the emulated GEMM computes it:
    ``(1 / scale_a) * (1 / scale_b)`` (mpcore's scales are multipliers, ``codes =
    saturate(x * scale)``), each quotient and the product rounded to float32. cuBLASLt gets it
    as A's scale (B's is 1.0), so the two routes scale by the same float32 number."""
    one = np.float32(1)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv_a = (one / a_scale.astype(np.float32)).astype(np.float32)
        inv_b = (one / b_scale.astype(np.float32)).astype(np.float32)
        return xp.asarray(inv_a * inv_b, dtype=np.float32)
