// CUDA kernels that route tokens of a mixture of experts on the device: router softmax and top-k (one thread per
// token), capacity and the expert-ordered assignment list (counted per sequence and expert, then placed), the balance
// loss (one block, a fixed order) and the router's backward. No atomics: results repeat bit for bit.
#include "backend/cuda/cuda_common.hpp"
#include "backend/cuda/cuda_launch.hpp"
#include "backend/cuda/device_utils.cuh"

namespace piper::cuda {

namespace {

constexpr int kThreads = 256;

// probs(n,E) = softmax(logits) (may alias), then the top K of probs + bias (ties: lower index), their weights.
__global__ void route_kernel(float* probs, int32_t* selected, float* weight, const float* logits, const float* bias,
                             int n, int E, int K, bool norm_topk) {
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x) {
    const float* l = logits + t * E;  // (E)
    float* p = probs + t * E;         // (E)
    float mx = l[0];
    for (int e = 1; e < E; ++e) mx = fmaxf(mx, l[e]);
    float sum = 0.f;
    for (int e = 0; e < E; ++e) sum += (p[e] = expf(l[e] - mx));
    for (int e = 0; e < E; ++e) p[e] /= sum;
    int32_t* sel = selected + t * K;  // (K)
    float* w = weight + t * K;        // (K)
    float picked = 0.f;
    for (int k = 0; k < K; ++k) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int j = 0; j < k; ++j) taken = taken || sel[j] == e;
        if (taken) continue;
        if (best < 0 || (bias ? p[e] + bias[e] > p[best] + bias[best] : p[e] > p[best])) best = e;
      }
      sel[k] = best;
      w[k] = p[best];
      picked += p[best];
    }
    if (norm_topk)
      for (int k = 0; k < K; ++k) w[k] /= picked;
  }
}

// One thread per (sequence q, expert e): its assignments in token order; the first `capacity` get their index
// within (q,e) as position, the rest -1; fraction[q,e] = how many there were (scaled later).
__global__ void assign_count_kernel(int32_t* position, float* fraction, const int32_t* selected, int sequences, int T,
                                    int E, int K, int capacity) {
  const int64_t pairs = int64_t(sequences) * E;
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < pairs; j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t q = j / E;
    const int e = int(j % E);
    int c = 0;
    for (int64_t a = q * T * K; a < (q + 1) * T * K; ++a)
      if (selected[a] == e) {
        position[a] = c < capacity ? c : -1;
        ++c;
      }
    fraction[j] = float(c);
  }
}

// One block: counts[e] = Σ_q kept of (q,e); stats += assignments per expert, then the dropped ones.
__global__ void assign_totals_kernel(int32_t* counts, double* stats, const float* fraction, int sequences, int E,
                                     int capacity) {
  __shared__ double shared[32];
  double dropped = 0;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int kept = 0, all = 0;
    for (int q = 0; q < sequences; ++q) {
      const int c = int(fraction[int64_t(q) * E + e]);
      kept += c < capacity ? c : capacity;
      all += c;
    }
    counts[e] = kept;
    dropped += double(all - kept);
    if (stats) stats[e] += double(all);
  }
  dropped = block_sum(dropped, shared);
  if (stats && threadIdx.x == 0) stats[E] += dropped;
}

// Each kept assignment's place in expert order: the experts before its own, the earlier sequences' kept ones of
// its expert, then its index within (q,e).
__global__ void assign_place_kernel(int32_t* position, int32_t* token, float* token_weight, const int32_t* counts,
                                    const float* fraction, const int32_t* selected, const float* weight, int n, int T,
                                    int E, int K, int capacity) {
  const int64_t slots = int64_t(n) * K;
  for (int64_t a = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; a < slots; a += int64_t(gridDim.x) * blockDim.x) {
    if (position[a] < 0) continue;
    const int e = selected[a];
    const int64_t t = a / K, q = t / T;
    int64_t at = position[a];
    for (int x = 0; x < e; ++x) at += counts[x];
    for (int64_t p = 0; p < q; ++p) {
      const int c = int(fraction[p * E + e]);
      at += c < capacity ? c : capacity;
    }
    position[a] = int32_t(at);
    token[at] = int32_t(t);
    token_weight[at] = weight[a];
  }
}

// token[i] = -1, token_weight[i] = 0 past the kept assignments; fraction scaled to E/(K·T) · count.
__global__ void assign_finish_kernel(int32_t* token, float* token_weight, float* fraction, const int32_t* counts,
                                     int E, int A, int64_t fractions, float fraction_scale) {
  int64_t kept = 0;
  for (int e = 0; e < E; ++e) kept += counts[e];
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = kept + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < A; i += stride) {
    token[i] = -1;
    token_weight[i] = 0.f;
  }
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < fractions; j += stride)
    fraction[j] *= fraction_scale;
}

// One block: *loss += scale · Σ_(q,e) f[q,e] · (Σ_t p[t,e]) / T; each thread's pairs in order, then a fixed tree.
__global__ void balance_loss_kernel(double* loss, const float* fraction, const float* probs, int sequences, int T,
                                    int E, double scale) {
  __shared__ double shared[32];
  double sum = 0;
  const int64_t pairs = int64_t(sequences) * E;
  for (int64_t j = threadIdx.x; j < pairs; j += blockDim.x) {
    const int64_t q = j / E;
    const int e = int(j % E);
    double mass = 0;
    for (int64_t t = q * T; t < (q + 1) * T; ++t) mass += probs[t * E + e];
    sum += double(fraction[j]) * mass / T;
  }
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) *loss += scale * sum;
}

// One thread per token: d probs from the balance loss and the combine weights, then through the softmax. The
// experts of a token are distinct, so d probs_e is the balance term plus at most one slot's term.
__global__ void router_backward_kernel(float* dlogits, const float* probs, const int32_t* selected,
                                       const float* weight, const float* fraction, const float* dweight, int n, int T,
                                       int E, int K, bool norm_topk, double balance_scale) {
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x) {
    const float* p = probs + t * E;         // (E)
    const int32_t* sel = selected + t * K;  // (K)
    const float* w = weight + t * K;        // (K)
    const float* dw = dweight + t * K;      // (K)
    const float* f = fraction + (t / T) * E;
    float picked = 0.f, dot = 0.f;
    if (norm_topk)
      for (int k = 0; k < K; ++k) {
        picked += p[sel[k]];
        dot += dw[k] * w[k];
      }
    auto dprob = [&](int e) {
      float d = float(balance_scale * double(f[e]) / T);
      for (int k = 0; k < K; ++k)
        if (sel[k] == e) d += norm_topk ? (dw[k] - dot) / picked : dw[k];
      return d;
    };
    float pdp = 0.f;
    for (int e = 0; e < E; ++e) pdp += p[e] * dprob(e);
    float* dl = dlogits + t * E;
    for (int e = 0; e < E; ++e) dl[e] = p[e] * (dprob(e) - pdp);
  }
}

}  // namespace

void moe_route(float* probs, int32_t* selected, float* weight, const float* logits, const float* bias, int n, int E,
               int K, bool norm_topk, cudaStream_t s) {
  if (n <= 0 || E <= 0) return;
  route_kernel<<<grid_for(size_t(n), kThreads), kThreads, 0, s>>>(probs, selected, weight, logits, bias, n, E, K,
                                                                  norm_topk);
  CUDA_CHECK_LAUNCH();
}

void moe_assign(int32_t* position, int32_t* counts, int32_t* token, float* token_weight, float* fraction,
                double* stats, const int32_t* selected, const float* weight, int n, int T, int E, int K, int capacity,
                int A, cudaStream_t s) {
  if (E <= 0) return;
  const int sequences = T > 0 ? n / T : 0;
  const size_t pairs = size_t(sequences) * size_t(E);
  if (pairs > 0) {
    assign_count_kernel<<<grid_for(pairs, kThreads), kThreads, 0, s>>>(position, fraction, selected, sequences, T,
                                                                        E, K, capacity);
    CUDA_CHECK_LAUNCH();
  }
  assign_totals_kernel<<<1, kThreads, 0, s>>>(counts, stats, fraction, sequences, E, capacity);
  CUDA_CHECK_LAUNCH();
  if (n > 0 && K > 0) {
    assign_place_kernel<<<grid_for(size_t(n) * size_t(K), kThreads), kThreads, 0, s>>>(
        position, token, token_weight, counts, fraction, selected, weight, n, T, E, K, capacity);
    CUDA_CHECK_LAUNCH();
  }
  const size_t tail = size_t(A > 0 ? A : 0), finish = tail > pairs ? tail : pairs;
  if (finish > 0 && K > 0 && T > 0) {
    assign_finish_kernel<<<grid_for(finish, kThreads), kThreads, 0, s>>>(token, token_weight, fraction, counts, E, A,
                                                                          int64_t(pairs), float(E) / float(K * T));
    CUDA_CHECK_LAUNCH();
  }
}

void moe_balance_loss(double* loss, const float* fraction, const float* probs, int n, int T, int E, double scale,
                      cudaStream_t s) {
  if (T <= 0 || E <= 0) return;
  balance_loss_kernel<<<1, kThreads, 0, s>>>(loss, fraction, probs, n / T, T, E, scale);
  CUDA_CHECK_LAUNCH();
}

void moe_router_backward(float* dlogits, const float* probs, const int32_t* selected, const float* weight,
                         const float* fraction, const float* dweight, int n, int T, int E, int K, bool norm_topk,
                         double balance_scale, cudaStream_t s) {
  if (n <= 0 || E <= 0 || T <= 0) return;
  router_backward_kernel<<<grid_for(size_t(n), kThreads), kThreads, 0, s>>>(
      dlogits, probs, selected, weight, fraction, dweight, n, T, E, K, norm_topk, balance_scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace piper::cuda
