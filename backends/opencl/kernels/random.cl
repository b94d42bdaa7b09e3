/* Seeded random numbers, one counter per element (see mix_bits in common.cl). */

__kernel void random_uniform(const int n, const ulong seed, const float lo, const float span,
                             __global O_ST *po) {
    const int i = get_global_id(0);
    if (IN_RANGE(i, n)) STORE_O(po, i, lo + span * uniform01(seed, (ulong)i));
}

/* Box-Muller; 1 - u keeps the logarithm's argument in (0, 1]. */
__kernel void random_normal(const int n, const ulong seed, const float mean, const float stddev,
                            __global O_ST *po) {
    const int i = get_global_id(0);
    if (!IN_RANGE(i, n)) return;
    const float u1 = 1.0f - uniform01(seed, 2 * (ulong)i);
    const float u2 = uniform01(seed, 2 * (ulong)i + 1);
    STORE_O(po, i, mean + stddev * sqrt(-2.0f * log(u1)) * cospi(2.0f * u2));
}

__kernel void dropout_mask(const int n, const ulong seed, const float rate, const float keep,
                           __global O_ST *po) {
    const int i = get_global_id(0);
    if (IN_RANGE(i, n)) STORE_O(po, i, uniform01(seed, (ulong)i) >= rate ? keep : 0.0f);
}
