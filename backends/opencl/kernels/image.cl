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

/* col2im: dx[b, y, x, ch] = sum of g over every (window, r, j) that read it. */
__kernel void extract_patches_grad(const int total, const int h, const int w, const int c,
                                   const int oh, const int ow, const int kh, const int kw,
                                   const int sh, const int sw, const int top, const int left,
                                   __global const A_ST *pg, __global O_ST *po) {
    const int i = get_global_id(0);
    if (i >= total) return;
    const int ch = i % c;
    int t = i / c;
    const int x = t % w; t /= w;
    const int y = t % h;
    const int b = t / h;
    A_AT acc = 0;
    for (int r = 0; r < kh; ++r) {
        const int yy = y + top - r;
        if (yy < 0 || yy % sh) continue;
        const int oy = yy / sh;
        if (oy >= oh) continue;
        for (int j = 0; j < kw; ++j) {
            const int xx = x + left - j;
            if (xx < 0 || xx % sw) continue;
            const int ox = xx / sw;
            if (ox >= ow) continue;
            acc += LOAD_A(pg, ((((long)b * oh + oy) * ow + ox) * kh * kw + r * kw + j) * c + ch);
        }
    }
    STORE_O(po, i, acc);
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
            if (v > best || isnan(v)) best = v;
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
    const int ch = i % c;
    int t = i / c;
    const int x = t % w; t /= w;
    const int y = t % h;
    const int b = t / h;
    A_AT acc = 0;
    for (int r = 0; r < ph; ++r) {
        const int yy = y + top - r;
        if (yy < 0 || yy % sh) continue;
        const int oy = yy / sh;
        if (oy >= oh) continue;
        for (int j = 0; j < pw; ++j) {
            const int xx = x + left - j;
            if (xx < 0 || xx % sw) continue;
            const int ox = xx / sw;
            if (ox >= ow) continue;
            const long o = (((long)b * oh + oy) * ow + ox) * c + ch;
            const A_CT m = LOAD_A(py, o);
            /* is (y, x) the first position of this window holding the maximum? */
            int first = 1;
            for (int r2 = 0; r2 < ph && first; ++r2) {
                const int y2 = oy * sh - top + r2;
                for (int j2 = 0; j2 < pw; ++j2) {
                    if (r2 == r && j2 == j) { r2 = ph; break; }
                    const int x2 = ox * sw - left + j2;
                    if (y2 < 0 || y2 >= h || x2 < 0 || x2 >= w) continue;
                    if (LOAD_A(px, (((long)b * h + y2) * w + x2) * c + ch) == m) {
                        first = 0;
                        break;
                    }
                }
            }
            if (first && LOAD_A(px, (((long)b * h + y) * w + x) * c + ch) == m)
                acc += LOAD_A(pg, o);
        }
    }
    STORE_O(po, i, acc);
}
