// CUDA kernels that move token rows to and from mixture-of-experts experts: gather and combine (one block per
// output row, k in order) and per-assignment row dot products (one warp each). No atomics: results repeat bit for bit.
// Combine adds each term with one fused multiply-add and rows_dot sums in double, as the CPU backend does; expert
// rows fp32 or bf16 (written rounded, read widened).
#include "backend/cuda/cuda_common.hpp"
#include "backend/cuda/cuda_launch.hpp"
#include "backend/cuda/device_utils.cuh"

namespace piper::cuda {

namespace {

constexpr int kDotThreads = 256;  // 8 warps per block of rows_dot, one (t,k) per warp at a time

// One block per output row i: dst(m,C) row i = scale[i] · src row rows[i] (scale may be null), 0 for rows[i] < 0;
// stored at dst's width (Out: float, or uint16_t bf16 bits rounded).
template <typename Out>
__global__ void gather_rows_kernel(Out* dst, const float* src, const int32_t* rows, const float* scale, int C) {
  const int64_t i = blockIdx.x;
  Out* d = dst + i * C;  // (C)
  const int32_t r = rows[i];
  if (r < 0) {  // past a routing's kept rows: zeros
    for (int c = threadIdx.x; c < C; c += blockDim.x) store_value(d, c, 0.f);
    return;
  }
  const float* s = src + int64_t(r) * C;  // (C)
  const float a = scale ? scale[i] : 1.f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) store_value(d, c, scale ? a * s[c] : s[c]);
}

// One block per token row t: dst(n,C) row t (+)= Σ_k w[t,k] · src row pos[t,k] over pos >= 0, k in order, each
// term one fused multiply-add (w null: 1). Each thread owns its columns; a row without a valid pos is written 0,
// or left as it is when accumulating. The same operations in the same order as the CPU: the same bits. In: float,
// or uint16_t bf16 bits (widened).
template <typename In>
__global__ void combine_rows_kernel(float* dst, const In* src, const int32_t* pos, const float* w, int K, int C,
                                    bool accumulate) {
  const int64_t t = blockIdx.x;
  const int32_t* p = pos + t * K;             // (K)
  const float* wt = w ? w + t * K : nullptr;  // (K)
  float* d = dst + t * C;                     // (C)
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float s = 0.f;
    bool any = false;
    for (int k = 0; k < K; ++k) {
      const int32_t r = p[k];
      if (r < 0) continue;
      s = fmaf(wt ? wt[k] : 1.f, load_value(src, int64_t(r) * C + c), s);
      any = true;
    }
    if (!accumulate)
      d[c] = s;
    else if (any)
      d[c] += s;
  }
}

// One warp per (t,k) of out(n,K), grid-strided: lane l sums the columns c ≡ l (mod 32) in double (each product
// of two floats is exact), in column order, then the warp's butterfly sum (a fixed order) is rounded to float
// once; 0 where pos[t,k] < 0.
template <typename In>
__global__ void rows_dot_kernel(float* out, const float* a, const In* b, const int32_t* pos, int64_t pairs, int K,
                                int C) {
  const int lane = threadIdx.x & 31;
  const int64_t warps_per_block = blockDim.x >> 5;
  const int64_t stride = int64_t(gridDim.x) * warps_per_block;
  for (int64_t j = int64_t(blockIdx.x) * warps_per_block + (threadIdx.x >> 5); j < pairs; j += stride) {
    const int32_t p = pos[j];  // the same on every lane: the branch below does not split the warp
    double s = 0.0;
    if (p >= 0) {
      const float* ar = a + (j / K) * C;     // (C): token row t = j / K
      const In* br = b + int64_t(p) * C;     // (C): expert row pos[t,k]
      for (int c = lane; c < C; c += 32) s += double(ar[c]) * double(load_value(br, c));
    }
    s = warp_sum(s);
    if (lane == 0) out[j] = float(s);
  }
}

}  // namespace

void gather_rows(Act dst, const float* src, const int32_t* rows, const float* scale, int m, int C, cudaStream_t s) {
  if (m <= 0 || C <= 0) return;
  if (dst.bf16)
    gather_rows_kernel<<<unsigned(m), row_threads(C), 0, s>>>(dst.bits(), src, rows, scale, C);
  else
    gather_rows_kernel<<<unsigned(m), row_threads(C), 0, s>>>(dst.f32(), src, rows, scale, C);
  CUDA_CHECK_LAUNCH();
}

void combine_rows(float* dst, ConstAct src, const int32_t* pos, const float* w, int n, int K, int C, bool accumulate,
                  cudaStream_t s) {
  if (n <= 0 || C <= 0) return;
  const int KK = K > 0 ? K : 0;
  if (src.bf16)
    combine_rows_kernel<<<unsigned(n), row_threads(C), 0, s>>>(dst, src.bits(), pos, w, KK, C, accumulate);
  else
    combine_rows_kernel<<<unsigned(n), row_threads(C), 0, s>>>(dst, src.f32(), pos, w, KK, C, accumulate);
  CUDA_CHECK_LAUNCH();
}

void rows_dot(float* out, const float* a, ConstAct b, const int32_t* pos, int n, int K, int C, cudaStream_t s) {
  if (n <= 0 || K <= 0) return;
  const int64_t pairs = int64_t(n) * K;
  const unsigned blocks = grid_for(size_t(pairs) * 32, kDotThreads);
  const int CC = C > 0 ? C : 0;
  if (b.bf16)
    rows_dot_kernel<<<blocks, kDotThreads, 0, s>>>(out, a, b.bits(), pos, pairs, K, CC);
  else
    rows_dot_kernel<<<blocks, kDotThreads, 0, s>>>(out, a, b.f32(), pos, pairs, K, CC);
  CUDA_CHECK_LAUNCH();
}

}  // namespace piper::cuda
