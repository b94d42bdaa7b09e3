/* GEMM: C[b] = op(A[b]) @ op(B[b]) with op = identity or transpose, any M, N, K, accumulated in
 * A_AT (float32 for 16-bit storage). Two variants, chosen by the host per device
 * kind and built with their tile sizes as macros: "tiled" (TSM defined; local memory, for GPUs)
 * and "packed" (KC defined; packed panels and cache blocking, for CPU devices such as PoCL).
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

#ifdef KC
/* The CPU-device variant ("packed"). On a CPU, local memory is ordinary cached memory and the
 * caches do the staging, so what matters is the order of memory accesses. Both operands are
 * first packed (O(n^2), one pass that also resolves transposes and widens 16-bit storage to the
 * compute type; native half keeps half panels, widened at the multiply-add) into panels:
 * Ap[batch][PM][K][WPM] holds WPM rows of op(A) interleaved along K, Bp[batch][PN][K][VW] holds
 * VW columns of op(B), zero-padded to whole panels. A work-item computes one WPM x VW block of C
 * from one A panel and one B panel, both read contiguously (no cache-set conflicts or TLB misses
 * from row strides, which is what made large sizes slow), with VW-wide vector multiply-adds into
 * WPM register accumulators. The K loop is cut into KC-deep blocks with a barrier after each:
 * PoCL runs every work-item of a group through one block before the next, so the group's
 * A and B blocks (a few tens of KiB) stay in L1/L2 while they are reused, instead of each work-item
 * streaming its whole panels through the cache. Spilling the accumulators at each barrier costs
 * one store and load per KC multiply-adds. */
/* Packing over a 3-D range (k, panel, batch): each work-item writes the PW consecutive
 * elements of one (panel, k), with no division per element (a 1-D range over elements spent
 * most of its time in the divisions that recover (batch, panel, k, w) from the index). */
__kernel void pack_k(const int rows, const int K, const int P, const long rs, const long ks,
                     const long stride, __global const A_ST *X, __global A_CT *Xp) {
    const int k = get_global_id(0);
    if (k >= K) return;
    const int p = get_global_id(1);
    const long b = get_global_id(2);
    __global A_CT *dst = Xp + ((b * P + p) * (long)K + k) * PW;
    const long src = b * stride + (long)k * ks;
    _Pragma("unroll")
    for (int w = 0; w < PW; ++w) {
        const int row = p * PW + w;
        dst[w] = row < rows ? (A_CT)LOAD_A(X, src + (long)row * rs) : (A_CT)0;
    }
}

__kernel void gemm_packed(const int M, const int N, const int K, const int PM, const int PN,
                          __global const A_CT *Ap, __global const A_CT *Bp, __global O_ST *C) {
    const int jp = get_global_id(0), ip = get_global_id(1);
    const long b = get_global_id(2);
    __global const A_CT *pa = Ap + (b * PM + ip) * (long)K * WPM;
    __global const A_CT *pb = Bp + (b * PN + jp) * (long)K * VW;
    VT acc[WPM];
    for (int r = 0; r < WPM; ++r) acc[r] = (VT)(0);
    for (int k0 = 0; k0 < K; k0 += KC) {
        const int k1 = min(k0 + KC, K);
        for (int k = k0; k < k1; ++k) {
            const VT bv = WIDEN(VLOAD(k, pb));
            _Pragma("unroll")
            for (int r = 0; r < WPM; ++r)
                acc[r] = MAD((VT)((A_AT)pa[(long)k * WPM + r]), bv, acc[r]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const int m0 = ip * WPM, n0 = jp * VW;
    __global O_ST *pc = C + b * (long)M * N;
    for (int r = 0; r < WPM; ++r) {
        const int gm = m0 + r;
        if (gm >= M) break;
        A_AT out[VW];
        VSTORE(acc[r], 0, out);
        for (int c = 0; c < VW && n0 + c < N; ++c) STORE_O(pc, (long)gm * N + n0 + c, out[c]);
    }
}
#endif
