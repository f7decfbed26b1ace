// Embeddings (token + position, and token only: of the whole vocabulary or of one rank's shard) forward/backward,
// softmax cross-entropy, the gradient-norm reduction and AdamW. Every reduction runs in a fixed order (no float
// atomics), so results repeat bit for bit.
#include <cub/device/device_radix_sort.cuh>

#include <cmath>

#include "backend/cuda/cuda_common.hpp"
#include "backend/cuda/cuda_launch.hpp"
#include "backend/cuda/device_utils.cuh"

namespace piper::cuda {

namespace {

constexpr int kScatterColumns = 64;  // columns per block of the wte gradient

// x(rows,C) = wte[tok[r]] + wpe[r % T]: columns over x, rows grid-strided over y.
__global__ void embedding_forward_kernel(float* x, const int32_t* tok, const float* wte, const float* wpe, int rows,
                                         int T, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int r = blockIdx.y; r < rows; r += gridDim.y)
    x[int64_t(r) * C + c] = wte[int64_t(tok[r]) * C + c] + wpe[int64_t(r % T) * C + c];
}

// x(rows,C) = w[tok[r] − v0] where the token is in [v0, v0 + Vl), else 0: columns over x, rows grid-strided over y.
__global__ void vocab_embedding_forward_kernel(float* x, const int32_t* tok, const float* w, int rows, int C, int v0,
                                               int Vl) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t t = int64_t(tok[r]) - v0;
    x[int64_t(r) * C + c] = t >= 0 && t < Vl ? w[t * C + c] : 0.f;
  }
}

// rows(n) = 0, 1, …, n−1: the values the token sort carries along
__global__ void iota_kernel(int32_t* rows, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) rows[i] = i;
}

// dw(Vl,C) (+)= scatter of dx(rows,C) by token − v0, from the row indices sorted by token (a stable sort, so the
// rows of one token are in increasing order). The first sorted position of each token owns that token's row: one
// thread per column starts from the old value (accumulate) or 0 and adds the token's dx rows in row order, the
// same additions in the same order as the CPU backend (deterministic, no atomics). Tokens outside [v0, v0 + Vl)
// (another rank's shard) are skipped. Block: kScatterColumns columns over x; sorted positions grid-strided over
// blockIdx.x.
__global__ void embedding_backward_sorted_kernel(float* dw, const float* dx, const int32_t* sorted_tok,
                                                 const int32_t* sorted_row, int rows, int C, int v0, int Vl,
                                                 bool accumulate) {
  const int c = blockIdx.y * kScatterColumns + threadIdx.x;
  if (c >= C) return;
  for (int p = blockIdx.x; p < rows; p += gridDim.x) {
    const int token = sorted_tok[p];
    const int64_t t = int64_t(token) - v0;
    if ((p > 0 && sorted_tok[p - 1] == token) || t < 0 || t >= Vl) continue;  // not the first of a token
    int end = p + 1;
    while (end < rows && sorted_tok[end] == token) ++end;
    float* out = dw + t * C + c;
    float acc = accumulate ? *out : 0.f;
    int q = p;
    for (; q + 4 <= end; q += 4) {  // four loads in flight, added in order
      const float g0 = dx[int64_t(sorted_row[q]) * C + c], g1 = dx[int64_t(sorted_row[q + 1]) * C + c];
      const float g2 = dx[int64_t(sorted_row[q + 2]) * C + c], g3 = dx[int64_t(sorted_row[q + 3]) * C + c];
      acc += g0;
      acc += g1;
      acc += g2;
      acc += g3;
    }
    for (; q < end; ++q) acc += dx[int64_t(sorted_row[q]) * C + c];
    *out = acc;
  }
}

// dwpe(T,C) (+)= Σ_b dx(b,t,:), b in order
__global__ void embedding_backward_wpe_kernel(float* dwpe, const float* dx, int B, int T, int C, bool accumulate) {
  const size_t n = size_t(T) * C;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float s = accumulate ? dwpe[i] : 0.f;
    for (int b = 0; b < B; ++b) s += dx[size_t(b) * n + i];
    dwpe[i] = s;
  }
}

// One block per row: probs(V) = softmax(logits(V)) (may alias); row_loss = log Σ exp(l - max) - (l[target] - max).
__global__ void softmax_xent_forward_kernel(float* probs, double* row_loss, const float* logits,
                                            const int32_t* targets, int V) {
  __shared__ float shared[32];
  __shared__ float target_logit;
  const int64_t row = blockIdx.x;
  const float* lr = logits + row * V;
  float* pr = probs + row * V;
  if (threadIdx.x == 0) target_logit = lr[targets[row]];
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, lr[i]);
  mx = block_max(mx, shared);  // its barriers also order the target read before any write below
  float sum = 0.f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    float e = expf(lr[i] - mx);
    pr[i] = e;
    sum += e;
  }
  sum = block_sum(sum, shared);
  const float inv = 1.0f / sum;
  for (int i = threadIdx.x; i < V; i += blockDim.x) pr[i] *= inv;
  if (threadIdx.x == 0) row_loss[row] = double(logf(sum)) - double(target_logit - mx);
}

// *acc += scale · Σ values(n), one block, fixed order
__global__ void add_scaled_sum_kernel(double* acc, const double* values, int64_t n, double scale) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += values[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *acc += scale * s;
}

// partial(block) = Σ x² over the block's grid-stride elements, accumulated in double
__global__ void sum_squares_partial_kernel(double* partial, const float* x, size_t n) {
  __shared__ double shared[32];
  double s = 0.0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    s += double(v * v);
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// Per-step constants of AdamW, computed on the host exactly as the CPU backend does.
struct AdamWStep {
  float beta1, beta2, eps, grad_scale, bc2_sqrt, step_size, decay;
};

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, size_t n, AdamWStep a) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float g = grad[i] * a.grad_scale;
    const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * g;
    const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / a.bc2_sqrt + a.eps;
    param[i] = param[i] * a.decay - a.step_size * mi / denom;
  }
}

constexpr int kSumSquaresThreads = 256;

}  // namespace

void embedding_forward(float* x, const int32_t* tok, const float* wte, const float* wpe, int B, int T, int C,
                       cudaStream_t s) {
  const int rows = B * T;
  if (rows <= 0 || C <= 0) return;
  dim3 grid((C + 255) / 256, grid_rows(rows));
  embedding_forward_kernel<<<grid, 256, 0, s>>>(x, tok, wte, wpe, rows, T, C);
  CUDA_CHECK_LAUNCH();
}

namespace {

size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

// cub's temporary storage for sorting `rows` (token, row) pairs
size_t sort_temp_bytes(int rows) {
  size_t bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), rows));
  return bytes;
}

}  // namespace

size_t token_embedding_backward_workspace_bytes(int rows) {
  if (rows <= 0) return 0;
  return 3 * align_up(sizeof(int32_t) * size_t(rows)) + align_up(sort_temp_bytes(rows));
}

void vocab_embedding_backward(float* dw, const float* dx, const int32_t* tok, int N, int C, int v0, int Vl,
                              bool accumulate, void* workspace, cudaStream_t s) {
  if (C <= 0 || Vl <= 0) return;
  if (!accumulate) CUDA_CHECK(cudaMemsetAsync(dw, 0, sizeof(float) * size_t(Vl) * C, s));  // tokens not seen
  if (N <= 0) return;
  // workspace: row indices (N), sorted tokens (N), sorted row indices (N), then cub's temporary storage
  char* at = static_cast<char*>(workspace);
  const size_t index_bytes = align_up(sizeof(int32_t) * size_t(N));
  auto* row_index = reinterpret_cast<int32_t*>(at);
  auto* sorted_tok = reinterpret_cast<int32_t*>(at + index_bytes);
  auto* sorted_row = reinterpret_cast<int32_t*>(at + 2 * index_bytes);
  void* temp = at + 3 * index_bytes;
  size_t temp_bytes = sort_temp_bytes(N);
  iota_kernel<<<grid_for(size_t(N), 256), 256, 0, s>>>(row_index, N);
  CUDA_CHECK_LAUNCH();
  // Stable: rows of one token keep their increasing order. All 32 bits, so that any int32 token sorts apart.
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tok, sorted_tok, row_index, sorted_row, N, 0, 32, s));
  const unsigned positions = unsigned(N < 4096 ? N : 4096);
  dim3 grid(positions, (C + kScatterColumns - 1) / kScatterColumns);
  embedding_backward_sorted_kernel<<<grid, kScatterColumns, 0, s>>>(dw, dx, sorted_tok, sorted_row, N, C, v0, Vl,
                                                                     accumulate);
  CUDA_CHECK_LAUNCH();
}

void embedding_backward(float* dwte, float* dwpe, const float* dx, const int32_t* tok, int B, int T, int C, int V,
                        bool accumulate_wte, bool accumulate_wpe, void* workspace, cudaStream_t s) {
  if (C <= 0) return;
  vocab_embedding_backward(dwte, dx, tok, B * T, C, 0, V, accumulate_wte, workspace, s);  // the whole vocabulary
  if (T > 0) {
    embedding_backward_wpe_kernel<<<grid_for(size_t(T) * C, 256), 256, 0, s>>>(dwpe, dx, B, T, C, accumulate_wpe);
    CUDA_CHECK_LAUNCH();
  }
}

void vocab_embedding_forward(float* x, const int32_t* tok, const float* w, int N, int C, int v0, int Vl,
                             cudaStream_t s) {
  if (N <= 0 || C <= 0) return;
  dim3 grid((C + 255) / 256, grid_rows(N));
  vocab_embedding_forward_kernel<<<grid, 256, 0, s>>>(x, tok, w, N, C, v0, Vl);
  CUDA_CHECK_LAUNCH();
}

void add_scaled_sum(double* acc, const double* values, int64_t n, double scale, cudaStream_t s) {
  add_scaled_sum_kernel<<<1, 256, 0, s>>>(acc, values, n, scale);
  CUDA_CHECK_LAUNCH();
}

void softmax_xent_forward(float* probs, double* loss_sum, const float* logits, const int32_t* targets, int N, int V,
                          float scale, double* row_loss, cudaStream_t s) {
  if (N <= 0) return;
  softmax_xent_forward_kernel<<<N, row_threads(V), 0, s>>>(probs, row_loss, logits, targets, V);
  CUDA_CHECK_LAUNCH();
  add_scaled_sum(loss_sum, row_loss, N, double(scale), s);
}

size_t sum_squares_partials(size_t n) {
  size_t blocks = (n + size_t(kSumSquaresThreads) * 8 - 1) / (size_t(kSumSquaresThreads) * 8);
  return blocks < 1 ? 1 : (blocks > 1024 ? 1024 : blocks);
}

void sum_squares(double* acc, const float* x, size_t n, double* partial, cudaStream_t s) {
  if (n == 0) return;
  const size_t blocks = sum_squares_partials(n);
  sum_squares_partial_kernel<<<unsigned(blocks), kSumSquaresThreads, 0, s>>>(partial, x, n);
  CUDA_CHECK_LAUNCH();
  add_scaled_sum_kernel<<<1, 256, 0, s>>>(acc, partial, int64_t(blocks), 1.0);
  CUDA_CHECK_LAUNCH();
}

void adamw(float* param, const float* grad, float* m, float* v, size_t n, const AdamWArgs& args, cudaStream_t s) {
  if (n == 0) return;
  // Same arithmetic as torch.optim.AdamW (non-fused) and the CPU backend: decay, moments, bias-corrected step.
  AdamWStep a;
  a.beta1 = args.beta1;
  a.beta2 = args.beta2;
  a.eps = args.eps;
  a.grad_scale = args.grad_scale;
  a.bc2_sqrt = float(std::sqrt(1.0 - std::pow(double(args.beta2), double(args.step))));
  const float bc1 = 1.0f - float(std::pow(double(args.beta1), double(args.step)));
  a.step_size = args.lr / bc1;
  a.decay = 1.0f - args.lr * args.weight_decay;
  adamw_kernel<<<grid_for(n, 256), 256, 0, s>>>(param, grad, m, v, n, a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace piper::cuda
