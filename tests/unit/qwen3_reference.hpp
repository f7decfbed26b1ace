// Double-precision reference of a Qwen3 causal LM's loss (Hugging Face Qwen3ForCausalLM math, fp64),
// written from the definitions, independently of the kernels: RMSNorm, RoPE (rotate-half), GQA, SwiGLU.
#pragma once
#include <cmath>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "test_util.hpp"

namespace piper::test {

// y(N,C) = x / sqrt(mean x² + eps) * w
template <typename TX>
std::vector<double> rmsnorm_ref(const std::vector<TX>& x, const std::vector<float>& w, int N, int C, double eps) {
  std::vector<double> y(size_t(N) * C);
  for (int r = 0; r < N; ++r) {
    double ms = 0;
    for (int c = 0; c < C; ++c) ms += double(x[size_t(r) * C + c]) * double(x[size_t(r) * C + c]);
    double inv = 1.0 / std::sqrt(ms / C + eps);
    for (int c = 0; c < C; ++c) y[size_t(r) * C + c] = double(x[size_t(r) * C + c]) * inv * double(w[size_t(c)]);
  }
  return y;
}

// In place on x(B,T,H,D): (x_i, x_{i+D/2}) rotated by t / theta^(2i/D).
inline void rope_ref(std::vector<double>& x, int B, int T, int H, int D, double theta) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        double* v = x.data() + ((size_t(b) * T + t) * H + h) * D;
        for (int i = 0; i < D / 2; ++i) {
          double a = t / std::pow(theta, 2.0 * i / D);
          double x1 = v[i], x2 = v[i + D / 2];
          v[i] = x1 * std::cos(a) - x2 * std::sin(a);
          v[i + D / 2] = x2 * std::cos(a) + x1 * std::sin(a);
        }
      }
}

// Causal GQA: q(B,T,H,D), k,v(B,T,KV,D) → y(B,T,H,D), scale D^-1/2.
inline std::vector<double> gqa_attention_ref(const std::vector<double>& q, const std::vector<double>& k,
                                             const std::vector<double>& v, int B, int T, int H, int KV, int D) {
  std::vector<double> y(size_t(B) * T * H * D, 0.0);
  const double scale = 1.0 / std::sqrt(double(D));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const int g = h / (H / KV);
      for (int i = 0; i < T; ++i) {
        const double* qi = q.data() + ((size_t(b) * T + i) * H + h) * D;
        std::vector<double> s(size_t(i) + 1);
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          const double* kj = k.data() + ((size_t(b) * T + j) * KV + g) * D;
          double d = 0;
          for (int e = 0; e < D; ++e) d += qi[e] * kj[e];
          s[size_t(j)] = d * scale;
          mx = std::max(mx, s[size_t(j)]);
        }
        double sum = 0;
        for (auto& e : s) sum += (e = std::exp(e - mx));
        double* yi = y.data() + ((size_t(b) * T + i) * H + h) * D;
        for (int j = 0; j <= i; ++j) {
          const double* vj = v.data() + ((size_t(b) * T + j) * KV + g) * D;
          for (int e = 0; e < D; ++e) yi[e] += s[size_t(j)] / sum * vj[e];
        }
      }
    }
  return y;
}

struct MoeRefDims {
  int experts = 0, top_k = 2, d_expert = 0, every = 1;
  bool norm_topk = true;
  double aux_coef = 0, capacity_factor = 0;
  int shared = 0;  // the shared experts' summed width (0: none)
};

struct Qwen3RefDims {
  int B, T, C, H, KV, D, F, V, L;
  double eps, theta;
  bool qk_norm;
  MoeRefDims moe;
};

// Mixture of experts on the normed input h(n,C): softmax router, top-k (ties: lower index), weights
// renormalized over the k, per-sequence capacity (earlier positions first), SwiGLU experts; adds the
// sequence-wise balance loss Σ_seq Σ_e f_e · P_e to *balance. Experts' parameters: gate, up, down each.
inline std::vector<double> moe_ref(const std::vector<double>& h, const std::vector<float>& router,
                                   const std::vector<const std::vector<float>*>& experts, const Qwen3RefDims& d,
                                   double* balance) {
  const int n = d.B * d.T, E = d.moe.experts, K = d.moe.top_k, DE = d.moe.d_expert, C = d.C;
  const float* no_bias = nullptr;
  auto logits = linear_ref(h, router, no_bias, n, C, E);
  const int cap = d.moe.capacity_factor > 0 ? int(std::ceil(d.moe.capacity_factor * d.T * K / E)) : d.T * K;
  std::vector<double> out(size_t(n) * C, 0.0);
  for (int q = 0; q < d.B; ++q) {
    std::vector<int> used(size_t(E), 0), routed(size_t(E), 0);
    std::vector<double> mean_p(size_t(E), 0.0);
    for (int t = q * d.T; t < (q + 1) * d.T; ++t) {
      std::vector<double> p(static_cast<size_t>(E));
      double mx = -1e300, z = 0;
      for (int e = 0; e < E; ++e) mx = std::max(mx, logits[size_t(t) * E + e]);
      for (int e = 0; e < E; ++e) z += (p[size_t(e)] = std::exp(logits[size_t(t) * E + e] - mx));
      for (auto& v : p) v /= z;
      for (int e = 0; e < E; ++e) mean_p[size_t(e)] += p[size_t(e)] / d.T;
      std::vector<int> sel;
      double picked = 0;
      for (int k = 0; k < K; ++k) {
        int best = -1;
        for (int e = 0; e < E; ++e)
          if (std::find(sel.begin(), sel.end(), e) == sel.end() && (best < 0 || p[size_t(e)] > p[size_t(best)])) best = e;
        sel.push_back(best);
        picked += p[size_t(best)];
      }
      std::vector<double> x(h.begin() + long(t) * C, h.begin() + long(t + 1) * C);
      for (int k = 0; k < K; ++k) {
        const int e = sel[size_t(k)];
        ++routed[size_t(e)];
        if (used[size_t(e)] >= cap) continue;  // over capacity: dropped
        ++used[size_t(e)];
        const double w = d.moe.norm_topk ? p[size_t(e)] / picked : p[size_t(e)];
        auto g = linear_ref(x, *experts[size_t(3 * e)], no_bias, 1, C, DE);
        auto u = linear_ref(x, *experts[size_t(3 * e + 1)], no_bias, 1, C, DE);
        for (int j = 0; j < DE; ++j) g[size_t(j)] = g[size_t(j)] / (1.0 + std::exp(-g[size_t(j)])) * u[size_t(j)];
        auto y = linear_ref(g, *experts[size_t(3 * e + 2)], no_bias, 1, DE, C);
        for (int c = 0; c < C; ++c) out[size_t(t) * C + c] += w * y[size_t(c)];
      }
    }
    for (int e = 0; e < E; ++e) *balance += double(E) / (K * d.T) * routed[size_t(e)] * mean_p[size_t(e)];
  }
  return out;
}

// Parameters in the order the model lists them (embed; per layer input norm, q, k, v, o, [q_norm, k_norm],
// post norm, gate, up, down; final norm; lm_head unless tied). Returns the mean token cross-entropy.
inline double qwen3_loss_ref(const Qwen3RefDims& d, const std::vector<std::vector<float>>& P, bool tied,
                             const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets) {
  const int n = d.B * d.T, QD = d.H * d.D, KD = d.KV * d.D;
  size_t at = 0;
  const std::vector<float>& embed = P[at++];
  std::vector<double> x(size_t(n) * d.C);
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < d.C; ++c) x[size_t(r) * d.C + c] = embed[size_t(tokens[size_t(r)]) * d.C + c];
  const float* no_bias = nullptr;
  double balance = 0;  // Σ over MoE layers and sequences of Σ_e f_e · P_e
  for (int l = 0; l < d.L; ++l) {
    const auto& w_in = P[at++];
    const auto &wq = P[at++], &wk = P[at++], &wv = P[at++], &wo = P[at++];
    auto h = rmsnorm_ref(x, w_in, n, d.C, d.eps);
    auto q = linear_ref(h, wq, no_bias, n, d.C, QD);
    auto k = linear_ref(h, wk, no_bias, n, d.C, KD);
    auto v = linear_ref(h, wv, no_bias, n, d.C, KD);
    if (d.qk_norm) {
      q = rmsnorm_ref(q, P[at++], n * d.H, d.D, d.eps);
      k = rmsnorm_ref(k, P[at++], n * d.KV, d.D, d.eps);
    }
    rope_ref(q, d.B, d.T, d.H, d.D, d.theta);
    rope_ref(k, d.B, d.T, d.KV, d.D, d.theta);
    auto y = gqa_attention_ref(q, k, v, d.B, d.T, d.H, d.KV, d.D);
    auto o = linear_ref(y, wo, no_bias, n, QD, d.C);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    const auto& w_post = P[at++];
    auto h2 = rmsnorm_ref(x, w_post, n, d.C, d.eps);
    if (d.moe.experts > 0 && (l + 1) % d.moe.every == 0) {
      const auto& router = P[at++];
      std::vector<const std::vector<float>*> experts;
      for (int i = 0; i < 3 * d.moe.experts; ++i) experts.push_back(&P[at++]);
      auto m = moe_ref(h2, router, experts, d, &balance);
      for (size_t i = 0; i < x.size(); ++i) x[i] += m[i];
      if (d.moe.shared > 0) {  // shared experts: one SwiGLU of their summed width on the same normed input
        const auto &sg = P[at++], &su = P[at++], &sd = P[at++];
        auto g = linear_ref(h2, sg, no_bias, n, d.C, d.moe.shared);
        auto u = linear_ref(h2, su, no_bias, n, d.C, d.moe.shared);
        for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
        auto y = linear_ref(g, sd, no_bias, n, d.moe.shared, d.C);
        for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
      }
      continue;
    }
    const auto &wg = P[at++], &wu = P[at++], &wd = P[at++];
    auto g = linear_ref(h2, wg, no_bias, n, d.C, d.F);
    auto u = linear_ref(h2, wu, no_bias, n, d.C, d.F);
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    auto m = linear_ref(g, wd, no_bias, n, d.F, d.C);
    for (size_t i = 0; i < x.size(); ++i) x[i] += m[i];
  }
  const auto& w_norm = P[at++];
  const auto& lm_head = tied ? embed : P[at++];
  auto hf = rmsnorm_ref(x, w_norm, n, d.C, d.eps);
  auto logits = linear_ref(hf, lm_head, no_bias, n, d.C, d.V);
  return xent_ref(logits, targets, n, d.V) / n + d.moe.aux_coef * balance / d.B;
}

}  // namespace piper::test
