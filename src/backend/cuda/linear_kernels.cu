// Elementwise work around the cuBLAS matmuls of linear layers: bias broadcast, fused bias + GELU-tanh,
// GELU backward, bf16 operands, and deterministic column sums over rows (bias gradients, reused by layernorm).
#include "backend/cuda/cuda_common.hpp"
#include "backend/cuda/cuda_launch.hpp"
#include "backend/cuda/device_utils.cuh"

namespace piper::cuda {

namespace {

constexpr int kColumnTile = 32;  // columns per block of the column-sum kernels
constexpr int kRowLanes = 8;     // rows read in parallel per block

// y(N,OC) = b: columns over x, rows grid-strided over y.
__global__ void bias_fill_kernel(float* y, const float* b, int N, int OC) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  const float bc = b[c];
  for (int r = blockIdx.y; r < N; r += gridDim.y) y[int64_t(r) * OC + c] = bc;
}

// p = pre(N,OC) + b; y = gelu_tanh(p) and dgelu(N,OC) = gelu_tanh'(p) at their widths. pre may be y or dgelu (fp32).
template <typename D, typename Out>
__global__ void bias_gelu_kernel(D* dgelu, Out* y, const float* pre, const float* b, int N, int OC) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  const float bc = b ? b[c] : 0.f;
  for (int r = blockIdx.y; r < N; r += gridDim.y) {
    const int64_t i = int64_t(r) * OC + c;
    const float p = pre[i] + bc;  // read before either write, same thread
    store_value(dgelu, i, gelu_tanh_grad(p));
    store_value(y, i, gelu_tanh(p));
  }
}

template <typename D>
__global__ void gelu_backward_kernel(float* dpre, const float* dy, const D* dgelu, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dpre[i] = dy[i] * load_value(dgelu, int64_t(i));  // dpre may alias dy: read before write, same thread
}

// dst(rows,cols) = bf16 bits of src(rows,cols) (leading dimension ld): columns over x, rows grid-strided over y.
__global__ void to_bf16_kernel(uint16_t* dst, const float* src, int rows, int cols, int ld) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  for (int r = blockIdx.y; r < rows; r += gridDim.y) dst[int64_t(r) * cols + c] = bf16_bits(src[int64_t(r) * ld + c]);
}

__global__ void to_bf16_flat_kernel(uint16_t* dst, const float* src, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = bf16_bits(src[i]);
}

__global__ void from_bf16_kernel(float* dst, const uint16_t* src, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = __uint_as_float(uint32_t(src[i]) << 16);
}

// partial(chunk, C) = Σ over the chunk's rows of x(N,C). Block (32, 8): 32 columns, 8 row lanes.
__global__ void column_partial_kernel(float* partial, const float* x, int N, int C, int rows_per_chunk) {
  __shared__ float lanes[kRowLanes][kColumnTile + 1];
  const int c = blockIdx.x * kColumnTile + threadIdx.x;
  const int r0 = blockIdx.y * rows_per_chunk;
  const int r1 = min(N, r0 + rows_per_chunk);
  float acc = 0.f;
  if (c < C)
    for (int r = r0 + int(threadIdx.y); r < r1; r += kRowLanes) acc += x[int64_t(r) * C + c];
  lanes[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sum = 0.f;
    for (int k = 0; k < kRowLanes; ++k) sum += lanes[k][threadIdx.x];
    partial[int64_t(blockIdx.y) * C + c] = sum;
  }
}

// out(C) (+)= Σ_k partial(k, C), k in order
__global__ void column_finish_kernel(float* out, const float* partial, int chunks, int C, bool accumulate) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
    float sum = 0.f;
    for (int k = 0; k < chunks; ++k) sum += partial[int64_t(k) * C + c];
    out[c] = accumulate ? out[c] + sum : sum;
  }
}

}  // namespace

void bias_fill(float* y, const float* b, int N, int OC, cudaStream_t s) {
  if (N <= 0 || OC <= 0) return;
  dim3 grid((OC + 255) / 256, grid_rows(N));
  bias_fill_kernel<<<grid, 256, 0, s>>>(y, b, N, OC);
  CUDA_CHECK_LAUNCH();
}

void bias_gelu(Act dgelu, Act y, const float* pre, const float* b, int N, int OC, cudaStream_t s) {
  if (N <= 0 || OC <= 0) return;
  dim3 grid((OC + 255) / 256, grid_rows(N));
  if (dgelu.bf16 && y.bf16)
    bias_gelu_kernel<<<grid, 256, 0, s>>>(dgelu.bits(), y.bits(), pre, b, N, OC);
  else if (dgelu.bf16)
    bias_gelu_kernel<<<grid, 256, 0, s>>>(dgelu.bits(), y.f32(), pre, b, N, OC);
  else if (y.bf16)
    bias_gelu_kernel<<<grid, 256, 0, s>>>(dgelu.f32(), y.bits(), pre, b, N, OC);
  else
    bias_gelu_kernel<<<grid, 256, 0, s>>>(dgelu.f32(), y.f32(), pre, b, N, OC);
  CUDA_CHECK_LAUNCH();
}

void gelu_backward(float* dpre, const float* dy, ConstAct dgelu, size_t n, cudaStream_t s) {
  if (n == 0) return;
  if (dgelu.bf16)
    gelu_backward_kernel<<<grid_for(n, 256), 256, 0, s>>>(dpre, dy, dgelu.bits(), n);
  else
    gelu_backward_kernel<<<grid_for(n, 256), 256, 0, s>>>(dpre, dy, dgelu.f32(), n);
  CUDA_CHECK_LAUNCH();
}

void to_bf16(uint16_t* dst, const float* src, int rows, int cols, int ld, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  dim3 grid((cols + 255) / 256, grid_rows(rows));
  to_bf16_kernel<<<grid, 256, 0, s>>>(dst, src, rows, cols, ld);
  CUDA_CHECK_LAUNCH();
}

void to_bf16(uint16_t* dst, const float* src, size_t n, cudaStream_t s) {
  if (n == 0) return;
  to_bf16_flat_kernel<<<grid_for(n, 256), 256, 0, s>>>(dst, src, n);
  CUDA_CHECK_LAUNCH();
}

void from_bf16(float* dst, const uint16_t* src, size_t n, cudaStream_t s) {
  if (n == 0) return;
  from_bf16_kernel<<<grid_for(n, 256), 256, 0, s>>>(dst, src, n);
  CUDA_CHECK_LAUNCH();
}

void column_finish(float* out, const float* partial, int chunks, int C, bool accumulate, cudaStream_t s) {
  if (C <= 0) return;
  column_finish_kernel<<<grid_for(size_t(C), 256), 256, 0, s>>>(out, partial, chunks, C, accumulate);
  CUDA_CHECK_LAUNCH();
}

void column_sums(float* sum, const float* x, int N, int C, bool accumulate, float* partial, cudaStream_t s) {
  if (C <= 0) return;
  const int chunks = column_chunks(N);
  const int rows_per_chunk = (N + chunks - 1) / chunks;
  dim3 grid((C + kColumnTile - 1) / kColumnTile, chunks);
  column_partial_kernel<<<grid, dim3(kColumnTile, kRowLanes), 0, s>>>(partial, x, N, C, rows_per_chunk);
  CUDA_CHECK_LAUNCH();
  column_finish(sum, partial, chunks, C, accumulate, s);
}

}  // namespace piper::cuda
