/* Softmax, log-softmax and the fused sparse softmax cross-entropy, over the middle axis of a
 * contiguous (outer, K, inner) array; one work-item per (outer, inner) row, three passes
 * (max, sum of exponentials, write), all in the accumulation type (float32 for 16-bit data). */

/* The max m of a row of k values `stride` apart from `base`, and (in *sum) the sum of their
 * exp(value - m): the shared first two passes of softmax, log-softmax and cross-entropy. */
A_AT row_max_sumexp(__global const A_ST *pa, const long base, const int k, const long stride,
                    A_AT *sum) {
    A_AT m = LOAD_A(pa, base);
    for (int t = 1; t < k; ++t) m = fmax(m, (A_AT)LOAD_A(pa, base + (long)t * stride));
    A_AT s = 0;
    for (int t = 0; t < k; ++t) s += exp(LOAD_A(pa, base + (long)t * stride) - m);
    *sum = s;
    return m;
}

/* Writes the softmax of the row of k values `inner` apart from `base`, or its log-softmax. */
inline void softmax_row(__global const A_ST *pa, __global O_ST *po, const long base, const int k,
                        const int inner, const int take_log) {
    A_AT s;
    const A_AT m = row_max_sumexp(pa, base, k, inner, &s);
    const A_AT inv = (A_AT)1 / s;
    const A_AT ls = log(s);
    for (int t = 0; t < k; ++t) {
        const long j = base + (long)t * inner;
        if (take_log) {
            STORE_O(po, j, LOAD_A(pa, j) - m - ls);
        } else {
            STORE_O(po, j, exp(LOAD_A(pa, j) - m) * inv);
        }
    }
}

__kernel void softmax(const int outer, const int k, const int inner,
                      __global const A_ST *pa, __global O_ST *po) {
    const int gid = get_global_id(0);
    if (gid >= outer * inner) return;
    softmax_row(pa, po, (long)(gid / inner) * k * inner + gid % inner, k, inner, 0);
}

__kernel void log_softmax(const int outer, const int k, const int inner,
                          __global const A_ST *pa, __global O_ST *po) {
    const int gid = get_global_id(0);
    if (gid >= outer * inner) return;
    softmax_row(pa, po, (long)(gid / inner) * k * inner + gid % inner, k, inner, 1);
}

#define ERR_LABEL 3

/* loss[r] = log(sum exp(z)) - z[label], probs = softmax(logits). An out-of-range label is never
 * dereferenced: its loss is NaN and it goes to the device error record (common.cl), which the
 * host checks at its next read, so this kernel needs no host round trip. */
__kernel void sparse_xent(const int n, const int c, __global const A_ST *pa,
                          __global const L_ST *labels, __global O_ST *loss,
                          __global O_ST *probs, __global int *err) {
    const int r = get_global_id(0);
    if (r >= n) return;
    const long base = (long)r * c;
    const long label = (long)LOAD_L(labels, r);
    A_AT s;
    const A_AT m = row_max_sumexp(pa, base, c, 1, &s);
    const A_AT inv = (A_AT)1 / s;
    for (int t = 0; t < c; ++t) STORE_O(probs, base + t, exp(LOAD_A(pa, base + t) - m) * inv);
    if (label < 0 || label >= c) {
        record_error(err, ERR_LABEL, label, c);
        STORE_O(loss, r, NAN);
    } else {
        STORE_O(loss, r, log(s) - (LOAD_A(pa, base + label) - m));
    }
}

__kernel void relu_grad(const int n, __global const A_ST *pg, __global const A_ST *py,
                        __global O_ST *po) {
    const int i = get_global_id(0);
    if (IN_RANGE(i, n)) {
        /* g read whatever y is: a 16-bit load under the comparison keeps PoCL's loop scalar */
        const A_CT g = LOAD_A(pg, i);
        STORE_O(po, i, LOAD_A(py, i) > 0 ? g : (A_CT)0);
    }
}

/* The fused backward of sparse_xent: (probs - one_hot(labels)) * g[row]. A row with an
 * out-of-range label gets NaN gradients, so a loss-scaled step that used it is skipped (its
 * "all finite" flag is false) before the host read of that flag raises the label error. */
__kernel void sparse_xent_grad(const int total, const int c, __global const A_ST *probs,
                               __global const L_ST *labels, __global const A_ST *g,
                               __global O_ST *po, __global int *err) {
    const int i = get_global_id(0);
    if (!IN_RANGE(i, total)) return;
    const int r = i / c;
    const long label = (long)LOAD_L(labels, r);
    if (label < 0 || label >= c) {
        if (i % c == 0) record_error(err, ERR_LABEL, label, c);
        STORE_O(po, i, NAN);
        return;
    }
    const A_AT hot = label == (long)(i % c) ? (A_AT)1 : (A_AT)0;
    STORE_O(po, i, ((A_AT)LOAD_A(probs, i) - hot) * (A_AT)LOAD_A(g, r));
}
