// Double-precision reference of a Qwen3 causal LM's loss (Hugging Face Qwen3ForCausalLM math, fp64),
// written from the definitions, independently of the kernels: RMSNorm, RoPE (rotate-half), GQA, SwiGLU.
#pragma once
#include <cmath>
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

struct Qwen3RefDims {
  int B, T, C, H, KV, D, F, V, L;
  double eps, theta;
  bool qk_norm;
};

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
    const auto &wg = P[at++], &wu = P[at++], &wd = P[at++];
    auto h2 = rmsnorm_ref(x, w_post, n, d.C, d.eps);
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
  return xent_ref(logits, targets, n, d.V) / n;
}

}  // namespace piper::test
