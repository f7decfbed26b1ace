// Mixture-of-experts routing written plainly on the host (see moe_routing_reference.hpp), one token and one
// sequence at a time.
#include "moe_routing_reference.hpp"

#include <algorithm>
#include <cmath>

namespace piper::moe {

int RouterShape::capacity() const {
  if (capacity_factor <= 0) return seq_len * top_k;
  return int(std::ceil(capacity_factor * double(seq_len) * double(top_k) / double(experts)));
}

Routing route(const RouterShape& s, const float* logits, const float* bias) {
  const int n = s.tokens, E = s.experts, K = s.top_k, T = s.seq_len;
  Routing r;
  r.probs.resize(size_t(n) * E);
  r.selected.resize(size_t(n) * K);
  r.weight.resize(size_t(n) * K);
  r.position.assign(size_t(n) * K, -1);
  for (int t = 0; t < n; ++t) {
    const float* l = logits + int64_t(t) * E;
    float* p = r.probs.data() + int64_t(t) * E;
    float mx = l[0];
    for (int e = 1; e < E; ++e) mx = std::max(mx, l[e]);
    float sum = 0.f;
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - mx));
    for (int e = 0; e < E; ++e) p[e] /= sum;
    int32_t* sel = r.selected.data() + int64_t(t) * K;
    float* w = r.weight.data() + int64_t(t) * K;
    float picked = 0.f;
    for (int k = 0; k < K; ++k) {  // the k-th most probable expert not yet picked
      int best = -1;
      for (int e = 0; e < E; ++e) {
        if (std::find(sel, sel + k, e) != sel + k) continue;
        if (best < 0 || (bias ? p[e] + bias[e] > p[best] + bias[best] : p[e] > p[best])) best = e;
      }
      sel[k] = best;
      w[k] = p[best];
      picked += p[best];
    }
    if (s.norm_topk)
      for (int k = 0; k < K; ++k) w[k] /= picked;
  }
  // Capacity per sequence and expert: the earliest positions keep their place.
  const int cap = s.capacity();
  const int sequences = T > 0 ? n / T : 0;
  std::vector<int> used(static_cast<size_t>(E));
  std::vector<uint8_t> kept(size_t(n) * K, 0);
  r.fraction.assign(size_t(sequences) * E, 0.f);
  for (int q = 0; q < sequences; ++q) {
    std::fill(used.begin(), used.end(), 0);
    for (int t = q * T; t < (q + 1) * T; ++t)
      for (int k = 0; k < K; ++k) {
        const int e = r.selected[size_t(t) * K + k];
        r.fraction[size_t(q) * E + e] += 1.f;
        if (used[size_t(e)] < cap) {
          ++used[size_t(e)];
          kept[size_t(t) * K + k] = 1;
        }
      }
  }
  // Expert-ordered list of kept assignments.
  r.offsets.assign(size_t(E) + 1, 0);
  for (int t = 0; t < n; ++t)
    for (int k = 0; k < K; ++k)
      if (kept[size_t(t) * K + k]) ++r.offsets[size_t(r.selected[size_t(t) * K + k]) + 1];
  for (int e = 0; e < E; ++e) r.offsets[size_t(e) + 1] += r.offsets[size_t(e)];
  r.token.resize(size_t(r.offsets[size_t(E)]));
  r.token_weight.resize(r.token.size());
  std::vector<int32_t> next(r.offsets.begin(), r.offsets.end() - 1);
  for (int t = 0; t < n; ++t)
    for (int k = 0; k < K; ++k) {
      const size_t a = size_t(t) * K + k;
      if (!kept[a]) continue;
      const int32_t at = next[size_t(r.selected[a])]++;
      r.position[a] = at;
      r.token[size_t(at)] = t;
      r.token_weight[size_t(at)] = r.weight[a];
    }
  // Balance loss: Σ_e f_e · P_e per sequence, f_e = E/(K·T) · count_e, P_e = mean over the sequence of p_e.
  for (int q = 0; q < sequences; ++q)
    for (int e = 0; e < E; ++e) {
      float& f = r.fraction[size_t(q) * E + e];
      f *= float(E) / float(K * T);
      double mean_p = 0;
      for (int t = q * T; t < (q + 1) * T; ++t) mean_p += r.probs[size_t(t) * E + e];
      r.balance += double(f) * mean_p / T;
    }
  return r;
}

void router_backward(const RouterShape& s, const Routing& r, const float* dweight, double balance_scale,
                     float* dlogits) {
  const int n = s.tokens, E = s.experts, K = s.top_k, T = s.seq_len;
  std::vector<float> dp(static_cast<size_t>(E));
  for (int t = 0; t < n; ++t) {
    const float* p = r.probs.data() + int64_t(t) * E;
    const int32_t* sel = r.selected.data() + int64_t(t) * K;
    const float* w = r.weight.data() + int64_t(t) * K;
    const float* dw = dweight + int64_t(t) * K;
    // balance loss: d/dp_e of scale · f_e · mean_t p_e
    const float* f = r.fraction.data() + int64_t(t / T) * E;
    for (int e = 0; e < E; ++e) dp[size_t(e)] = float(balance_scale * double(f[e]) / T);
    // combine weights: w_k = p_k / S (S = Σ_k p_k) or w_k = p_k
    if (s.norm_topk) {
      float picked = 0.f, dot = 0.f;
      for (int k = 0; k < K; ++k) {
        picked += p[sel[k]];
        dot += dw[k] * w[k];
      }
      for (int k = 0; k < K; ++k) dp[size_t(sel[k])] += (dw[k] - dot) / picked;
    } else {
      for (int k = 0; k < K; ++k) dp[size_t(sel[k])] += dw[k];
    }
    // softmax: dl_e = p_e (dp_e − Σ p dp)
    float pdp = 0.f;
    for (int e = 0; e < E; ++e) pdp += p[e] * dp[size_t(e)];
    float* dl = dlogits + int64_t(t) * E;
    for (int e = 0; e < E; ++e) dl[e] = p[e] * (dp[size_t(e)] - pdp);
  }
}

}  // namespace piper::moe
