// mpcore's CUDA FP8 kernels, compiled in one translation unit after kernels.cu (whose load
// functions, i64 and GRID_STRIDE they use): kernels.py joins the two sources.

// --- FP8 codes by hand (no cuda_fp8.h: this file includes no header) -----------------------
// float8_e4m3fn (e5m2 = 0: bias 7, three mantissa bits, no infinities, S.1111.111 NaN, max 448)
// and float8_e5m2 (e5m2 = 1: bias 15, two mantissa bits, max 57344), round to nearest even,
// bit-exact to ml_dtypes; the same functions as the OpenCL backend's fp8.cl. The caller clips v
// to the format's range (NaN passes through), so no rounding reaches past the largest value.
__device__ __forceinline__ unsigned char fp8_encode(float v, int e5m2) {
  const unsigned int bits = __float_as_uint(v);
  const unsigned char sign = (unsigned char)((bits >> 24) & 0x80u);
  if (v != v) return sign | (e5m2 ? 0x7E : 0x7F);
  const int mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
  const unsigned int exp32 = (bits >> 23) & 0xFFu;
  if (exp32 == 0) return sign;  // zero or a float32 subnormal: rounds to zero
  const int e = (int)exp32 - 127;
  const unsigned int s = (bits & 0x7FFFFFu) | 0x800000u;  // v = s * 2^(e - 23)
  const int normal = e >= 1 - bias;
  const int shift = 23 - mbits + (normal ? 0 : 1 - bias - e);
  if (shift > 25) return sign;
  unsigned int q = s >> shift;
  const unsigned int rem = s & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1u))) q += 1u;
  return sign | (unsigned char)((normal ? ((unsigned int)(e + bias - 1) << mbits) : 0u) + q);
}

// codes = encode(clip(x * scale)) and amax = max |x|: a block's max in shared memory, then one
// atomicMax per block on the float bits (ordered as uints for non-negative floats; a NaN's bits
// exceed infinity's, so a NaN in x gives a NaN amax). amax starts at +0.0.
template <typename T>
__global__ void quantize_fp8(const T* x, const float* scale, unsigned char* codes,
                             unsigned int* amax, i64 n, int e5m2, float limit) {
  __shared__ unsigned int part[256];
  unsigned int mine = 0u;
  const float s = scale[0];
  GRID_STRIDE(i, n) {
    const float v0 = load(x, i);
    float v = v0 * s;
    if (v == v) v = fminf(fmaxf(v, -limit), limit);
    codes[i] = fp8_encode(v, e5m2);
    const unsigned int a = __float_as_uint(v0) & 0x7FFFFFFFu;
    if (a > mine) mine = a;
  }
  part[threadIdx.x] = mine;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w && part[threadIdx.x + w] > part[threadIdx.x])
      part[threadIdx.x] = part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicMax(amax, part[0]);
}

// --- quantised transposes: out (cols x rows) = in (rows x cols)^T, FP8 codes as bytes ---------
// The cuBLASLt FP8 GEMMs take K-contiguous operands only (TN), so the forward GEMM needs the
// kernel's codes transposed and wgrad those of the input and the output gradient. 32 x 32
// tiles through shared memory (one padding column against bank conflicts), blocks of 32 x 8
// threads: a warp reads 32 consecutive bytes of a row and writes 32 consecutive bytes of a
// column of the result, where a strided copy (CuPy's ascontiguousarray of a transposed view)
// reads one byte per 32-byte sector. blockIdx.x walks the rows (no 65535 limit), y the cols.
extern "C" __global__ void transpose_u8(const unsigned char* in, unsigned char* out, i64 rows,
                                        i64 cols) {
  __shared__ unsigned char tile[32][33];
  const i64 r0 = (i64)blockIdx.x * 32, c0 = (i64)blockIdx.y * 32;
  for (int j = threadIdx.y; j < 32; j += 8) {
    const i64 r = r0 + j, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[j][threadIdx.x] = in[r * cols + c];
  }
  __syncthreads();
  for (int j = threadIdx.y; j < 32; j += 8) {
    const i64 c = c0 + j, r = r0 + threadIdx.x;
    if (c < cols && r < rows) out[c * rows + r] = tile[threadIdx.x][j];
  }
}
