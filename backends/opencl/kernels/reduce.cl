/* Reductions over the middle axis of a contiguous (outer, K, inner) array: every reduction
 * the backend needs is brought to this form (reduced axes adjacent; transposed first when they
 * are not). One work-item reduces a chunk of `chunk` elements of one (o, i) column; partial
 * results of several chunks are reduced again by a further launch, so long sums keep float32
 * accuracy and still use every core. Accumulation is in A_AT (float32 for 16-bit inputs). */

#if A_FLOAT
#define IS_NAN(v) MP_ISNAN(v)
#else
#define IS_NAN(v) 0
#endif

#define SUM_INIT(v) (v)
#define SUM_STEP(acc, v) ((acc) + (v))
/* NaN wins, as NumPy's max/min. */
#define MAX_STEP(acc, v) ((IS_NAN(acc) || (acc) >= (v)) ? (acc) : (v))
#define MIN_STEP(acc, v) ((IS_NAN(acc) || (acc) <= (v)) ? (acc) : (v))

#define REDUCE(NAME, STEP)                                                                  \
__kernel void NAME(const int outer, const int k, const int inner, const int chunk,          \
                   const int nchunks, const A_AT scale, const int do_scale,                 \
                   __global const A_ST *pa, __global O_ST *po) {                            \
    const int gid = get_global_id(0);                                                       \
    if (gid >= outer * nchunks * inner) return;                                             \
    const int i = gid % inner;                                                              \
    const int j = (gid / inner) % nchunks;                                                  \
    const int o = gid / (inner * nchunks);                                                  \
    const int start = j * chunk;                                                            \
    const int end = min(k, start + chunk);                                                  \
    const long base = ((long)o * k) * inner + i;                                            \
    A_AT acc = LOAD_A(pa, base + (long)start * inner);                                      \
    for (int t = start + 1; t < end; ++t) {                                                 \
        const A_AT v = LOAD_A(pa, base + (long)t * inner);                                  \
        acc = STEP(acc, v);                                                                 \
    }                                                                                       \
    if (do_scale) acc = acc * scale;                                                        \
    STORE_O(po, gid, acc);                                                                  \
}

REDUCE(reduce_sum, SUM_STEP)
REDUCE(reduce_max, MAX_STEP)
REDUCE(reduce_min, MIN_STEP)

/* First index of the maximum along K (the first NaN, if any, as NumPy). */
__kernel void reduce_argmax(const int outer, const int k, const int inner,
                            __global const A_ST *pa, __global long *po) {
    const int gid = get_global_id(0);
    if (gid >= outer * inner) return;
    const int i = gid % inner;
    const int o = gid / inner;
    const long base = ((long)o * k) * inner + i;
    A_CT best = LOAD_A(pa, base);
    long at = 0;
    for (int t = 1; t < k; ++t) {
        if (IS_NAN(best)) break;
        const A_CT v = LOAD_A(pa, base + (long)t * inner);
        if (v > best || IS_NAN(v)) { best = v; at = t; }
    }
    po[gid] = at;
}
