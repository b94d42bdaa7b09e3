/* Gather, its gradient (scatter-add), one-hot. Indices (slot L) may be negative (counted from
 * the end, as NumPy's take). The data is viewed as (outer, axis, inner). */

inline long wrap_index(long v, const int size) { return v < 0 ? v + size : v; }

__kernel void take(const int n, const int axis_size, const int nidx, const int inner,
                   __global const A_ST *pa, __global const L_ST *pidx, __global O_ST *po) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const int in = i % inner;
    const int j = (i / inner) % nidx;
    const int o = i / (inner * nidx);
    const long src = ((long)o * axis_size + wrap_index((long)LOAD_L(pidx, j), axis_size))
                     * inner + in;
    STORE_O(po, i, LOAD_A(pa, src));
}

/* One work-item per (outer, inner) column walks every index in order: duplicates add up
 * deterministically, with no atomics (which 16-bit storage could not use). */
__kernel void take_grad(const int outer, const int axis_size, const int nidx, const int inner,
                        __global const A_ST *pg, __global const L_ST *pidx, __global O_ST *po) {
    const int gid = get_global_id(0);
    if (gid >= outer * inner) return;
    const int in = gid % inner;
    const int o = gid / inner;
    for (int j = 0; j < nidx; ++j) {
        const long dst = ((long)o * axis_size + wrap_index((long)LOAD_L(pidx, j), axis_size))
                         * inner + in;
        const A_CT v = LOAD_O(po, dst) + LOAD_A(pg, ((long)o * nidx + j) * inner + in);
        STORE_O(po, dst, v);
    }
}

__kernel void one_hot(const int n, const int depth, __global const L_ST *pidx,
                      __global O_ST *po) {
    const int i = get_global_id(0);
    if (i < n) STORE_O(po, i, (long)LOAD_L(pidx, i / depth) == (long)(i % depth) ? 1 : 0);
}
