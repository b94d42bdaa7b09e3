/* FP8 codes by hand: OpenCL C has no 8-bit float type, so float8_e4m3fn ("e4m3", bias 7, three
 * mantissa bits, no infinities, S.1111.111 is NaN, max 448) and float8_e5m2 ("e5m2", bias 15, two
 * mantissa bits, IEEE-like, max 57344) are encoded and decoded from the float32 bits, with
 * round-to-nearest-even, bit-exact to ml_dtypes (the CPU backend's reference). The same two
 * functions are in the CUDA backend's kernels.cu. Codes are uchar; e5m2 selects the format. */

/* The code of v, which the caller has clipped to the format's range (NaN passes through). */
inline uchar mp_fp8_encode(const float v, const int e5m2) {
    const uint bits = as_uint(v);
    const uchar sign = (uchar)((bits >> 24) & 0x80u);
    if (MP_ISNAN(v)) return sign | (e5m2 ? 0x7E : 0x7F);   /* ml_dtypes' NaN codes, sign kept */
    const int mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
    const uint exp32 = (bits >> 23) & 0xFFu;
    if (exp32 == 0) return sign;   /* zero or float32 subnormal: below half the least FP8 value */
    const int e = (int)exp32 - 127;
    const uint s = (bits & 0x7FFFFFu) | 0x800000u;          /* v = s * 2^(e - 23) */
    const int normal = e >= 1 - bias;
    /* keep mbits fraction bits (normal), or the bits above 2^(1 - bias - mbits) (subnormal) */
    const int shift = 23 - mbits + (normal ? 0 : 1 - bias - e);
    if (shift > 25) return sign;   /* s < 2^24 <= half an ulp: rounds to zero */
    uint q = s >> shift;
    const uint rem = s & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) q += 1u;
    /* normal: q = 2^mbits + fraction, so the exponent field is e + bias (a carry of the
     * rounding moves into it); subnormal: q is the code itself, up to the least normal one */
    return sign | (uchar)((normal ? ((uint)(e + bias - 1) << mbits) : 0u) + q);
}

/* The float32 value of code c (exact: every FP8 value is a float32). */
inline float mp_fp8_decode(const uchar c, const int e5m2) {
    const int mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7, top = e5m2 ? 31 : 15;
    const int e = (c >> mbits) & top, m = c & ((1 << mbits) - 1);
    uint bits;
    if (!e5m2 && e == 15 && m == 7) bits = 0x7FC00000u;
    else if (e5m2 && e == 31) bits = m ? 0x7FC00000u : 0x7F800000u;
    else if (e == 0) {   /* m * 2^(1 - bias - mbits): an exact product with a power of two */
        const float v = (float)m * as_float((uint)(127 + 1 - bias - mbits) << 23);
        bits = as_uint(v);
    } else bits = ((uint)(e - bias + 127) << 23) | ((uint)m << (23 - mbits));
    return as_float(bits | ((uint)(c & 0x80) << 24));
}

/* codes = encode(clip(x * scale)), and amax = max |x| over all work-groups: a work-group's max
 * in local memory, then one atomic max per group on the float bits (for non-negative floats
 * their order as uints, in which NaN's bits exceed infinity's, so a NaN in x gives a NaN). */
__kernel void quantize_fp8(const int n, __global const A_ST *pa, __global const float *scale,
                           const int e5m2, const float limit, __global uchar *codes,
                           __global uint *amax) {
    __local uint part[256];
    const int i = get_global_id(0), lid = get_local_id(0);
    uint mine = 0u;
    if (i < n) {
        const float x = LOAD_A(pa, i);
        float v = x * scale[0];
        if (!MP_ISNAN(v)) v = fmin(fmax(v, -limit), limit);
        codes[i] = mp_fp8_encode(v, e5m2);
        mine = as_uint(fabs(x));
    }
    part[lid] = mine;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = (int)get_local_size(0) / 2; w > 0; w >>= 1) {
        if (lid < w && part[lid + w] > part[lid]) part[lid] = part[lid + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) atomic_max(amax, part[0]);
}

/* decode(c) * (1 / scale), rounded once to O. */
__kernel void dequantize_fp8(const int n, __global const uchar *codes,
                             __global const float *scale, const int e5m2, __global O_ST *po) {
    const int i = get_global_id(0);
    if (i >= n) return;
    STORE_O(po, i, mp_fp8_decode(codes[i], e5m2) * (1.0f / scale[0]));
}

/* The exact float32 values of codes: the emulated GEMM's operands. */
__kernel void decode_fp8(const int n, __global const uchar *codes, const int e5m2,
                         __global float *po) {
    const int i = get_global_id(0);
    if (i >= n) return;
    po[i] = mp_fp8_decode(codes[i], e5m2);
}

/* The GEMM's epilogue: p * ((1 / a_scale) * (1 / b_scale)), rounded once to O. */
__kernel void fp8_epilogue(const int n, __global const float *p, __global const float *sa,
                           __global const float *sb, __global O_ST *po) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const float inv = (1.0f / sa[0]) * (1.0f / sb[0]);
    STORE_O(po, i, p[i] * inv);
}

/* Transformer Engine's scale: fp8_max / amax / 2^margin, the old scale where amax is zero or
 * not finite, FLT_MAX where the quotient overflows; pow2: 2^floor(log2(fp8_max / amax)) of the
 * exact quotient, from the exponents (amax = m 2^e, fp8_max = M 2^E, m and M in [0.5, 1)). */
__kernel void fp8_scale(__global const float *amax, __global const float *scale,
                        const float fp8_max, const int margin, const int pow2,
                        __global float *out) {
    if (get_global_id(0) != 0) return;
    const float a = amax[0];
    float sf;
    if (pow2) {
        int e, big_e;
        const float m = frexp(a, &e), big_m = frexp(fp8_max, &big_e);
        const int k = clamp(big_e - e - (m > big_m ? 1 : 0) - margin, -149, 127);
        sf = ldexp(1.0f, k);
    } else {
        sf = (fp8_max / a) / ldexp(1.0f, margin);
        if (isinf(sf)) sf = FLT_MAX;
    }
    out[0] = (a > 0.0f && MP_ISFINITE(a)) ? sf : scale[0];
}
