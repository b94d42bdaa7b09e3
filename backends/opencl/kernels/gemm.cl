/* GEMM: C[b] = op(A[b]) @ op(B[b]) with op = identity or transpose, any M, N, K, accumulated in
 * A_AT (float32 for 16-bit storage). Two variants, chosen by the host per device
 * kind and built with their tile sizes as macros: "tiled" (TSM defined; local memory, for GPUs)
 * and "packed" (PACKED defined; register blocks read in place or from packed panels, for CPU
 * devices such as PoCL).
 *
 * Tiled: a work-group computes a TSM x TSN tile of C. Each K-step it stages a TSK-deep slice of
 * A and B in local memory in the compute type A_CT (float for 16-bit storage, widened once per
 * element; half in the native-half variant, which halves local memory and its traffic and widens
 * at the multiply-add); transposes and edges are resolved while staging, so the inner loop has
 * no branch. Each work-item then computes a WPM x VW register block with VW-wide vector
 * multiply-adds into A_AT accumulators. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
/* VW comes from the device (1, 2, 4, 8 or 16); OpenCL C has no 1-wide vector type or vload1 */
#if VW == 1
#define VT A_AT
#define VLOAD(i, p) ((p)[i])
#define VSTORE(v, i, p) ((p)[i] = (v))
#else
#define VT CAT(A_AT, VW)
#define VLOAD CAT(vload, VW)
#define VSTORE CAT(vstore, VW)
#endif
/* staged values widened to the accumulation type (a no-op unless native half) */
#define WIDEN(v) CAT(convert_, VT)(v)
#define WG_X (TSN / VW)
#define WG_Y (TSM / WPM)
#define WGS (WG_X * WG_Y)

#if A_FLOAT
#define MAD(a, b, c) mad(a, b, c)
#else
#define MAD(a, b, c) ((a) * (b) + (c))
#endif

#ifdef TSM
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
            const VT b = WIDEN(VLOAD(0, &Bs[kk][tx * VW]));                                 \
            _Pragma("unroll")                                                               \
            for (int r = 0; r < WPM; ++r)                                                   \
                acc[r] = MAD((VT)((A_AT)As[kk][ty * WPM + r]), b, acc[r]);                  \
        }                                                                                   \
        barrier(CLK_LOCAL_MEM_FENCE);                                                       \
    }                                                                                       \
    for (int r = 0; r < WPM; ++r) {                                                         \
        const int gm = m0 + ty * WPM + r;                                                   \
        if (gm >= M) break;                                                                 \
        A_AT out[VW];                                                                       \
        VSTORE(acc[r], 0, out);                                                             \
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

#endif

#ifdef PACKED
/* The CPU-device variant ("packed"). On a CPU, local memory is ordinary cached memory and the
 * caches do the staging, so what matters is the order of memory accesses and that the inner
 * loop keeps its accumulators in registers. A work-item computes one WPM x CW block of C
 * (CW = NV vectors of VW lanes) with NV vector loads of op(B), WPM broadcasts of op(A) and
 * WPM * NV multiply-adds per k; WPM * NV accumulators plus NV B vectors must fit the vector
 * registers (tiling.py, PACKED_ROWS).
 *
 * Operands are read in place where they are already laid out for this loop (the host decides):
 * op(B) when it is B untransposed, in 32- or 64-bit storage, and at least CW columns wide;
 * op(A) when in such storage and at least WPM rows high; each while it is small enough to stay
 * in cache, where that was faster than packing. Otherwise they are first packed
 * (pack_k: O(n^2), one pass that resolves transposes, widens 16-bit storage to the compute
 * type, half kept for native half, and zero-pads to whole panels) into panels:
 * Ap[batch][PM][K][WPM] holds WPM rows of op(A) interleaved along K, Bp[batch][PN][K][CW]
 * holds CW columns of op(B). Reading in place saves the packing passes, which cost about half
 * as much as the multiply itself on the guide's 128x784 @ 784x64
 * (benchmarks/packed_gemm_opencl.py --config a=0,b=0). At the edges
 * of an operand read in place, the last block is shifted back to end at the last row (m_last =
 * M - WPM) or column (n_last = N - CW), so every load stays inside the operand without a
 * branch or a clamp in the inner loop, and it stores only the rows and columns that are its
 * own; for panels m_last and n_last are past the end, so blocks are never shifted. Which
 * operands go in place: linalg.py (_gemm_packed) and tiling.py (PACKED_IN_PLACE_A_BYTES).
 *
 * Element (row m0 + r, k) of op(A) is at A[ip * a_ps + (m0 - ip * WPM + r) * A_RS + k * A_KS]
 * and the B vector (k, v) at B[jp * b_ps + (n0 - jp * CW) + k * b_ks + v * VW]. gemm_packed
 * has the rows of op(A) contiguous (A_RS = 1: panels, or A transposed in place) and
 * gemm_packed_k the K axis (A_KS = 1: A untransposed in place), so that the stride that is 1
 * is known to the compiler.
 *
 * Written for PoCL, whose CPU driver (3.0, on Zen 4) does not inline OpenCL builtins: each
 * mad(), fma(), vload8() or vstore8() is a function call that moves its operands through the
 * stack (objdump of the kernel in PoCL's cache), which made the same loop 3x slower (a copy of
 * this kernel calling mad() and vload8(), timed like benchmarks/packed_gemm_opencl.py). So the
 * loop uses a * b + c (contracted to an FMA, as OpenCL C allows) and plain vector loads through
 * a type aligned to its element, and calls no builtin. There is no barrier: PoCL keeps a
 * work-item's private values that live across a barrier in memory, and a K loop cut by
 * barriers into 128-deep cache blocks ran about 2x slower than one loop on the guide's shapes,
 * and a scalar kernel (one column per work-item, left to PoCL's work-group vectorizer) 1.3x
 * slower than explicit vectors (copies of this kernel, timed the same way; the whole GEMM in the
 * step: benchmarks/opencl_step_profile.py). */
#define CW (VW * NV)
#define FMADD(a, b, c) ((a) * (b) + (c))
/* an unaligned vector of the panel type and of the accumulation type (vload/vstore are calls) */
#if VW == 1
typedef A_CT PANEL_V;
typedef A_AT ACC_V;
#else
typedef CAT(A_CT, VW) __attribute__((aligned(sizeof(A_CT)))) PANEL_V;
typedef VT __attribute__((aligned(sizeof(A_AT)))) ACC_V;
#endif
#if A_HALF
#define PANEL_WIDEN(v) WIDEN(v)
#else
#define PANEL_WIDEN(v) (v)
#endif

/* Packing over a 3-D range (k, panel, batch): each work-item writes the PW consecutive
 * elements of one (panel, k), with no division per element (a 1-D range over elements spent
 * most of its time in the divisions that recover (batch, panel, k, w) from the index). */
__kernel void pack_k(const int rows, const int K, const int P, const long rs, const long ks,
                     const long stride, __global const A_ST *X, __global A_CT *Xp) {
    const int k = get_global_id(0);
    if (!IN_RANGE(k, K)) return;  /* common.cl: vectorizes 16-bit loads on PoCL */
    const int p = get_global_id(1);
    const long b = get_global_id(2);
    __global A_CT *dst = Xp + ((b * P + p) * (long)K + k) * PW;
    const long src = b * stride + (long)k * ks;
    if ((p + 1) * PW <= rows) {
        /* a whole panel: no test per row, so PoCL's work-item loop vectorizes (16-bit loads
         * under a condition keep it scalar) */
        _Pragma("unroll")
        for (int w = 0; w < PW; ++w) dst[w] = (A_CT)LOAD_A(X, src + (long)(p * PW + w) * rs);
        return;
    }
    _Pragma("unroll")
    for (int w = 0; w < PW; ++w) {
        const int row = p * PW + w;
        dst[w] = row < rows ? (A_CT)LOAD_A(X, src + (long)row * rs) : (A_CT)0;
    }
}

#define GEMM_PACKED(NAME, A_RS, A_KS)                                                        \
__kernel void NAME(const int M, const int N, const int K, const int m_last, const int n_last, \
                   const long a_ps, const long a_rs, const long a_ks, const long a_bs,       \
                   const long b_ps, const long b_ks, const long b_bs,                        \
                   __global const A_CT *A, __global const A_CT *B, __global O_ST *C) {       \
    const int jp = get_global_id(0), ip = get_global_id(1);                                  \
    const long bt = get_global_id(2);                                                        \
    const int m0 = min(ip * WPM, m_last), n0 = min(jp * CW, n_last);                         \
    __global const A_CT *pa = A + bt * a_bs + ip * a_ps + (m0 - ip * WPM) * (A_RS);          \
    __global const A_CT *pb = B + bt * b_bs + jp * b_ps + (n0 - jp * CW);                    \
    VT acc[WPM][NV];                                                                         \
    _Pragma("unroll")                                                                        \
    for (int r = 0; r < WPM; ++r)                                                            \
        _Pragma("unroll")                                                                    \
        for (int v = 0; v < NV; ++v) acc[r][v] = (VT)(0);                                    \
    for (int k = 0; k < K; ++k) {                                                            \
        VT bv[NV];                                                                           \
        _Pragma("unroll")                                                                    \
        for (int v = 0; v < NV; ++v)                                                         \
            bv[v] = PANEL_WIDEN(*(__global const PANEL_V *)(pb + k * b_ks + v * VW));        \
        _Pragma("unroll")                                                                    \
        for (int r = 0; r < WPM; ++r) {                                                      \
            const VT av = (VT)((A_AT)pa[k * (A_KS) + r * (A_RS)]);                           \
            _Pragma("unroll")                                                                \
            for (int v = 0; v < NV; ++v) acc[r][v] = FMADD(av, bv[v], acc[r][v]);            \
        }                                                                                    \
    }                                                                                        \
    __global O_ST *pc = C + bt * (long)M * N;                                                \
    /* a shifted block's own rows and columns; r runs from 0 so that the loop unrolls and  \
       acc keeps constant indices (a variable one would put acc in memory throughout) */     \
    const int r0 = ip * WPM - m0, c0 = jp * CW - n0;                                         \
    _Pragma("unroll")                                                                        \
    for (int r = 0; r < WPM; ++r) {                                                          \
        if (r < r0 || m0 + r >= M) continue;                                                 \
        A_AT out[CW];                                                                        \
        _Pragma("unroll")                                                                    \
        for (int v = 0; v < NV; ++v) *(ACC_V *)(out + v * VW) = acc[r][v];                   \
        for (int c = c0; c < CW && n0 + c < N; ++c)                                          \
            STORE_O(pc, (long)(m0 + r) * N + n0 + c, out[c]);                                \
    }                                                                                        \
}

GEMM_PACKED(gemm_packed, 1, a_ks)
GEMM_PACKED(gemm_packed_k, a_rs, 1)
#endif
