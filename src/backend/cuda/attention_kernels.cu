// Row kernels of causal self-attention; the matmuls around them are cuBLAS strided-batched gemms in
// cuda_kernels.cpp. Scores are (B,NH,T,T); row r of the flattened (B·NH·T, T) view sits at t = r % T.
#include "backend/cuda/cuda_common.hpp"
#include "backend/cuda/cuda_launch.hpp"
#include "backend/cuda/device_utils.cuh"

namespace piper::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // one warp per row

// In place: row(T) = softmax(row[0..t]) followed by zeros.
__global__ void causal_softmax_forward_kernel(float* att, int64_t rows, int T) {
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const int t = int(r % T);
  float* row = att + r * T;
  float mx = -INFINITY;
  for (int j = lane; j <= t; j += 32) mx = fmaxf(mx, row[j]);
  mx = warp_max(mx);
  float sum = 0.f;
  for (int j = lane; j <= t; j += 32) {
    float e = expf(row[j] - mx);
    row[j] = e;
    sum += e;
  }
  const float inv = 1.0f / warp_sum(sum);
  for (int j = lane; j < T; j += 32) row[j] = j <= t ? row[j] * inv : 0.f;
}

// In place on dp: dS[j] = P[j] * (dP[j] - Σ_k P[k] dP[k]) for j <= t, zero after.
__global__ void causal_softmax_backward_kernel(float* dp, const float* p, int64_t rows, int T) {
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const int t = int(r % T);
  const float* pr = p + r * T;
  float* dr = dp + r * T;
  float dot = 0.f;
  for (int j = lane; j <= t; j += 32) dot += pr[j] * dr[j];
  dot = warp_sum(dot);
  for (int j = lane; j < T; j += 32) dr[j] = j <= t ? pr[j] * (dr[j] - dot) : 0.f;
}

unsigned row_blocks(int64_t rows) { return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

void causal_softmax_forward(float* att, int64_t rows, int T, cudaStream_t s) {
  if (rows <= 0) return;
  causal_softmax_forward_kernel<<<row_blocks(rows), 32 * kRowsPerBlock, 0, s>>>(att, rows, T);
  CUDA_CHECK_LAUNCH();
}

void causal_softmax_backward(float* dp, const float* p, int64_t rows, int T, cudaStream_t s) {
  if (rows <= 0) return;
  causal_softmax_backward_kernel<<<row_blocks(rows), 32 * kRowsPerBlock, 0, s>>>(dp, p, rows, T);
  CUDA_CHECK_LAUNCH();
}

}  // namespace piper::cuda
