// CUDA kernels of the vocabulary-parallel cross-entropy (one block per row): each rank's shard statistics, the
// finish from every rank's gathered statistics (the shard's softmax and the row losses, summed in a fixed order),
// and the backward with the one-hot where the target falls in the shard. No atomics: results repeat bit for bit.
#include "backend/cuda/cuda_common.hpp"
#include "backend/cuda/cuda_launch.hpp"
#include "backend/cuda/device_utils.cuh"

namespace piper::cuda {

namespace {

// stats(N,3) per row of the shard: max, Σ exp(l − max), the target's logit where it is in the shard (else 0).
__global__ void vocab_xent_stats_kernel(float* stats, const float* logits, const int32_t* targets, int Vl, int v0) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float* lr = logits + row * Vl;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < Vl; i += blockDim.x) mx = fmaxf(mx, lr[i]);
  mx = block_max(mx, shared);
  float sum = 0.f;
  for (int i = threadIdx.x; i < Vl; i += blockDim.x) sum += expf(lr[i] - mx);
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) {
    const int t = targets[row] - v0;
    stats[row * 3] = mx;
    stats[row * 3 + 1] = sum;
    stats[row * 3 + 2] = t >= 0 && t < Vl ? lr[t] : 0.f;
  }
}

// One block per row: the common max and sum over the ranks' stats all(ranks,N,3), the shard's softmax (probs may
// alias logits) and the row's loss.
__global__ void vocab_xent_finish_kernel(float* probs, double* row_loss, const float* logits, const float* all,
                                         const int32_t* targets, int N, int Vl, int ranks) {
  const int64_t row = blockIdx.x;
  float mx = -INFINITY, sum = 0.f, target_logit = 0.f;
  for (int q = 0; q < ranks; ++q) mx = fmaxf(mx, all[(int64_t(q) * N + row) * 3]);
  for (int q = 0; q < ranks; ++q) {  // every thread the same sums, in rank order
    const float* st = all + (int64_t(q) * N + row) * 3;
    sum += st[0] == mx ? st[1] : st[1] * expf(st[0] - mx);
    target_logit += st[2];
  }
  const float* lr = logits + row * Vl;
  float* pr = probs + row * Vl;
  const float inv = 1.0f / sum;
  for (int i = threadIdx.x; i < Vl; i += blockDim.x) pr[i] = expf(lr[i] - mx) * inv;
  if (threadIdx.x == 0) row_loss[row] = double(logf(sum)) - double(target_logit - mx);
}

// dlogits(N,Vl) = scale · (probs − onehot(target − v0)): columns over x, rows grid-strided over y.
__global__ void vocab_xent_backward_kernel(float* dlogits, const float* probs, const int32_t* targets, int N, int Vl,
                                           int v0, float scale) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= Vl) return;
  for (int r = blockIdx.y; r < N; r += gridDim.y) {
    const int64_t i = int64_t(r) * Vl + c;
    float d = scale * probs[i];
    if (c == targets[r] - v0) d -= scale;
    dlogits[i] = d;
  }
}

}  // namespace

void vocab_xent_stats(float* stats, const float* logits, const int32_t* targets, int N, int Vl, int v0,
                      cudaStream_t s) {
  if (N <= 0) return;
  vocab_xent_stats_kernel<<<unsigned(N), row_threads(Vl), 0, s>>>(stats, logits, targets, Vl, v0);
  CUDA_CHECK_LAUNCH();
}

void vocab_xent_finish(float* probs, double* loss_sum, const float* logits, const float* all, const int32_t* targets,
                       int N, int Vl, int ranks, float scale, double* row_loss, cudaStream_t s) {
  if (N <= 0) return;
  vocab_xent_finish_kernel<<<unsigned(N), row_threads(Vl), 0, s>>>(probs, row_loss, logits, all, targets, N, Vl,
                                                                   ranks);
  CUDA_CHECK_LAUNCH();
  add_scaled_sum(loss_sum, row_loss, N, double(scale), s);
}

void vocab_xent_backward(float* dlogits, const float* probs, const int32_t* targets, int N, int Vl, int v0,
                         float scale, cudaStream_t s) {
  if (N <= 0 || Vl <= 0) return;
  const int threads = 256;
  dim3 grid(unsigned((Vl + threads - 1) / threads), grid_rows(N));
  vocab_xent_backward_kernel<<<grid, threads, 0, s>>>(dlogits, probs, targets, N, Vl, v0, scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace piper::cuda
