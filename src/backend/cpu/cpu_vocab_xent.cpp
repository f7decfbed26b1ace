// CPU kernels of the vocabulary-parallel cross-entropy: each rank's shard of the logits gives per-row statistics
// (max, sum of exponentials, target logit), the ranks gather them, and each rank finishes its shard of the softmax
// and the whole loss. With one rank the operations are softmax_xent_forward's, in its order.
#include <cmath>

#include "backend/cpu/cpu_kernels.hpp"
#include "backend/cpu/cpu_parallel.hpp"
#include "backend/cpu/vec_math.hpp"

namespace piper {

using cpu::for_chunks;
using cpu::for_range;

namespace {

constexpr size_t kRowChunks = 64;  // fixed row chunks of the loss sum: the same bits on any number of threads

}  // namespace

void CpuKernels::vocab_xent_stats(float* stats, const float* logits, const int32_t* targets, int N, int Vl, int v0) {
  if (N <= 0) return;
  for_range(size_t(N) * size_t(Vl > 0 ? Vl : 1), threads_, [&](size_t e0, size_t e1) {
    const size_t width = size_t(Vl > 0 ? Vl : 1);
    for (size_t r = e0 / width; r < e1 / width; ++r) {
      const float* lr = logits + r * size_t(Vl);  // (Vl)
      float* st = stats + r * 3;                  // (3): max, Σ exp(l − max), target logit
      const float mx = Vl > 0 ? vec::lane_max(lr, Vl) : -INFINITY;
      st[0] = mx;
      st[1] = vec::lane_sum(Vl, [&](int i) { return vec::exp_approx(lr[i] - mx); });
      const int t = targets[r] - v0;
      st[2] = t >= 0 && t < Vl ? lr[t] : 0.f;
    }
  });
}

void CpuKernels::vocab_xent_finish(float* probs, double* loss_sum, const float* logits, const float* all,
                                   const int32_t* targets, int N, int Vl, int ranks, float scale) {
  double partial[kRowChunks] = {0};
  for_chunks(size_t(N), kRowChunks, threads_, [&](size_t chunk, size_t r0, size_t r1) {
    double acc = 0;
    for (size_t r = r0; r < r1; ++r) {
      float mx = -INFINITY, target_logit = 0.f;
      for (int q = 0; q < ranks; ++q) mx = std::fmax(mx, all[(size_t(q) * N + r) * 3]);
      float sum = 0.f;
      for (int q = 0; q < ranks; ++q) {  // each rank's sum, rescaled to the common max (1 where it is that max)
        const float* st = all + (size_t(q) * N + r) * 3;
        sum += st[0] == mx ? st[1] : st[1] * vec::exp_approx(st[0] - mx);
        target_logit += st[2];
      }
      const float* lr = logits + r * size_t(Vl);  // may alias probs
      float* pr = probs + r * size_t(Vl);
      const float inv = 1.0f / sum;
      for (int i = 0; i < Vl; ++i) pr[i] = vec::exp_approx(lr[i] - mx) * inv;
      acc += double(std::log(sum)) - double(target_logit - mx);
    }
    partial[chunk] = acc;
  });
  double total = 0;
  for (double p : partial) total += p;
  *loss_sum += double(scale) * total;
}

void CpuKernels::vocab_xent_backward(float* dlogits, const float* probs, const int32_t* targets, int N, int Vl, int v0,
                                     float scale) {
  for_range(size_t(N) * size_t(Vl > 0 ? Vl : 1), threads_, [&](size_t e0, size_t e1) {
    const size_t width = size_t(Vl > 0 ? Vl : 1);
    for (size_t r = e0 / width; r < e1 / width; ++r) {
      const float* pr = probs + r * size_t(Vl);  // may alias dlogits
      float* dr = dlogits + r * size_t(Vl);
      for (int i = 0; i < Vl; ++i) dr[i] = scale * pr[i];
      const int t = targets[r] - v0;
      if (t >= 0 && t < Vl) dr[t] -= scale;
    }
  });
}

}  // namespace piper
