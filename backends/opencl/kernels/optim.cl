/* Loss scaling and fused optimizer updates over float32 (slot A) master weights. `flag` is the
 * device bool from unscale_and_check (or all_finite); when use_flag is set and *flag is 0 the
 * update leaves every buffer untouched, so a skipped step needs no host round trip. */

/* No fused multiply-adds: OpenCL C contracts a * b + c by default, and where g * g - v cancels
 * (Adam's second moment) one rounding instead of two moved the update by several ulp from the
 * CPU's and the composite path's, which round every product. */
#pragma OPENCL FP_CONTRACT OFF

#if A_FLOAT
#define NOT_FINITE(v) (!MP_ISFINITE(v))
#else
#define NOT_FINITE(v) 0
#endif

/* o = g * inv_scale in float32; *flag = 0 if any result is not finite (every writer stores
 * the same 0, so the race is benign). */
__kernel void unscale(const int n, const float inv_scale, __global const A_ST *pg,
                      __global float *po, __global uchar *flag) {
    const int i = get_global_id(0);
    if (!IN_RANGE(i, n)) return;
    const float v = (float)LOAD_A(pg, i) * inv_scale;
    po[i] = v;
    if (!MP_ISFINITE(v)) *flag = 0;
}

/* unscale with the reciprocal of a device loss scale (a float32 buffer of one value). */
__kernel void unscale_by(const int n, __global const float *inv_scale, __global const A_ST *pg,
                         __global float *po, __global uchar *flag) {
    const int i = get_global_id(0);
    if (!IN_RANGE(i, n)) return;
    const float v = (float)LOAD_A(pg, i) * inv_scale[0];
    po[i] = v;
    if (!MP_ISFINITE(v)) *flag = 0;
}

/* A dynamic loss scale's update, one work-item (mpcore.ops.loss_scaling): TF's rule in
 * float32; built with -cl-fp32-correctly-rounded-divide-sqrt, so the two divisions round as
 * the CPU's. counters: good steps, overflows in a row, at the floor in a row, skipped. */
__kernel void loss_scale_update(__global float *scale, __global float *inv_scale,
                                __global long *counters, __global const uchar *flag,
                                const long period, const float multiplier, const float lo,
                                const float hi, const long hysteresis, const long latch) {
    if (get_global_id(0) != 0) return;
    float s = scale[0];
    long good = counters[0], over = counters[1], stuck = counters[2], skipped = counters[3];
    if (flag[0]) {
        over = 0;
        if (stuck < latch) stuck = 0;
        good += 1;
        if (good >= period) {
            const float grown = s * multiplier;
            if (MP_ISFINITE(grown)) s = grown < hi ? grown : hi;
            good = 0;
        }
    } else {
        good = 0;
        if (stuck < latch) stuck = s <= lo ? stuck + 1 : 0;
        over += 1;
        if (over >= hysteresis) {
            const float shrunk = s / multiplier;
            over = 0;
            s = shrunk > lo ? shrunk : lo;
        }
        skipped += 1;
    }
    scale[0] = s;
    inv_scale[0] = 1.0f / s;
    counters[0] = good;
    counters[1] = over;
    counters[2] = stuck;
    counters[3] = skipped;
}

__kernel void all_finite(const int n, __global const A_ST *pa, __global uchar *flag) {
    const int i = get_global_id(0);
    if (IN_RANGE(i, n) && NOT_FINITE(LOAD_A(pa, i))) *flag = 0;
}

/* Tested once, before the index: read per work-item under the bounds test, PoCL keeps the flag
 * load inside its work-item loop, which then does not vectorize (RMSprop 2x slower). The
 * updates test their bounds with a plain `i >= n`, not IN_RANGE: their float32 loads and
 * stores vectorize under it already, and IN_RANGE's extra test made RMSprop's loop 3x slower
 * on PoCL (benchmarks/opencl_step_profile.py). */
#define SKIP (use_flag && !flag[0])

/* The rate is lr_array[0] (a schedule's float32 rate, computed on the device) when
 * use_lr_array is set, else lr. */
__kernel void sgd(const int n, const float lr_value, const int use_lr_array,
                  __global const float *lr_array, const float momentum, const int nesterov,
                  const int use_velocity, const int use_flag, __global const uchar *flag,
                  __global A_ST *var, __global const A_ST *grad, __global A_ST *vel) {
    if (SKIP) return;
    const int i = get_global_id(0);
    if (i >= n) return;
    const float lr = use_lr_array ? lr_array[0] : lr_value;
    const A_CT g = LOAD_A(grad, i);
    A_CT w = LOAD_A(var, i);
    if (use_velocity) {
        const A_CT v = momentum * LOAD_A(vel, i) - lr * g;
        STORE_A(vel, i, v);
        w += nesterov ? momentum * v - lr * g : v;
    } else {
        w -= lr * g;
    }
    STORE_A(var, i, w);
}

/* one_minus_rho comes from the host, rounded once from double as the CPU and CUDA kernels
 * take it: 1 - (float)rho on the device differs (1 - 0.9f is 0.100000024, not 0.1f). */
__kernel void rmsprop(const int n, const float lr_value, const int use_lr_array,
                      __global const float *lr_array, const float rho,
                      const float one_minus_rho, const float momentum, const float epsilon,
                      const int use_mom, const int use_flag,
                      __global const uchar *flag, __global A_ST *var, __global const A_ST *grad,
                      __global A_ST *ms, __global A_ST *mom) {
    if (SKIP) return;
    const int i = get_global_id(0);
    if (i >= n) return;
    const float lr = use_lr_array ? lr_array[0] : lr_value;
    const A_CT g = LOAD_A(grad, i);
    const A_CT s = rho * LOAD_A(ms, i) + g * g * one_minus_rho;  /* the CPU's order */
    STORE_A(ms, i, s);
    const A_CT step = lr * g / MP_SQRT(s + epsilon);
    if (use_mom) {
        const A_CT m = momentum * LOAD_A(mom, i) + step;
        STORE_A(mom, i, m);
        STORE_A(var, i, LOAD_A(var, i) - m);
    } else {
        STORE_A(var, i, LOAD_A(var, i) - step);
    }
}

/* Keras Adam: alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t), 1 - beta1, 1 - beta2 and
 * AdamW's decay = lr * wd come from the host, computed in double and rounded once to float32
 * as the CPU and CUDA kernels take them: 1 - (float)0.999 on the device is 0.0009999871, ~55
 * ulp from the first step's update of the composite path. The decoupled decay
 * (var -= decay * var) is applied before the step, as Keras does. */
/* Adam's step size and decay for step t = iterations + 1 (one work-item): alpha = lr * sqrt(1 -
 * beta2^t) / (1 - beta1^t) and lr * weight_decay, in double where the device has cl_khr_fp64
 * (the expressions the host computed in Python before), rounded once to float32; in float32
 * otherwise. lr is lr_array[0] (a schedule's rate, in RATE_T) when use_lr_array is set. */
#ifdef cl_khr_fp64
#define RATE_T double
#else
#define RATE_T float
#endif
__kernel void adam_rates(__global const long *iterations, const int use_lr_array,
                         __global const RATE_T *lr_array, const RATE_T lr_value,
                         const RATE_T beta1, const RATE_T beta2, const RATE_T weight_decay,
                         __global float *rates) {
    if (get_global_id(0) != 0) return;
    const RATE_T t = (RATE_T)(iterations[0] + 1);
    const RATE_T lr = use_lr_array ? lr_array[0] : lr_value;
    const RATE_T one = 1;
    rates[0] = (float)(lr * sqrt(one - pow(beta2, t)) / (one - pow(beta1, t)));
    rates[1] = (float)(lr * weight_decay);
}

/* rates = (alpha, decay) from adam_rates, read on the device; decay applied when use_decay. */
__kernel void adam(const int n, __global const float *rates, const float one_minus_beta1,
                   const float one_minus_beta2, const float epsilon, const int use_decay,
                   const int use_flag, __global const uchar *flag, __global A_ST *var,
                   __global const A_ST *grad, __global A_ST *pm, __global A_ST *pv) {
    if (SKIP) return;
    const int i = get_global_id(0);
    if (i >= n) return;
    const float alpha = rates[0];
    const A_CT g = LOAD_A(grad, i);
    A_CT w = LOAD_A(var, i);
    if (use_decay) w -= w * rates[1];
    const A_CT m = LOAD_A(pm, i) + (g - LOAD_A(pm, i)) * one_minus_beta1;
    const A_CT v = LOAD_A(pv, i) + (g * g - LOAD_A(pv, i)) * one_minus_beta2;
    STORE_A(pm, i, m);
    STORE_A(pv, i, v);
    STORE_A(var, i, w - alpha * m / (MP_SQRT(v) + epsilon));
}
