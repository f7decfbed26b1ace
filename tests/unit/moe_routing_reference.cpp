// Mixture-of-experts routing written plainly in double precision (see moe_routing_reference.hpp): each token's
// experts by sorting, then each expert's kept assignments sequence by sequence.
#include "moe_routing_reference.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

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
  std::vector<double> p(static_cast<size_t>(E));
  std::vector<int> order(static_cast<size_t>(E));
  for (int t = 0; t < n; ++t) {
    const float* l = logits + size_t(t) * E;
    const double mx = *std::max_element(l, l + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += (p[size_t(e)] = std::exp(double(l[e]) - mx));
    for (int e = 0; e < E; ++e) r.probs[size_t(t) * E + e] = float(p[size_t(e)] /= sum);
    std::iota(order.begin(), order.end(), 0);
    auto score = [&](int e) { return p[size_t(e)] + (bias ? bias[e] : 0.0); };
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score(a) > score(b); });
    double picked = 0;
    for (int k = 0; k < K; ++k) picked += p[size_t(order[size_t(k)])];
    for (int k = 0; k < K; ++k) {
      r.selected[size_t(t) * K + k] = order[size_t(k)];
      r.weight[size_t(t) * K + k] = float(p[size_t(order[size_t(k)])] / (s.norm_topk ? picked : 1.0));
    }
  }
  const int sequences = T > 0 ? n / T : 0, cap = s.capacity();
  r.position.assign(size_t(n) * K, -1);
  r.fraction.assign(size_t(sequences) * E, 0.f);
  int kept = 0;
  for (int e = 0; e < E; ++e)
    for (int q = 0; q < sequences; ++q) {
      int seen = 0;
      for (size_t a = size_t(q) * T * K; a < size_t(q + 1) * T * K; ++a)
        if (r.selected[a] == e && seen++ < cap) r.position[a] = kept++;
      r.fraction[size_t(q) * E + e] = float(double(E) / (double(K) * T) * seen);
    }
  return r;
}

}  // namespace piper::moe
