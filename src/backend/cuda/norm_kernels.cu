// LayerNorm forward and backward (input gradient per row, weight gradients as deterministic column sums)
// and the plain elementwise primitives (add, accumulate, fill). One block per row for the row kernels.
#include "backend/cuda/cuda_common.hpp"
#include "backend/cuda/cuda_launch.hpp"
#include "backend/cuda/device_utils.cuh"

namespace piper::cuda {

namespace {

constexpr float kLayerNormEps = 1e-5f;
constexpr int kColumnTile = 32;
constexpr int kRowLanes = 8;

// One block per row: y(N,C) = (x - mean) * rstd * w + b at y's width; mean(N), rstd(N).
template <typename Out>
__global__ void layernorm_forward_kernel(Out* y, float* mean, float* rstd, const float* x, const float* w,
                                         const float* b, int C) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * C;
  Out* yr = y + row * C;
  float s = 0.f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) s += xr[i];
  const float m = block_sum(s, shared) / C;
  float v = 0.f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    float d = xr[i] - m;
    v += d * d;
  }
  const float rs = 1.0f / sqrtf(block_sum(v, shared) / C + kLayerNormEps);
  for (int i = threadIdx.x; i < C; i += blockDim.x) store_value(yr, i, (xr[i] - m) * rs * w[i] + b[i]);
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

// One block per row: dx(N,C) (+)= (dy·w - mean(dy·w) - xhat·mean(dy·w·xhat)) * rstd
__global__ void layernorm_backward_input_kernel(float* dx, const float* dy, const float* x, const float* mean,
                                                const float* rstd, const float* w, int C, bool accumulate) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * C;
  const float* gr = dy + row * C;
  float* dr = dx + row * C;
  const float m = mean[row], rs = rstd[row];
  float sum_g = 0.f, sum_gx = 0.f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    float g = gr[i] * w[i];
    sum_g += g;
    sum_gx += g * (xr[i] - m) * rs;
  }
  sum_g = block_sum(sum_g, shared) / C;
  sum_gx = block_sum(sum_gx, shared) / C;
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    float d = (gr[i] * w[i] - sum_g - (xr[i] - m) * rs * sum_gx) * rs;
    dr[i] = accumulate ? dr[i] + d : d;
  }
}

// part_w(chunk,C) = Σ_rows dy·xhat, part_b(chunk,C) = Σ_rows dy over the chunk's rows. Block (32, 8).
__global__ void layernorm_weight_partial_kernel(float* part_w, float* part_b, const float* dy, const float* x,
                                                const float* mean, const float* rstd, int N, int C,
                                                int rows_per_chunk) {
  __shared__ float lanes_w[kRowLanes][kColumnTile + 1];
  __shared__ float lanes_b[kRowLanes][kColumnTile + 1];
  const int c = blockIdx.x * kColumnTile + threadIdx.x;
  const int r0 = blockIdx.y * rows_per_chunk;
  const int r1 = min(N, r0 + rows_per_chunk);
  float acc_w = 0.f, acc_b = 0.f;
  if (c < C) {
    for (int r = r0 + int(threadIdx.y); r < r1; r += kRowLanes) {
      const int64_t i = int64_t(r) * C + c;
      const float g = dy[i];
      acc_w += g * (x[i] - mean[r]) * rstd[r];
      acc_b += g;
    }
  }
  lanes_w[threadIdx.y][threadIdx.x] = acc_w;
  lanes_b[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sw = 0.f, sb = 0.f;
    for (int k = 0; k < kRowLanes; ++k) {
      sw += lanes_w[k][threadIdx.x];
      sb += lanes_b[k][threadIdx.x];
    }
    part_w[int64_t(blockIdx.y) * C + c] = sw;
    part_b[int64_t(blockIdx.y) * C + c] = sb;
  }
}

__global__ void add_kernel(float* y, const float* a, const float* b, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] = a[i] + b[i];
}

__global__ void accumulate_kernel(float* y, const float* x, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

__global__ void fill_kernel(float* y, float value, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] = value;
}

}  // namespace

void layernorm_forward(Act y, float* mean, float* rstd, const float* x, const float* w, const float* b, int N, int C,
                       cudaStream_t s) {
  if (N <= 0) return;
  if (y.bf16)
    layernorm_forward_kernel<<<N, row_threads(C), 0, s>>>(y.bits(), mean, rstd, x, w, b, C);
  else
    layernorm_forward_kernel<<<N, row_threads(C), 0, s>>>(y.f32(), mean, rstd, x, w, b, C);
  CUDA_CHECK_LAUNCH();
}

void layernorm_backward_input(float* dx, const float* dy, const float* x, const float* mean, const float* rstd,
                              const float* w, int N, int C, bool accumulate, cudaStream_t s) {
  if (N <= 0) return;
  layernorm_backward_input_kernel<<<N, row_threads(C), 0, s>>>(dx, dy, x, mean, rstd, w, C, accumulate);
  CUDA_CHECK_LAUNCH();
}

void layernorm_backward_weight(float* dw, float* db, const float* dy, const float* x, const float* mean,
                               const float* rstd, int N, int C, bool accumulate, float* partial, cudaStream_t s) {
  if (C <= 0) return;
  const int chunks = column_chunks(N);
  const int rows_per_chunk = (N + chunks - 1) / chunks;
  float* part_w = partial;                         // (chunks, C)
  float* part_b = partial + int64_t(chunks) * C;  // (chunks, C)
  dim3 grid((C + kColumnTile - 1) / kColumnTile, chunks);
  layernorm_weight_partial_kernel<<<grid, dim3(kColumnTile, kRowLanes), 0, s>>>(part_w, part_b, dy, x, mean, rstd,
                                                                               N, C, rows_per_chunk);
  CUDA_CHECK_LAUNCH();
  column_finish(dw, part_w, chunks, C, accumulate, s);
  column_finish(db, part_b, chunks, C, accumulate, s);
}

void add(float* y, const float* a, const float* b, size_t n, cudaStream_t s) {
  if (n == 0) return;
  add_kernel<<<grid_for(n, 256), 256, 0, s>>>(y, a, b, n);
  CUDA_CHECK_LAUNCH();
}

void accumulate(float* y, const float* x, size_t n, cudaStream_t s) {
  if (n == 0) return;
  accumulate_kernel<<<grid_for(n, 256), 256, 0, s>>>(y, x, n);
  CUDA_CHECK_LAUNCH();
}

void fill(float* y, float value, size_t n, cudaStream_t s) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n, 256), 256, 0, s>>>(y, value, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace piper::cuda
