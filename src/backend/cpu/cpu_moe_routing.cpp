// CPU kernels that route tokens of a mixture of experts: router softmax and top-k, capacity and the expert-ordered
// assignment list, the sequence-wise balance loss and the router's backward. Each is a function of whole sequences.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_kernels.hpp"
#include "backend/cpu/cpu_parallel.hpp"

namespace piper {

using cpu::for_range;

void CpuKernels::moe_route(float* probs, int32_t* selected, float* weight, const float* logits, const float* bias,
                           int n, int E, int K, bool norm_topk) {
  if (n <= 0 || E <= 0) return;
  const size_t row_work = size_t(E) * size_t(K > 0 ? K : 1);
  for_range(size_t(n) * row_work, threads_, [&](size_t e0, size_t e1) {
    for (size_t t = e0 / row_work; t < e1 / row_work; ++t) {
      const float* l = logits + t * size_t(E);  // (E)
      float* p = probs + t * size_t(E);         // (E), may be l
      float mx = l[0];
      for (int e = 1; e < E; ++e) mx = std::max(mx, l[e]);
      float sum = 0.f;
      for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - mx));
      for (int e = 0; e < E; ++e) p[e] /= sum;
      int32_t* sel = selected + t * size_t(K);  // (K)
      float* w = weight + t * size_t(K);        // (K)
      float picked = 0.f;
      for (int k = 0; k < K; ++k) {  // the k-th largest expert not yet picked
        int best = -1;
        for (int e = 0; e < E; ++e) {
          if (std::find(sel, sel + k, e) != sel + k) continue;
          if (best < 0 || (bias ? p[e] + bias[e] > p[best] + bias[best] : p[e] > p[best])) best = e;
        }
        sel[k] = best;
        w[k] = p[best];
        picked += p[best];
      }
      if (norm_topk)
        for (int k = 0; k < K; ++k) w[k] /= picked;
    }
  });
}

void CpuKernels::moe_assign(int32_t* position, int32_t* counts, int32_t* token, float* token_weight, float* fraction,
                            double* stats, const int32_t* selected, const float* weight, int n, int T, int E, int K,
                            int capacity, int A) {
  if (E <= 0) return;
  const int sequences = T > 0 ? n / T : 0;
  // per sequence and expert: the assignments (fraction, counted first), of which the first `capacity` are kept
  std::vector<int32_t> used(static_cast<size_t>(E));
  std::fill(counts, counts + E, 0);
  std::fill(fraction, fraction + size_t(sequences) * E, 0.f);
  for (int q = 0; q < sequences; ++q) {
    std::fill(used.begin(), used.end(), 0);
    for (int t = q * T; t < (q + 1) * T; ++t)
      for (int k = 0; k < K; ++k) {
        const size_t a = size_t(t) * K + k;
        const int e = selected[a];
        fraction[size_t(q) * E + e] += 1.f;
        position[a] = used[size_t(e)] < capacity ? 0 : -1;
        if (position[a] == 0) ++used[size_t(e)], ++counts[e];
      }
  }
  // expert order: expert e's kept assignments start after those of the experts before it, in token order
  std::vector<int32_t> next(static_cast<size_t>(E));
  int32_t kept = 0;
  for (int e = 0; e < E; ++e) next[size_t(e)] = kept, kept += counts[e];
  for (int t = 0; t < n; ++t)
    for (int k = 0; k < K; ++k) {
      const size_t a = size_t(t) * K + k;
      if (position[a] < 0) continue;
      const int32_t at = next[size_t(selected[a])]++;
      position[a] = at;
      token[at] = t;
      token_weight[at] = weight[a];
    }
  for (int i = kept; i < A; ++i) token[i] = -1, token_weight[i] = 0.f;
  if (stats) {
    for (int q = 0; q < sequences; ++q)
      for (int e = 0; e < E; ++e) stats[e] += double(fraction[size_t(q) * E + e]);
    stats[E] += double(n) * K - double(kept);
  }
  for (int q = 0; q < sequences; ++q)
    for (int e = 0; e < E; ++e) fraction[size_t(q) * E + e] *= float(E) / float(K * T);
}

void CpuKernels::moe_balance_loss(double* loss, const float* fraction, const float* probs, int n, int T, int E,
                                  double scale) {
  const int sequences = T > 0 ? n / T : 0;
  double sum = 0;  // Σ_q Σ_e f · (Σ_t p) / T, in this order
  for (int q = 0; q < sequences; ++q)
    for (int e = 0; e < E; ++e) {
      double mass = 0;
      for (int t = q * T; t < (q + 1) * T; ++t) mass += probs[size_t(t) * E + e];
      sum += double(fraction[size_t(q) * E + e]) * mass / T;
    }
  *loss += scale * sum;
}

void CpuKernels::moe_router_backward(float* dlogits, const float* probs, const int32_t* selected, const float* weight,
                                     const float* fraction, const float* dweight, int n, int T, int E, int K,
                                     bool norm_topk, double balance_scale) {
  if (n <= 0 || E <= 0 || T <= 0) return;
  const size_t row_work = size_t(E) * size_t(K > 0 ? K : 1);
  for_range(size_t(n) * row_work, threads_, [&](size_t e0, size_t e1) {
    std::vector<float> dp(static_cast<size_t>(E));  // d loss / d probs of one token
    for (size_t t = e0 / row_work; t < e1 / row_work; ++t) {
      const float* p = probs + t * size_t(E);         // (E)
      const int32_t* sel = selected + t * size_t(K);  // (K)
      const float* w = weight + t * size_t(K);        // (K)
      const float* dw = dweight + t * size_t(K);      // (K)
      const float* f = fraction + (t / size_t(T)) * size_t(E);  // (E): the token's sequence
      // the balance loss: d/dp_e of scale · f_e · mean_t p_e
      for (int e = 0; e < E; ++e) dp[size_t(e)] = float(balance_scale * double(f[e]) / T);
      // the combine weights: w_k = p_k / S (S = Σ_k p_k) or w_k = p_k
      if (norm_topk) {
        float picked = 0.f, dot = 0.f;
        for (int k = 0; k < K; ++k) {
          picked += p[sel[k]];
          dot += dw[k] * w[k];
        }
        for (int k = 0; k < K; ++k) dp[size_t(sel[k])] += (dw[k] - dot) / picked;
      } else {
        for (int k = 0; k < K; ++k) dp[size_t(sel[k])] += dw[k];
      }
      // the softmax: dl_e = p_e (dp_e − Σ p dp)
      float pdp = 0.f;
      for (int e = 0; e < E; ++e) pdp += p[e] * dp[size_t(e)];
      float* dl = dlogits + t * size_t(E);  // (E)
      for (int e = 0; e < E; ++e) dl[e] = p[e] * (dp[size_t(e)] - pdp);
    }
  });
}

}  // namespace piper
