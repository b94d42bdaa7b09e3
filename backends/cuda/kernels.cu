// mpcore's CUDA kernels: every RawModule kernel of the CUDA backend, in one translation unit.
//
// The file includes no header at all, so NVRTC compiles it with no CUDA toolkit headers present
// (tests compile it for sm_70, sm_80 and sm_90 on machines without a GPU). 16-bit values are
// stored as raw bits (mp_half, mp_bf16) and converted with PTX (float16) or bit arithmetic
// (bfloat16, whose float -> bf16 PTX instruction needs sm_80); arithmetic is done in float
// (double for double), so every kernel rounds once, at its store.
//
// Conventions: arrays are C-contiguous (the Python side makes them so); element counts are
// 64-bit; elementwise kernels use grid-stride loops so any grid size is correct.

typedef long long i64;
typedef unsigned long long u64;

struct mp_half { unsigned short bits; };
struct mp_bf16 { unsigned short bits; };

template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };

// --- loads and stores ----------------------------------------------------------------------
__device__ __forceinline__ float load(const float* p, i64 i) { return p[i]; }
__device__ __forceinline__ double load(const double* p, i64 i) { return p[i]; }
__device__ __forceinline__ float load(const mp_half* p, i64 i) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p[i].bits));
  return f;
}
__device__ __forceinline__ float load(const mp_bf16* p, i64 i) {
  return __uint_as_float(((unsigned int)p[i].bits) << 16);
}

__device__ __forceinline__ unsigned short float_to_bf16_bits(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return (unsigned short)(u >> 16);
}

__device__ __forceinline__ void store(float* p, i64 i, float v) { p[i] = v; }
__device__ __forceinline__ void store(double* p, i64 i, double v) { p[i] = v; }
__device__ __forceinline__ void store(mp_half* p, i64 i, float v) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
  p[i].bits = h;
}
__device__ __forceinline__ void store(mp_bf16* p, i64 i, float v) {
  p[i].bits = float_to_bf16_bits(v);
}

__device__ __forceinline__ bool finite_f(float v) {
  return (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u;
}

__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_erf(float x) { return erff(x); }
__device__ __forceinline__ double m_erf(double x) { return erf(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_cospi(float x) { return cospif(x); }
__device__ __forceinline__ double m_cospi(double x) { return cospi(x); }

template <typename A> __device__ __forceinline__ A neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double neg_inf<double>() {
  return __longlong_as_double(0xfff0000000000000LL);
}
template <typename A> __device__ __forceinline__ A quiet_nan();
template <> __device__ __forceinline__ float quiet_nan<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ __forceinline__ double quiet_nan<double>() {
  return __longlong_as_double(0x7ff8000000000000LL);
}

#define GRID_STRIDE(i, n) \
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// --- casts between float32, float16 and bfloat16 -------------------------------------------
template <typename Tin, typename Tout>
__global__ void cast_kernel(const Tin* x, Tout* y, i64 n) {
  GRID_STRIDE(i, n) { store(y, i, load(x, i)); }
}

// --- unary math: 0 relu, 1 sigmoid, 2 erf --------------------------------------------------
template <typename T, int OP>
__global__ void unary(const T* x, T* y, i64 n) {
  typedef typename Acc<T>::type A;
  GRID_STRIDE(i, n) {
    A v = load(x, i);
    A r;
    if (OP == 0) {
      r = v < A(0) ? A(0) : v;  // NaN stays NaN, as numpy.maximum(x, 0)
    } else if (OP == 1) {
      r = A(0.5) * (A(1) + m_tanh(A(0.5) * v));  // no overflow for large |v|
    } else {
      r = m_erf(v);
    }
    store(y, i, r);
  }
}

// --- fused bias add and relu backward ------------------------------------------------------
template <typename T>
__global__ void bias_add(const T* x, const T* bias, T* y, i64 n, i64 channels) {
  GRID_STRIDE(i, n) { store(y, i, load(x, i) + load(bias, i % channels)); }
}

template <typename T>
__global__ void relu_grad(const T* g, const T* y, T* out, i64 n) {
  typedef typename Acc<T>::type A;
  GRID_STRIDE(i, n) { store(out, i, load(y, i) > A(0) ? load(g, i) : A(0)); }
}

// --- block reductions (blockDim.x a multiple of 32, at most 1024) --------------------------
template <typename A, bool MAX>
__device__ __forceinline__ A combine(A a, A b) {
  return MAX ? (a > b ? a : b) : a + b;
}

template <typename A, bool MAX>
__device__ A block_reduce(A v) {
  __shared__ A partial[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (int off = 16; off > 0; off >>= 1) v = combine<A, MAX>(v, __shfl_xor_sync(0xffffffffu, v, off));
  __syncthreads();  // the previous call's readers are done with `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  if (warp == 0) {
    v = lane < warps ? partial[lane] : (MAX ? neg_inf<A>() : A(0));
    for (int off = 16; off > 0; off >>= 1) v = combine<A, MAX>(v, __shfl_xor_sync(0xffffffffu, v, off));
    if (lane == 0) partial[0] = v;
  }
  __syncthreads();
  return partial[0];
}

// --- softmax over the last axis: one block per row -----------------------------------------
template <typename T>
__global__ void softmax_rows(const T* x, T* y, i64 cols, int log_mode) {
  typedef typename Acc<T>::type A;
  const T* xr = x + (i64)blockIdx.x * cols;
  T* yr = y + (i64)blockIdx.x * cols;
  A m = neg_inf<A>();
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) { A v = load(xr, j); m = v > m ? v : m; }
  m = block_reduce<A, true>(m);
  A s = A(0);
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) s += m_exp(load(xr, j) - m);
  s = block_reduce<A, false>(s);
  if (log_mode) {
    const A ls = m_log(s);
    for (i64 j = threadIdx.x; j < cols; j += blockDim.x) store(yr, j, load(xr, j) - m - ls);
  } else {
    const A inv = A(1) / s;
    for (i64 j = threadIdx.x; j < cols; j += blockDim.x) store(yr, j, m_exp(load(xr, j) - m) * inv);
  }
}

// --- sparse softmax cross-entropy: forward (loss and softmax), backward ---------------------
// An out-of-range label gives a NaN loss and NaN probabilities for its row (as TensorFlow on
// GPUs): raising would need a device-to-host read every step.
template <typename T>
__global__ void xent_fwd(const T* logits, const i64* labels, T* loss, T* probs, i64 cols) {
  typedef typename Acc<T>::type A;
  const i64 row = blockIdx.x;
  const T* xr = logits + row * cols;
  T* pr = probs + row * cols;
  const i64 label = labels[row];
  const bool bad = label < 0 || label >= cols;
  A m = neg_inf<A>();
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) { A v = load(xr, j); m = v > m ? v : m; }
  m = block_reduce<A, true>(m);
  A s = A(0);
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) s += m_exp(load(xr, j) - m);
  s = block_reduce<A, false>(s);
  const A inv = A(1) / s;
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x)
    store(pr, j, bad ? quiet_nan<A>() : m_exp(load(xr, j) - m) * inv);
  if (threadIdx.x == 0) store(loss, row, bad ? quiet_nan<A>() : m_log(s) - (load(xr, label) - m));
}

template <typename T>
__global__ void xent_bwd(const T* probs, const i64* labels, const T* g, T* dx, i64 n, i64 cols) {
  typedef typename Acc<T>::type A;
  GRID_STRIDE(i, n) {
    const i64 row = i / cols;
    const A hot = labels[row] == i - row * cols ? A(1) : A(0);
    store(dx, i, (load(probs, i) - hot) * load(g, row));
  }
}

// --- one-hot -------------------------------------------------------------------------------
template <typename T>
__global__ void one_hot(const i64* indices, T* out, i64 n, i64 depth) {
  typedef typename Acc<T>::type A;
  GRID_STRIDE(i, n) {
    const i64 r = i / depth;
    store(out, i, indices[r] == i - r * depth ? A(1) : A(0));
  }
}

// --- images, NHWC; pads are (top, left) here, bottom/right follow from the output size ------
template <typename T>
__global__ void im2col(const T* x, T* out, i64 n, int H, int W, int C, int OH, int OW, int kh,
                       int kw, int sh, int sw, int top, int left) {
  GRID_STRIDE(i, n) {
    i64 t = i;
    const int c = t % C; t /= C;
    const int j = t % kw; t /= kw;
    const int ii = t % kh; t /= kh;
    const int ow = t % OW; t /= OW;
    const int oh = t % OH;
    const i64 b = t / OH;
    const int h = oh * sh + ii - top;
    const int w = ow * sw + j - left;
    if (h >= 0 && h < H && w >= 0 && w < W) {
      out[i] = x[((b * H + h) * W + w) * C + c];
    } else {
      out[i] = T();
    }
  }
}

template <typename T>
__global__ void col2im(const T* g, T* dx, i64 n, int H, int W, int C, int OH, int OW, int kh,
                       int kw, int sh, int sw, int top, int left) {
  typedef typename Acc<T>::type A;
  GRID_STRIDE(i, n) {
    i64 t = i;
    const int c = t % C; t /= C;
    const int w = t % W; t /= W;
    const int h = t % H;
    const i64 b = t / H;
    A acc = A(0);
    for (int ii = 0; ii < kh; ++ii) {
      const int hp = h + top - ii;
      if (hp < 0 || hp % sh) continue;
      const int oh = hp / sh;
      if (oh >= OH) continue;
      for (int j = 0; j < kw; ++j) {
        const int wp = w + left - j;
        if (wp < 0 || wp % sw) continue;
        const int ow = wp / sw;
        if (ow >= OW) continue;
        acc += load(g, ((((b * OH + oh) * OW + ow) * kh + ii) * kw + j) * C + c);
      }
    }
    store(dx, i, acc);
  }
}

template <typename T>
__global__ void maxpool(const T* x, T* y, i64 n, int H, int W, int C, int OH, int OW, int ph,
                        int pw, int sh, int sw, int top, int left) {
  typedef typename Acc<T>::type A;
  GRID_STRIDE(i, n) {
    i64 t = i;
    const int c = t % C; t /= C;
    const int ow = t % OW; t /= OW;
    const int oh = t % OH;
    const i64 b = t / OH;
    A m = neg_inf<A>();
    for (int ii = 0; ii < ph; ++ii) {
      const int h = oh * sh + ii - top;
      if (h < 0 || h >= H) continue;  // padding never wins the max
      for (int j = 0; j < pw; ++j) {
        const int w = ow * sw + j - left;
        if (w < 0 || w >= W) continue;
        const A v = load(x, ((b * H + h) * W + w) * C + c);
        if (v > m || v != v) m = v;  // NaN propagates, as numpy's max
        if (m != m) break;
      }
    }
    store(y, i, m);
  }
}

// The gradient goes to the first maximum of each window, in row-major window order (as the
// CPU backend and TF's MaxPoolGrad). Gathered per input element: no atomics, deterministic.
template <typename T>
__global__ void maxpool_grad(const T* g, const T* x, const T* y, T* dx, i64 n, int H, int W,
                             int C, int OH, int OW, int ph, int pw, int sh, int sw, int top,
                             int left) {
  typedef typename Acc<T>::type A;
  GRID_STRIDE(i, n) {
    i64 t = i;
    const int c = t % C; t /= C;
    const int w = t % W; t /= W;
    const int h = t % H;
    const i64 b = t / H;
    const int hp = h + top, wp = w + left;
    const int oh_lo = hp - ph < 0 ? 0 : (hp - ph) / sh + 1;
    const int ow_lo = wp - pw < 0 ? 0 : (wp - pw) / sw + 1;
    const int oh_hi = min(hp / sh, OH - 1), ow_hi = min(wp / sw, OW - 1);
    A acc = A(0);
    for (int oh = oh_lo; oh <= oh_hi; ++oh) {
      for (int ow = ow_lo; ow <= ow_hi; ++ow) {
        const i64 o = ((b * OH + oh) * OW + ow) * C + c;
        const A target = load(y, o);
        int fh = -1, fw = -1;
        for (int ii = 0; ii < ph && fh < 0; ++ii) {
          const int hh = oh * sh + ii - top;
          if (hh < 0 || hh >= H) continue;
          for (int j = 0; j < pw; ++j) {
            const int ww = ow * sw + j - left;
            if (ww < 0 || ww >= W) continue;
            if (load(x, ((b * H + hh) * W + ww) * C + c) == target) { fh = hh; fw = ww; break; }
          }
        }
        if (fh == h && fw == w) acc += load(g, o);
      }
    }
    store(dx, i, acc);
  }
}

// --- counter-based random numbers: value i depends only on (seed, i) ------------------------
__device__ __forceinline__ u64 splitmix64(u64 z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
__device__ __forceinline__ u64 draw(u64 key, i64 i) {
  return splitmix64(key + (u64)i * 0x9E3779B97F4A7C15ULL);
}
template <typename A> __device__ __forceinline__ A unit_interval(u64 h);  // [0, 1)
template <> __device__ __forceinline__ float unit_interval<float>(u64 h) {
  return (float)(h >> 40) * (1.0f / 16777216.0f);
}
template <> __device__ __forceinline__ double unit_interval<double>(u64 h) {
  return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

template <typename T>
__global__ void rand_uniform(T* out, i64 n, u64 seed, double lo, double hi) {
  typedef typename Acc<T>::type A;
  const u64 key = splitmix64(seed);
  GRID_STRIDE(i, n) { store(out, i, A(lo) + A(hi - lo) * unit_interval<A>(draw(key, i))); }
}

template <typename T>
__global__ void rand_normal(T* out, i64 n, u64 seed, double mean, double stddev) {
  typedef typename Acc<T>::type A;
  const u64 key = splitmix64(seed);
  GRID_STRIDE(i, n) {
    const A u1 = A(1) - unit_interval<A>(draw(key, 2 * i));  // (0, 1]: log is finite
    const A u2 = unit_interval<A>(draw(key, 2 * i + 1));
    const A r = m_sqrt(A(-2) * m_log(u1));
    const A z = r * m_cospi(A(2) * u2);
    store(out, i, A(mean) + A(stddev) * z);
  }
}

template <typename T>
__global__ void dropout_mask(T* out, i64 n, u64 seed, float rate, double scale) {
  // the scale in the output's accumulator type: a float64 mask holds 1/(1-rate) to the bit
  typedef typename Acc<T>::type A;
  const A kept = A(scale);
  const u64 key = splitmix64(seed);
  GRID_STRIDE(i, n) { store(out, i, unit_interval<float>(draw(key, i)) >= rate ? kept : A(0)); }
}

// --- the multi-tensor loss-scaling kernel ----------------------------------------------------
// Up to 8 tensors per launch (blockIdx.y picks one), passed as kernel parameters so that no
// pointer table has to be copied to the device. Each output is float32 x * inv_scale; the flag
// (one byte, set to 1 before the launch) is cleared when any output is Inf or NaN. With null
// outputs the kernel only checks (all_finite).
#define MT 8
template <typename T>
__global__ void unscale_check(int count, float inv_scale, const float* inv_ptr,
                              unsigned char* flag,
                              const T* x0, const T* x1, const T* x2, const T* x3,
                              const T* x4, const T* x5, const T* x6, const T* x7,
                              float* y0, float* y1, float* y2, float* y3,
                              float* y4, float* y5, float* y6, float* y7,
                              i64 n0, i64 n1, i64 n2, i64 n3, i64 n4, i64 n5, i64 n6, i64 n7) {
  const int k = blockIdx.y;
  if (k >= count) return;
  const T* xs[MT] = {x0, x1, x2, x3, x4, x5, x6, x7};
  float* ys[MT] = {y0, y1, y2, y3, y4, y5, y6, y7};
  const i64 ns[MT] = {n0, n1, n2, n3, n4, n5, n6, n7};
  const T* x = xs[k];
  float* y = ys[k];
  const i64 n = ns[k];
  bool ok = true;
  const float s = inv_ptr ? *inv_ptr : inv_scale;  // a dynamic loss scale's, on the device
  GRID_STRIDE(i, n) {
    const float v = (float)load(x, i) * s;
    if (y) y[i] = v;
    ok = ok && finite_f(v);
  }
  if (!__syncthreads_and(ok) && threadIdx.x == 0) *flag = 0;  // racing writers all write 0
}

// A dynamic loss scale's update in place, one thread (mpcore.ops.loss_scaling): TF's rule in
// float32 (IEEE division: NVRTC's default -prec-div=true). counters: good steps, overflows in a
// row, at the floor in a row (kept once it reaches latch), skipped steps.
extern "C" __global__ void loss_scale_update(float* scale, float* inv_scale, i64* counters,
                                             const unsigned char* flag, i64 period,
                                             float multiplier, float lo, float hi,
                                             i64 hysteresis, i64 latch) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  float s = *scale;
  i64 good = counters[0], over = counters[1], stuck = counters[2], skipped = counters[3];
  if (*flag) {
    over = 0;
    if (stuck < latch) stuck = 0;
    good += 1;
    if (good >= period) {
      const float grown = __fmul_rn(s, multiplier);
      if (finite_f(grown)) s = grown < hi ? grown : hi;
      good = 0;
    }
  } else {
    good = 0;
    if (stuck < latch) stuck = s <= lo ? stuck + 1 : 0;
    over += 1;
    if (over >= hysteresis) {
      const float shrunk = __fdiv_rn(s, multiplier);
      over = 0;
      s = shrunk > lo ? shrunk : lo;
    }
    skipped += 1;
  }
  *scale = s;
  *inv_scale = __fdiv_rn(1.0f, s);
  counters[0] = good;
  counters[1] = over;
  counters[2] = stuck;
  counters[3] = skipped;
}

// --- fused optimizer updates over float32 master weights, in place ---------------------------
// `flag` is the device byte from unscale_check (or a constant 1): when it is 0 the step was
// skipped and no buffer is touched, with no host round trip.
// The rate: lr_array[0] (a schedule's, on the device) where lr_array is not null, else lr_value.
extern "C" __global__ void sgd_update(float* var, const float* grad, float* velocity, i64 n,
                                      float lr_value, const float* lr_array, float momentum,
                                      int nesterov, const unsigned char* flag) {
  if (!*flag) return;
  const float lr = lr_array ? lr_array[0] : lr_value;
  GRID_STRIDE(i, n) {
    const float g = grad[i];
    if (velocity) {
      const float v = momentum * velocity[i] - lr * g;
      velocity[i] = v;
      var[i] += nesterov ? momentum * v - lr * g : v;
    } else {
      var[i] -= lr * g;
    }
  }
}

extern "C" __global__ void rmsprop_update(float* var, const float* grad, float* ms, float* mom,
                                          i64 n, float lr_value, const float* lr_array,
                                          float rho, float one_minus_rho, float momentum,
                                          float epsilon, const unsigned char* flag) {
  if (!*flag) return;
  const float lr = lr_array ? lr_array[0] : lr_value;
  GRID_STRIDE(i, n) {
    const float g = grad[i];
    const float a = rho * ms[i] + one_minus_rho * (g * g);
    ms[i] = a;
    const float inc = (g * lr) / sqrtf(a + epsilon);
    if (mom) {
      const float m = momentum * mom[i] + inc;
      mom[i] = m;
      var[i] -= m;
    } else {
      var[i] -= inc;
    }
  }
}

// Adam's alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t) and lr * wd for t = iterations + 1 in
// double, rounded once (mpcore.ops.adam_rates); lr: lr_array[0] (a schedule's) or lr_value.
extern "C" __global__ void adam_rates(const long long* iterations, const double* lr_array,
                                      double lr_value, double beta1, double beta2,
                                      double weight_decay, float* rates) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const double t = (double)(iterations[0] + 1);
  const double lr = lr_array ? lr_array[0] : lr_value;
  rates[0] = (float)(lr * sqrt(1.0 - pow(beta2, t)) / (1.0 - pow(beta1, t)));
  rates[1] = (float)(lr * weight_decay);
}

// rates = (alpha, decay) from adam_rates; 1 - beta1, 1 - beta2 rounded to float32 (as the CPU).
extern "C" __global__ void adam_update(float* var, const float* grad, float* m, float* v, i64 n,
                                       const float* rates, float one_minus_beta1,
                                       float one_minus_beta2, float epsilon, int use_decay,
                                       const unsigned char* flag) {
  if (!*flag) return;
  const float alpha = rates[0], decay = use_decay ? rates[1] : 0.0f;
  GRID_STRIDE(i, n) {
    const float g = grad[i];
    float w = var[i];
    if (decay != 0.0f) w -= w * decay;
    const float mi = m[i] + (g - m[i]) * one_minus_beta1;
    const float vi = v[i] + (g * g - v[i]) * one_minus_beta2;
    m[i] = mi;
    v[i] = vi;
    var[i] = w - (mi * alpha) / (sqrtf(vi) + epsilon);
  }
}

