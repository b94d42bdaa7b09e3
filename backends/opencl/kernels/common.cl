/* Shared by every mpcore OpenCL program. The Python side prepends, for each dtype slot X
 * (A, B, C, O), the macros X_ST (storage type), X_CT (compute type: elementwise arithmetic),
 * X_AT (accumulation type: float for 16-bit dtypes, else X_CT), X_PT (type of a by-value scalar
 * argument), LOAD_X(p, i), STORE_X(p, i, v) and X_FLOAT (1 for floating dtypes). float16 is read
 * and written with vload_half/vstore_half (no cl_khr_fp16 needed) and computed in float, or, in
 * the native-half variant (cl_khr_fp16), loaded, stored and computed as half; bfloat16 is
 * stored as ushort. Sums, dot products and softmax accumulate in X_AT in both variants. */

/* The device error record, err = {code, size, value low word, value high word}: the first invalid
 * index any kernel met since the host last looked (codes in runtime.py ERRORS). Kernels never
 * read or write out of bounds because of it; the host raises at its next read. */
inline void record_error(__global int *err, const int code, const long value, const int size) {
    if (atomic_cmpxchg(err, 0, code) == 0) {
        err[1] = size;
        err[2] = (int)value;
        err[3] = (int)(value >> 32);
    }
}

/* PoCL 3.0 calls its builtins out of line: a call per element, which also keeps its work-item
 * loop from being vectorized. These forms compile to inline instructions there and give the
 * same values: the NaN and finiteness tests are exact IEEE comparisons (no program is built
 * with fast-math options), and on PoCL (MP_POCL, set by the runtime) sqrt is the compiler's
 * correctly rounded one, as PoCL's own is on a CPU (vsqrtss); elsewhere it stays sqrt(), whose
 * rounding a GPU's compiler may relax differently. */
#define MP_ISNAN(v) ((v) != (v))
#define MP_ISFINITE(v) ((v) - (v) == 0)
#ifdef MP_POCL
#define MP_SQRT(x) _Generic((x), double: __builtin_sqrt, default: __builtin_sqrtf)(x)
#else
#define MP_SQRT(x) sqrt(x)
#endif

/* Whether work-item i (get_global_id(0)) of a 1-D launch is below n. The group-wide test (the
 * group's last global id, right for a smaller last group and a global offset too) comes first: it is the same for the whole group, so PoCL hoists it out of its work-item loop, and
 * the loop over a full group has no per-item condition and vectorizes. With only `i < n`, a
 * conditional 16-bit store (bfloat16, float16) keeps the loop scalar (AVX2 has no masked
 * 16-bit store): the float32 -> bfloat16 cast was 4x slower. */
#define IN_RANGE(i, n) ((long)(get_global_id(0) - get_local_id(0) + get_local_size(0)) \
                        <= (long)(n) || (i) < (n))

/* i % c for 0 <= i < n, c > 0, without an integer division where n <= 2^20 (a test on the
 * arguments, the same for every work-item): AVX2 has no vector integer division, so `i % c`
 * kept PoCL's work-item loop scalar at ~10 cycles an element. The float quotient of numbers
 * below 2^20 is within one of the true one even with OpenCL's 2.5-ulp division, and the two
 * corrections make the remainder exact. */
inline int mod_index(const int i, const int c, const int n) {
    if (n > (1 << 20)) return i % c;
    int r = i - (int)((float)i / (float)c) * c;
    r += r < 0 ? c : 0;
    r -= r >= c ? c : 0;
    return r;
}

inline float bf16_to_f32(ushort h) { return as_float(((uint)h) << 16); }

/* Round to nearest even; NaN stays a (quiet) NaN with its sign. */
inline ushort f32_to_bf16(float f) {
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ushort)(u >> 16);
}

/* Element offset of the i-th element (row-major order of `shape`) in an array with `strides`.
 * Shapes are right-aligned in the 8 slots: the last axis is s7. */
inline int strided_offset(int i, const int nd, const int8 shape, const int8 strides) {
    int sh[8], st[8];
    vstore8(shape, 0, sh);
    vstore8(strides, 0, st);
    int off = 0;
    for (int d = 7; d > 7 - nd; --d) {
        const int q = i / sh[d];
        off += (i - q * sh[d]) * st[d];
        i = q;
    }
    return off;
}

/* Counter-based random bits: splitmix64 of (seed, counter), so a seed gives the same values on
 * every device and launch geometry. */
inline uint mix_bits(ulong seed, ulong counter) {
    ulong z = seed * 0x9E3779B97F4A7C15UL + counter * 0xBF58476D1CE4E5B9UL + 0x632BE59BD9B4E019UL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9UL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBUL;
    z = z ^ (z >> 31);
    return (uint)(z >> 32);
}

/* Uniform in [0, 1) with 24 random bits. */
inline float uniform01(ulong seed, ulong counter) {
    return (float)(mix_bits(seed, counter) >> 8) * (1.0f / 16777216.0f);
}
