// Embeddings (token + position, and token only) forward/backward, softmax cross-entropy, the gradient-norm
// reduction and AdamW. Every reduction runs in a fixed order (no float atomics), so results repeat bit for bit.
#include <cmath>

#include "backend/cuda/cuda_common.hpp"
#include "backend/cuda/cuda_launch.hpp"
#include "backend/cuda/device_utils.cuh"

namespace piper::cuda {

namespace {

constexpr int kVocabRows = 64;  // vocabulary rows per block of the wte gradient

// x(rows,C) = wte[tok[r]] + wpe[r % T]: columns over x, rows grid-strided over y.
__global__ void embedding_forward_kernel(float* x, const int32_t* tok, const float* wte, const float* wpe, int rows,
                                         int T, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int r = blockIdx.y; r < rows; r += gridDim.y)
    x[int64_t(r) * C + c] = wte[int64_t(tok[r]) * C + c] + wpe[int64_t(r % T) * C + c];
}

// x(rows,C) = w[tok[r]]: columns over x, rows grid-strided over y.
__global__ void token_embedding_forward_kernel(float* x, const int32_t* tok, const float* w, int rows, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int r = blockIdx.y; r < rows; r += gridDim.y) x[int64_t(r) * C + c] = w[int64_t(tok[r]) * C + c];
}

// dwte(V,C) (+)= scatter of dx(rows,C) by token. One warp per block owns 32 columns of kVocabRows
// vocabulary rows: it scans the tokens 32 at a time and adds matching rows in row order (deterministic).
__global__ void embedding_backward_wte_kernel(float* dwte, const float* dx, const int32_t* tok, int rows, int C,
                                              int V, bool accumulate) {
  __shared__ float acc[kVocabRows][32];  // (vocab row in block, lane); each lane touches its own column
  const int lane = threadIdx.x;
  const int c = blockIdx.x * 32 + lane;
  const int v0 = blockIdx.y * kVocabRows;
  const int nv = min(kVocabRows, V - v0);
  for (int k = 0; k < nv; ++k) acc[k][lane] = (accumulate && c < C) ? dwte[int64_t(v0 + k) * C + c] : 0.f;
  for (int r0 = 0; r0 < rows; r0 += 32) {
    const int t = r0 + lane < rows ? tok[r0 + lane] : -1;
    unsigned hits = __ballot_sync(kFullMask, t >= v0 && t < v0 + nv);
    while (hits) {  // same on every lane
      const int k = __ffs(int(hits)) - 1;
      hits &= hits - 1;
      const int token = __shfl_sync(kFullMask, t, k);
      if (c < C) acc[token - v0][lane] += dx[int64_t(r0 + k) * C + c];
    }
  }
  if (c < C)
    for (int k = 0; k < nv; ++k) dwte[int64_t(v0 + k) * C + c] = acc[k][lane];
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

// dlogits(N,V) = scale · (probs - onehot(target)); may alias probs
__global__ void softmax_xent_backward_kernel(float* dlogits, const float* probs, const int32_t* targets, int N,
                                             int V, float scale) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= V) return;
  for (int r = blockIdx.y; r < N; r += gridDim.y) {
    const int64_t i = int64_t(r) * V + c;
    float d = scale * probs[i];
    if (c == targets[r]) d -= scale;
    dlogits[i] = d;
  }
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

void embedding_backward(float* dwte, float* dwpe, const float* dx, const int32_t* tok, int B, int T, int C, int V,
                        bool accumulate_wte, bool accumulate_wpe, cudaStream_t s) {
  if (C <= 0) return;
  if (V > 0) {
    dim3 grid((C + 31) / 32, (V + kVocabRows - 1) / kVocabRows);
    embedding_backward_wte_kernel<<<grid, 32, 0, s>>>(dwte, dx, tok, B * T, C, V, accumulate_wte);
    CUDA_CHECK_LAUNCH();
  }
  if (T > 0) {
    embedding_backward_wpe_kernel<<<grid_for(size_t(T) * C, 256), 256, 0, s>>>(dwpe, dx, B, T, C, accumulate_wpe);
    CUDA_CHECK_LAUNCH();
  }
}

void token_embedding_forward(float* x, const int32_t* tok, const float* w, int N, int C, cudaStream_t s) {
  if (N <= 0 || C <= 0) return;
  dim3 grid((C + 255) / 256, grid_rows(N));
  token_embedding_forward_kernel<<<grid, 256, 0, s>>>(x, tok, w, N, C);
  CUDA_CHECK_LAUNCH();
}

void token_embedding_backward(float* dw, const float* dx, const int32_t* tok, int N, int C, int V, bool accumulate,
                              cudaStream_t s) {
  if (C <= 0 || V <= 0) return;
  // The wte scatter of embedding_backward: every (column tile, vocabulary tile) scans the tokens in row order.
  dim3 grid((C + 31) / 32, (V + kVocabRows - 1) / kVocabRows);
  embedding_backward_wte_kernel<<<grid, 32, 0, s>>>(dw, dx, tok, N > 0 ? N : 0, C, V, accumulate);
  CUDA_CHECK_LAUNCH();
}

void softmax_xent_forward(float* probs, double* loss_sum, const float* logits, const int32_t* targets, int N, int V,
                          float scale, double* row_loss, cudaStream_t s) {
  if (N <= 0) return;
  softmax_xent_forward_kernel<<<N, row_threads(V), 0, s>>>(probs, row_loss, logits, targets, V);
  CUDA_CHECK_LAUNCH();
  add_scaled_sum_kernel<<<1, 256, 0, s>>>(loss_sum, row_loss, N, double(scale));
  CUDA_CHECK_LAUNCH();
}

void softmax_xent_backward(float* dlogits, const float* probs, const int32_t* targets, int N, int V, float scale,
                           cudaStream_t s) {
  if (N <= 0 || V <= 0) return;
  dim3 grid((V + 255) / 256, grid_rows(N));
  softmax_xent_backward_kernel<<<grid, 256, 0, s>>>(dlogits, probs, targets, N, V, scale);
  CUDA_CHECK_LAUNCH();
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
