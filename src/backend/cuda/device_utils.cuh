// Device helpers shared by the CUDA kernel files: warp and block reductions in a fixed order (results do
// not depend on timing), launch sizing, the GELU-tanh used by forward and backward, and bf16 rounding and stores.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace piper::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

// Sum over the warp (float or double); every lane gets the result.
template <typename T>
__device__ inline T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum over the block (float or double); every thread gets the result. blockDim.x is a multiple of 32;
// `shared` holds 32.
template <typename T>
__device__ inline T block_sum(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : T(0);
  return warp_sum(v);
}

__device__ inline float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

__device__ inline float gelu_tanh(float x) {
  float t = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
  return 0.5f * x * (1.0f + t);
}

__device__ inline float gelu_tanh_grad(float x) {
  float x2 = x * x;
  float t = tanhf(kGeluScale * (x + kGeluCubic * x2 * x));
  float dt = kGeluScale * (1.0f + 3.0f * kGeluCubic * x2) * (1.0f - t * t);
  return 0.5f * (1.0f + t) + 0.5f * x * dt;
}

// Threads per block for one block per row of `width` elements: a power of two in [32, 512].
inline int row_threads(int width) {
  int t = 32;
  while (t < width && t < 512) t *= 2;
  return t;
}

// Blocks for a grid-stride loop over n elements.
inline unsigned grid_for(size_t n, int threads) {
  size_t blocks = (n + size_t(threads) - 1) / size_t(threads);
  if (blocks < 1) blocks = 1;
  if (blocks > 16384) blocks = 16384;
  return unsigned(blocks);
}

// Rows per grid for kernels that loop rows over gridDim.y (its limit is 65535).
inline unsigned grid_rows(int rows) { return unsigned(rows < 1 ? 1 : (rows > 65535 ? 65535 : rows)); }

// The rounding of util/precision.hpp's bf16_bits: nearest, ties to even; NaN kept quiet.
__device__ __forceinline__ uint16_t bf16_bits(float x) {
  const uint32_t u = __float_as_uint(x);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : rounded);
}

// out[i] = v at out's width (kernels.hpp's Act): fp32 as it is, bf16 rounded by bf16_bits.
__device__ __forceinline__ void store_value(float* out, int64_t i, float v) { out[i] = v; }
__device__ __forceinline__ void store_value(uint16_t* out, int64_t i, float v) { out[i] = bf16_bits(v); }
// in[i] as fp32: as it is, or bf16 bits widened (exact).
__device__ __forceinline__ float load_value(const float* in, int64_t i) { return in[i]; }
__device__ __forceinline__ float load_value(const uint16_t* in, int64_t i) {
  return __uint_as_float(uint32_t(in[i]) << 16);
}

}  // namespace piper::cuda
