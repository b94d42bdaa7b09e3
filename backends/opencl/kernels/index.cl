/* Gather, its gradient (scatter-add), one-hot. Indices (slot L) may be negative (counted from
 * the end, as NumPy's take). The data is viewed as (outer, axis, inner). An index outside
 * [-size, size) is recorded in the device error record (common.cl) and never dereferenced:
 * take writes 0 for it, take_grad skips it; the host raises IndexError at its next read. */

/* 256 + code: the recorded value is an unsigned index (see runtime.py ERRORS). */
#define ERR_TAKE (1 + 256 * L_UNSIGNED)
#define ERR_TAKE_GRAD (2 + 256 * L_UNSIGNED)

/* The position index j names on an axis of `size`, or -1 when it names none. */
#if L_UNSIGNED
inline long index_pos(__global const L_ST *p, const int j, const int size) {
    const ulong v = (ulong)LOAD_L(p, j);
    return v < (ulong)size ? (long)v : -1L;
}
#else
inline long index_pos(__global const L_ST *p, const int j, const int size) {
    const long v = (long)LOAD_L(p, j);
    return (v >= -(long)size && v < (long)size) ? (v < 0 ? v + size : v) : -1L;
}
#endif

__kernel void take(const int n, const int axis_size, const int nidx, const int inner,
                   __global const A_ST *pa, __global const L_ST *pidx, __global O_ST *po,
                   __global int *err) {
    const int i = get_global_id(0);
    if (!IN_RANGE(i, n)) return;
    const int in = i % inner;
    const int j = (i / inner) % nidx;
    const int o = i / (inner * nidx);
    const long pos = index_pos(pidx, j, axis_size);
    if (pos < 0) {
        if (in == 0) record_error(err, ERR_TAKE, (long)LOAD_L(pidx, j), axis_size);
        STORE_O(po, i, 0);
        return;
    }
    STORE_O(po, i, LOAD_A(pa, ((long)o * axis_size + pos) * inner + in));
}

/* The same gather, one work-item per gathered row of `inner` elements (outer * nidx items):
 * no divisions per element, and few work-groups (on CPU devices a work-group's scheduling
 * costs more than a short row's copy). */
__kernel void take_rows(const int rows, const int axis_size, const int nidx, const int inner,
                        __global const A_ST *pa, __global const L_ST *pidx, __global O_ST *po,
                        __global int *err) {
    const int r = get_global_id(0);
    if (r >= rows) return;
    const int j = r % nidx;
    const long pos = index_pos(pidx, j, axis_size);
    const long out0 = (long)r * inner;
    if (pos < 0) {
        record_error(err, ERR_TAKE, (long)LOAD_L(pidx, j), axis_size);
        for (int in = 0; in < inner; ++in) STORE_O(po, out0 + in, 0);
        return;
    }
    const long in0 = ((long)(r / nidx) * axis_size + pos) * inner;
    for (int in = 0; in < inner; ++in) STORE_O(po, out0 + in, LOAD_A(pa, in0 + in));
}

/* One work-item per (outer, inner) column walks every index in order: duplicates add up
 * deterministically, with no atomics (which 16-bit storage could not use). */
__kernel void take_grad(const int outer, const int axis_size, const int nidx, const int inner,
                        __global const A_ST *pg, __global const L_ST *pidx, __global O_ST *po,
                        __global int *err) {
    const int gid = get_global_id(0);
    if (gid >= outer * inner) return;
    const int in = gid % inner;
    const int o = gid / inner;
    for (int j = 0; j < nidx; ++j) {
        const long pos = index_pos(pidx, j, axis_size);
        if (pos < 0) {
            if (gid == 0) record_error(err, ERR_TAKE_GRAD, (long)LOAD_L(pidx, j), axis_size);
            continue;
        }
        const long dst = ((long)o * axis_size + pos) * inner + in;
        const A_AT v = (A_AT)LOAD_O(po, dst) + (A_AT)LOAD_A(pg, ((long)o * nidx + j) * inner + in);
        STORE_O(po, dst, v);
    }
}

/* An index outside [0, depth) gives a row of zeros, as NumPy's comparison and TF's one_hot: only
 * the output is indexed, so nothing can be read or written out of bounds. */
__kernel void one_hot(const int n, const int depth, __global const L_ST *pidx,
                      __global O_ST *po) {
    const int i = get_global_id(0);
    if (IN_RANGE(i, n)) STORE_O(po, i, (long)LOAD_L(pidx, i / depth) == (long)(i % depth) ? 1 : 0);
}
