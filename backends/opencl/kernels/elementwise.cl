/* Elementwise kernels. The Python side instantiates UNARY/BINARY for each op with its C
 * expression over x (and y), in the compute type. Variants: flat (contiguous, same shape),
 * _s (strided read of A: transpose, broadcast, slicing), _w (contiguous A written into a
 * strided view of O), _as/_sa (one operand a scalar), _bc (broadcasting both operands). */

#define UNARY(NAME, EXPR)                                                                   \
__kernel void NAME(const int n, __global const A_ST *pa, __global O_ST *po) {               \
    const int i = get_global_id(0);                                                         \
    if (IN_RANGE(i, n)) { const A_CT x = LOAD_A(pa, i); STORE_O(po, i, (EXPR)); }           \
}                                                                                           \
__kernel void NAME##_s(const int n, const int nd, const int8 shape, const int8 st,          \
                       const int off, __global const A_ST *pa, __global O_ST *po) {         \
    const int i = get_global_id(0);                                                         \
    if (IN_RANGE(i, n)) {                                                                   \
        const A_CT x = LOAD_A(pa, off + strided_offset(i, nd, shape, st));                  \
        STORE_O(po, i, (EXPR));                                                             \
    }                                                                                       \
}

#define BINARY(NAME, EXPR)                                                                  \
__kernel void NAME(const int n, __global const A_ST *pa, __global const A_ST *pb,           \
                   __global O_ST *po) {                                                     \
    const int i = get_global_id(0);                                                         \
    if (IN_RANGE(i, n)) { const A_CT x = LOAD_A(pa, i); const A_CT y = LOAD_A(pb, i);       \
                 STORE_O(po, i, (EXPR)); }                                                  \
}                                                                                           \
__kernel void NAME##_as(const int n, __global const A_ST *pa, const A_PT ys,                \
                        __global O_ST *po) {                                                \
    const int i = get_global_id(0);                                                         \
    const A_CT y = (A_CT)ys;                                                                \
    if (IN_RANGE(i, n)) { const A_CT x = LOAD_A(pa, i); STORE_O(po, i, (EXPR)); }           \
}                                                                                           \
__kernel void NAME##_sa(const int n, const A_PT xs, __global const A_ST *pb,                \
                        __global O_ST *po) {                                                \
    const int i = get_global_id(0);                                                         \
    const A_CT x = (A_CT)xs;                                                                \
    if (IN_RANGE(i, n)) { const A_CT y = LOAD_A(pb, i); STORE_O(po, i, (EXPR)); }           \
}                                                                                           \
__kernel void NAME##_bc(const int n, const int nd, const int8 shape, const int8 sa,         \
                        const int8 sb, __global const A_ST *pa, __global const A_ST *pb,    \
                        __global O_ST *po) {                                                \
    const int i = get_global_id(0);                                                         \
    if (IN_RANGE(i, n)) {                                                                   \
        const A_CT x = LOAD_A(pa, strided_offset(i, nd, shape, sa));                        \
        const A_CT y = LOAD_A(pb, strided_offset(i, nd, shape, sb));                        \
        STORE_O(po, i, (EXPR));                                                             \
    }                                                                                       \
}

#if A_FLOAT
#define IS_NAN(v) MP_ISNAN(v)
#else
#define IS_NAN(v) 0
#endif

#ifdef WITH_COPY
/* A contiguous A written into the strided view (off, st) of O: concat, getitem_grad. */
__kernel void copy_w(const int n, const int nd, const int8 shape, const int8 st, const int off,
                     __global const A_ST *pa, __global O_ST *po) {
    const int i = get_global_id(0);
    if (IN_RANGE(i, n)) STORE_O(po, off + strided_offset(i, nd, shape, st), LOAD_A(pa, i));
}

__kernel void fill(const int n, const O_PT v, __global O_ST *po) {
    const int i = get_global_id(0);
    if (IN_RANGE(i, n)) STORE_O(po, i, v);
}
#endif

#ifdef WITH_WHERE
__kernel void where_bc(const int n, const int nd, const int8 shape, const int8 sc,
                       const int8 sa, const int8 sb, __global const uchar *pc,
                       __global const A_ST *pa, __global const A_ST *pb, __global O_ST *po) {
    const int i = get_global_id(0);
    if (IN_RANGE(i, n)) {
        const int j = pc[strided_offset(i, nd, shape, sc)] ? strided_offset(i, nd, shape, sa)
                                                           : strided_offset(i, nd, shape, sb);
        const __global A_ST *src = pc[strided_offset(i, nd, shape, sc)] ? pa : pb;
        STORE_O(po, i, LOAD_A(src, j));
    }
}

__kernel void where_flat(const int n, __global const uchar *pc, __global const A_ST *pa,
                         __global const A_ST *pb, __global O_ST *po) {
    const int i = get_global_id(0);
    if (IN_RANGE(i, n)) STORE_O(po, i, pc[i] ? LOAD_A(pa, i) : LOAD_A(pb, i));
}

/* x + bias over the last axis. */
__kernel void bias_add(const int n, const int c, __global const A_ST *pa,
                       __global const A_ST *pb, __global O_ST *po) {
    const int i = get_global_id(0);
    if (IN_RANGE(i, n)) STORE_O(po, i, LOAD_A(pa, i) + LOAD_A(pb, mod_index(i, c, n)));
}
#endif
