/* Tiled GEMM: C[b] = op(A[b]) @ op(B[b]) with op = identity or transpose, any M, N, K.
 * A work-group computes a TSM x TSN tile of C. Each K-step it stages a TSK-deep slice of A and
 * B in local memory, converted to the accumulation type (so 16-bit storage is widened once per
 * element, transposes and edges are resolved while staging, and the inner loop has no branch).
 * Each work-item then computes a WPM x VW register block with VW-wide vector multiply-adds:
 * register blocking and vector loads are what make this fast on a CPU device (PoCL), local
 * memory is what makes it fast on a GPU. The tile sizes are macros set by the host. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define VT CAT(A_CT, VW)
#define VLOAD CAT(vload, VW)
#define WG_X (TSN / VW)
#define WG_Y (TSM / WPM)
#define WGS (WG_X * WG_Y)

/* LOADV_B(v, p, i): VW consecutive elements from p + i, widened to VT. */
#if A_HALF
#define LOADV_B(v, p, i) v = CAT(vload_half, VW)(0, (p) + (i))
#elif A_BF16
#define LOADV_B(v, p, i) \
    v = CAT(as_float, VW)(CAT(convert_uint, VW)(VLOAD(0, (p) + (i))) << 16)
#else
#define LOADV_B(v, p, i) v = VLOAD(0, (p) + (i))
#endif

#if A_FLOAT
#define MAD(a, b, c) mad(a, b, c)
#else
#define MAD(a, b, c) ((a) * (b) + (c))
#endif

#define GEMM(NAME, TA, TB)                                                                  \
__kernel __attribute__((reqd_work_group_size(WG_X, WG_Y, 1)))                               \
void NAME(const int M, const int N, const int K, const long stride_a, const long stride_b,  \
          const long stride_c, __global const A_ST *A, __global const A_ST *B,              \
          __global O_ST *C) {                                                               \
    __local A_CT As[TSK][TSM];                                                              \
    __local A_CT Bs[TSK][TSN + VW];                                                         \
    const int tx = get_local_id(0), ty = get_local_id(1);                                   \
    const int tid = ty * WG_X + tx;                                                         \
    const int m0 = get_group_id(1) * TSM, n0 = get_group_id(0) * TSN;                       \
    const long ao = get_global_id(2) * stride_a;                                            \
    const long bo = get_global_id(2) * stride_b;                                            \
    const long co = get_global_id(2) * stride_c;                                            \
    VT acc[WPM];                                                                            \
    for (int r = 0; r < WPM; ++r) acc[r] = (VT)(0);                                         \
    for (int k0 = 0; k0 < K; k0 += TSK) {                                                   \
        for (int idx = tid; idx < TSM * TSK; idx += WGS) {                                  \
            /* walk the stored matrix row by row, so neighbouring work-items read           \
               neighbouring addresses */                                                    \
            const int m = TA ? idx % TSM : idx / TSK;                                       \
            const int kk = TA ? idx / TSM : idx % TSK;                                      \
            const int gm = m0 + m, gk = k0 + kk;                                            \
            As[kk][m] = (gm < M && gk < K)                                                  \
                ? LOAD_A(A, ao + (TA ? (long)gk * M + gm : (long)gm * K + gk)) : (A_CT)(0); \
        }                                                                                   \
        for (int idx = tid; idx < TSN * TSK; idx += WGS) {                                  \
            const int n = TB ? idx / TSK : idx % TSN;                                       \
            const int kk = TB ? idx % TSK : idx / TSN;                                      \
            const int gn = n0 + n, gk = k0 + kk;                                            \
            Bs[kk][n] = (gn < N && gk < K)                                                  \
                ? LOAD_A(B, bo + (TB ? (long)gn * K + gk : (long)gk * N + gn)) : (A_CT)(0); \
        }                                                                                   \
        barrier(CLK_LOCAL_MEM_FENCE);                                                       \
        for (int kk = 0; kk < TSK; ++kk) {                                                  \
            const VT b = VLOAD(0, &Bs[kk][tx * VW]);                                        \
            _Pragma("unroll")                                                               \
            for (int r = 0; r < WPM; ++r) acc[r] = MAD((VT)(As[kk][ty * WPM + r]), b, acc[r]); \
        }                                                                                   \
        barrier(CLK_LOCAL_MEM_FENCE);                                                       \
    }                                                                                       \
    for (int r = 0; r < WPM; ++r) {                                                         \
        const int gm = m0 + ty * WPM + r;                                                   \
        if (gm >= M) break;                                                                 \
        A_CT out[VW];                                                                       \
        CAT(vstore, VW)(acc[r], 0, out);                                                    \
        for (int c = 0; c < VW; ++c) {                                                      \
            const int gn = n0 + tx * VW + c;                                                \
            if (gn < N) STORE_O(C, co + (long)gm * N + gn, out[c]);                         \
        }                                                                                   \
    }                                                                                       \
}

GEMM(gemm_nn, 0, 0)
GEMM(gemm_nt, 0, 1)
GEMM(gemm_tn, 1, 0)
GEMM(gemm_tt, 1, 1)

/* The CPU-device variant: no local memory and no barrier. On a CPU, local memory is ordinary
 * cached memory and a barrier makes the driver spill every work-item's accumulators between
 * the phases it separates (PoCL keeps live values in per-work-item arrays), so each work-item
 * instead streams its operands from global memory (the caches do the tiling) and keeps a
 * WPM x VW block of C in registers for the whole K loop. */
#define GEMM_REG(NAME, TA, TB)                                                              \
__kernel void NAME(const int M, const int N, const int K, const long stride_a,              \
                   const long stride_b, const long stride_c, __global const A_ST *A,        \
                   __global const A_ST *B, __global O_ST *C) {                              \
    const int n0 = get_global_id(0) * VW, m0 = get_global_id(1) * WPM;                      \
    if (n0 >= N || m0 >= M) return;                                                         \
    const long ao = get_global_id(2) * stride_a;                                            \
    const long bo = get_global_id(2) * stride_b;                                            \
    const long co = get_global_id(2) * stride_c;                                            \
    const bool full = (m0 + WPM <= M) && (n0 + VW <= N);                                    \
    VT acc[WPM];                                                                            \
    for (int r = 0; r < WPM; ++r) acc[r] = (VT)(0);                                         \
    if (full && !TB) {                                                                      \
        for (int k = 0; k < K; ++k) {                                                       \
            VT b;                                                                           \
            LOADV_B(b, B, bo + (long)k * N + n0);                                           \
            _Pragma("unroll")                                                               \
            for (int r = 0; r < WPM; ++r) {                                                 \
                const A_CT a = LOAD_A(A, ao + (TA ? (long)k * M + m0 + r                    \
                                                  : (long)(m0 + r) * K + k));               \
                acc[r] = MAD((VT)(a), b, acc[r]);                                           \
            }                                                                               \
        }                                                                                   \
    } else {                                                                                \
        for (int k = 0; k < K; ++k) {                                                       \
            A_CT bv[VW];                                                                    \
            for (int c = 0; c < VW; ++c) {                                                  \
                const int gn = min(n0 + c, N - 1);                                          \
                bv[c] = LOAD_A(B, bo + (TB ? (long)gn * K + k : (long)k * N + gn));         \
            }                                                                               \
            const VT b = VLOAD(0, bv);                                                      \
            for (int r = 0; r < WPM; ++r) {                                                 \
                const int gm = min(m0 + r, M - 1);                                          \
                const A_CT a = LOAD_A(A, ao + (TA ? (long)k * M + gm : (long)gm * K + k));  \
                acc[r] = MAD((VT)(a), b, acc[r]);                                           \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    for (int r = 0; r < WPM; ++r) {                                                         \
        const int gm = m0 + r;                                                              \
        if (gm >= M) break;                                                                 \
        A_CT out[VW];                                                                       \
        CAT(vstore, VW)(acc[r], 0, out);                                                    \
        for (int c = 0; c < VW; ++c) {                                                      \
            const int gn = n0 + c;                                                          \
            if (gn < N) STORE_O(C, co + (long)gm * N + gn, out[c]);                         \
        }                                                                                   \
    }                                                                                       \
}

GEMM_REG(gemm_reg_nn, 0, 0)
GEMM_REG(gemm_reg_nt, 0, 1)
GEMM_REG(gemm_reg_tn, 1, 0)
GEMM_REG(gemm_reg_tt, 1, 1)
