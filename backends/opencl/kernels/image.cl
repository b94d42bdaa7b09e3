/* Image kernels, channels last (NHWC); pads = (top, left) here, bottom/right follow from the
 * output size. Gradients are written as gathers (each input element sums what it fed), so
 * they need no atomics and are deterministic. */

/* im2col: out (N, OH, OW, KH*KW*C) in (kh, kw, c) order, zeros in the padding. */
__kernel void extract_patches(const int total, const int h, const int w, const int c,
                              const int oh, const int ow, const int kh, const int kw,
                              const int sh, const int sw, const int top, const int left,
                              __global const A_ST *px, __global O_ST *po) {
    const int i = get_global_id(0);
    if (i >= total) return;
    const int ch = i % c;
    int t = i / c;
    const int j = t % kw; t /= kw;
    const int r = t % kh; t /= kh;
    const int ox = t % ow; t /= ow;
    const int oy = t % oh;
    const int b = t / oh;
    const int y = oy * sh - top + r, x = ox * sw - left + j;
    A_CT v = 0;
    if (y >= 0 && y < h && x >= 0 && x < w) v = LOAD_A(px, (((long)b * h + y) * w + x) * c + ch);
    STORE_O(po, i, v);
}

/* The window (along one axis) whose tap r reads input position y, or -1 where none does. */
inline int window_of(const int y, const int pad, const int r, const int stride, const int n) {
    const int yy = y + pad - r;
    if (yy < 0 || yy % stride) return -1;
    const int o = yy / stride;
    return o < n ? o : -1;
}

/* Whether input (y, x) holds the first maximum m, in (r, j) order, of the pooling window
 * (oy, ox), whose tap (r, j) it is. */
inline int first_max(__global const A_ST *px, const A_CT m, const int b, const int y, const int x,
                     const int ch, const int oy, const int ox, const int r, const int j,
                     const int h, const int w, const int c, const int ph, const int pw,
                     const int sh, const int sw, const int top, const int left) {
    for (int r2 = 0; r2 <= r; ++r2) {
        const int y2 = oy * sh - top + r2;
        for (int j2 = 0; j2 < pw; ++j2) {
            if (r2 == r && j2 == j) return LOAD_A(px, (((long)b * h + y) * w + x) * c + ch) == m;
            const int x2 = ox * sw - left + j2;
            if (y2 < 0 || y2 >= h || x2 < 0 || x2 >= w) continue;
            if (LOAD_A(px, (((long)b * h + y2) * w + x2) * c + ch) == m) return 0;
        }
    }
    return 0;
}

/* The gradient gather of input element i = (b, y, x, ch): the sum over every window (oy, ox)
 * whose tap (r, j) read it of that window's gradient: for patches (pool = 0) the gradient of
 * the patch element, for max pooling (pool = 1) the window's, where (y, x) was the window's
 * first maximum (TF's MaxPoolGrad). px and py (the pool's input and output) serve pool = 1. */
inline A_AT window_grad(const int i, const int h, const int w, const int c, const int oh,
                        const int ow, const int kh, const int kw, const int sh, const int sw,
                        const int top, const int left, __global const A_ST *pg,
                        __global const A_ST *px, __global const A_ST *py, const int pool) {
    const int ch = i % c;
    int t = i / c;
    const int x = t % w; t /= w;
    const int y = t % h;
    const int b = t / h;
    A_AT acc = 0;
    for (int r = 0; r < kh; ++r) {
        const int oy = window_of(y, top, r, sh, oh);
        if (oy < 0) continue;
        for (int j = 0; j < kw; ++j) {
            const int ox = window_of(x, left, j, sw, ow);
            if (ox < 0) continue;
            const long o = (((long)b * oh + oy) * ow + ox) * (pool ? 1 : kh * kw);
            if (!pool) {
                acc += LOAD_A(pg, (o + r * kw + j) * c + ch);
            } else if (first_max(px, LOAD_A(py, o * c + ch), b, y, x, ch, oy, ox, r, j, h, w, c,
                                 kh, kw, sh, sw, top, left)) {
                acc += LOAD_A(pg, o * c + ch);
            }
        }
    }
    return acc;
}

/* col2im: dx[b, y, x, ch] = sum of g over every (window, r, j) that read it. */
__kernel void extract_patches_grad(const int total, const int h, const int w, const int c,
                                   const int oh, const int ow, const int kh, const int kw,
                                   const int sh, const int sw, const int top, const int left,
                                   __global const A_ST *pg, __global O_ST *po) {
    const int i = get_global_id(0);
    if (i >= total) return;
    STORE_O(po, i, window_grad(i, h, w, c, oh, ow, kh, kw, sh, sw, top, left, pg, pg, pg, 0));
}

/* Max over the in-bounds part of each window: padding never wins. */
__kernel void max_pool2d(const int total, const int h, const int w, const int c, const int oh,
                         const int ow, const int ph, const int pw, const int sh, const int sw,
                         const int top, const int left, __global const A_ST *px,
                         __global O_ST *po) {
    const int i = get_global_id(0);
    if (i >= total) return;
    const int ch = i % c;
    int t = i / c;
    const int ox = t % ow; t /= ow;
    const int oy = t % oh;
    const int b = t / oh;
    A_CT best = -INFINITY;
    for (int r = 0; r < ph; ++r) {
        const int y = oy * sh - top + r;
        if (y < 0 || y >= h) continue;
        for (int j = 0; j < pw; ++j) {
            const int x = ox * sw - left + j;
            if (x < 0 || x >= w) continue;
            const A_CT v = LOAD_A(px, (((long)b * h + y) * w + x) * c + ch);
            if (v > best || MP_ISNAN(v)) best = v;
        }
    }
    STORE_O(po, i, best);
}

/* The gradient of each window goes to its first maximum in (r, j) order (TF's MaxPoolGrad);
 * each input element gathers the windows whose first maximum it is. */
__kernel void max_pool2d_grad(const int total, const int h, const int w, const int c,
                              const int oh, const int ow, const int ph, const int pw,
                              const int sh, const int sw, const int top, const int left,
                              __global const A_ST *pg, __global const A_ST *px,
                              __global const A_ST *py, __global O_ST *po) {
    const int i = get_global_id(0);
    if (i >= total) return;
    STORE_O(po, i, window_grad(i, h, w, c, oh, ow, ph, pw, sh, sw, top, left, pg, px, py, 1));
}
