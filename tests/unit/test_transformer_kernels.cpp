// Tests of the Llama-style (Qwen3) CPU primitives: RMSNorm, rotary embedding, grouped-query attention, SwiGLU
// and token embedding, each forward against a double-precision reference and each backward against central
// finite differences of L = Σ w_out·y (or a double reference backward), with 1 and 2 threads.
#include <catch2/catch.hpp>

#include "backend/cpu/cpu_kernels.hpp"
#include "test_util.hpp"

using namespace piper;
using namespace piper::test;

namespace {

// The finite-difference settings of test_kernels.cpp: step 1e-2 on inputs of scale ~1, error measured as
// max |analytic − numeric| / max(|numeric|, 1e-2).
constexpr double kEps = 1e-2;
constexpr double kFloor = 1e-2;
constexpr double kGradTol = 1e-2;
// Attention's fp32 forward rounds differently at x ± eps across all the rows a key reaches: a step of 2e-2
// halves that noise against 1e-2 (worst error 3.5e-3 instead of 5.7e-3) while truncation stays below it.
constexpr double kAttnEps = 2e-2;

// ---- double references ----

// y(N,C) = x / sqrt(mean x² + eps) * w; rstd(N)
std::vector<double> rmsnorm_ref(const std::vector<float>& x, const std::vector<float>& w, int N, int C, double eps,
                                std::vector<double>* rstd = nullptr) {
  std::vector<double> y(size_t(N) * C);
  if (rstd) rstd->assign(size_t(N), 0.0);
  for (int r = 0; r < N; ++r) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += double(x[size_t(r) * C + c]) * double(x[size_t(r) * C + c]);
    const double rs = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c) y[size_t(r) * C + c] = double(x[size_t(r) * C + c]) * rs * double(w[size_t(c)]);
    if (rstd) (*rstd)[size_t(r)] = rs;
  }
  return y;
}

// Rotate-half RoPE on x(B,T,H,D) as Hugging Face computes it: inv_freq = 1 / theta^(2i/D) and the angle
// t · inv_freq are float values (torch builds them in fp32); cos, sin and the rotation are taken in double.
std::vector<double> rope_ref(const std::vector<float>& x, int B, int T, int H, int D, float theta, bool inverse) {
  const int half = D / 2;
  std::vector<double> y(x.size());
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        const size_t row = ((size_t(b) * T + t) * H + h) * D;
        for (int i = 0; i < half; ++i) {
          const float exponent = float(2 * i) / float(D);
          const float inv_freq = 1.0f / float(std::pow(double(theta), double(exponent)));
          const float angle = float(t) * inv_freq;
          const double c = std::cos(double(angle)), s = (inverse ? -1.0 : 1.0) * std::sin(double(angle));
          const double x1 = x[row + i], x2 = x[row + i + half];
          y[row + i] = x1 * c - x2 * s;
          y[row + i + half] = x2 * c + x1 * s;
        }
      }
  return y;
}

struct GqaShape {
  int B, T, H, KV, D;
};

std::string describe(const GqaShape& s) {
  std::ostringstream os;
  os << "B " << s.B << " T " << s.T << " H " << s.H << " KV " << s.KV << " D " << s.D;
  return os.str();
}

// Probabilities of query row i of (b, h): p(j) for j ≤ i, from scores q_i·k_j / sqrt(D); lse of the row.
std::vector<double> gqa_probs(const std::vector<float>& q, const std::vector<float>& k, const GqaShape& s, int b,
                              int h, int i, double* lse) {
  const int kvh = h / (s.H / s.KV);
  std::vector<double> p(size_t(i) + 1);
  double mx = -1e300;
  for (int j = 0; j <= i; ++j) {
    double d = 0;
    for (int c = 0; c < s.D; ++c)
      d += double(q[((size_t(b) * s.T + i) * s.H + h) * s.D + c]) *
           double(k[((size_t(b) * s.T + j) * s.KV + kvh) * s.D + c]);
    p[size_t(j)] = d / std::sqrt(double(s.D));
    mx = std::max(mx, p[size_t(j)]);
  }
  double z = 0;
  for (auto& e : p) z += (e = std::exp(e - mx));
  for (auto& e : p) e /= z;
  if (lse) *lse = mx + std::log(z);
  return p;
}

// y(B,T,H,D) of causal grouped-query attention; lse(B,H,T)
std::vector<double> gqa_ref(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                            const GqaShape& s, std::vector<double>* lse = nullptr) {
  std::vector<double> y(size_t(s.B) * s.T * s.H * s.D, 0.0);
  if (lse) lse->assign(size_t(s.B) * s.H * s.T, 0.0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h) {
      const int kvh = h / (s.H / s.KV);
      for (int i = 0; i < s.T; ++i) {
        double l = 0;
        auto p = gqa_probs(q, k, s, b, h, i, &l);
        if (lse) (*lse)[(size_t(b) * s.H + h) * s.T + i] = l;
        for (int j = 0; j <= i; ++j)
          for (int c = 0; c < s.D; ++c)
            y[((size_t(b) * s.T + i) * s.H + h) * s.D + c] +=
                p[size_t(j)] * double(v[((size_t(b) * s.T + j) * s.KV + kvh) * s.D + c]);
      }
    }
  return y;
}

// Textbook backward of gqa_ref given dy: dP = dy·v, dS = P (dP − Σ P dP), dq = dS k / sqrt(D),
// dk = Σ over the group's heads of dS^T q / sqrt(D), dv = Σ over the group's heads of P^T dy.
void gqa_backward_ref(const std::vector<float>& dy, const std::vector<float>& q, const std::vector<float>& k,
                      const std::vector<float>& v, const GqaShape& s, std::vector<double>& dq,
                      std::vector<double>& dk, std::vector<double>& dv) {
  dq.assign(q.size(), 0.0);
  dk.assign(k.size(), 0.0);
  dv.assign(v.size(), 0.0);
  const double scale = 1.0 / std::sqrt(double(s.D));
  auto qi = [&](int b, int t, int h) { return ((size_t(b) * s.T + t) * s.H + h) * s.D; };
  auto ki = [&](int b, int t, int h) { return ((size_t(b) * s.T + t) * s.KV + h) * s.D; };
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h) {
      const int kvh = h / (s.H / s.KV);
      for (int i = 0; i < s.T; ++i) {
        auto p = gqa_probs(q, k, s, b, h, i, nullptr);
        std::vector<double> dp(p.size());
        double dot = 0;
        for (int j = 0; j <= i; ++j) {
          double d = 0;
          for (int c = 0; c < s.D; ++c) d += double(dy[qi(b, i, h) + c]) * double(v[ki(b, j, kvh) + c]);
          dp[size_t(j)] = d;
          dot += p[size_t(j)] * d;
        }
        for (int j = 0; j <= i; ++j) {
          const double ds = p[size_t(j)] * (dp[size_t(j)] - dot);
          for (int c = 0; c < s.D; ++c) {
            dq[qi(b, i, h) + c] += ds * double(k[ki(b, j, kvh) + c]) * scale;
            dk[ki(b, j, kvh) + c] += ds * double(q[qi(b, i, h) + c]) * scale;
            dv[ki(b, j, kvh) + c] += p[size_t(j)] * double(dy[qi(b, i, h) + c]);
          }
        }
      }
    }
}

double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }
double silu_grad_ref(double x) {
  const double s = 1.0 / (1.0 + std::exp(-x));
  return s * (1.0 + x * (1.0 - s));
}

}  // namespace

TEST_CASE("rmsnorm_forward matches a double reference, rstd included", "[kernels]") {
  struct Shape { int N, C; };
  for (Shape s : {Shape{5, 16}, Shape{701, 48}}) {  // the second is split across threads (N·C ≥ 32768)
    for (float eps : {1e-6f, 1e-2f}) {
      for (int threads : {1, 2}) {
        INFO("N " << s.N << " C " << s.C << " eps " << eps << " threads " << threads);
        CpuKernels k(threads);
        Rand rng(201);
        const int N = s.N, C = s.C;
        auto x = rng.normal(size_t(N) * C, 2.0, 0.5), w = rng.normal(size_t(C), 0.3, 1.0);
        std::vector<double> rstd_ref;
        auto y_ref = rmsnorm_ref(x, w, N, C, eps, &rstd_ref);
        std::vector<float> y(size_t(N) * C, 3.f), rstd(size_t(N), 3.f);
        k.rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, eps);
        CHECK_CLOSE(y, y_ref, 1e-6, 1e-6, "rmsnorm y");
        CHECK_CLOSE(rstd, rstd_ref, 0.0, 1e-6, "rmsnorm rstd");
      }
    }
  }
}

TEST_CASE("rmsnorm backward matches finite differences, accumulate adds and overwrite replaces", "[kernels]") {
  const float eps = 1e-5f;
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    CpuKernels k(threads);
    Rand rng(211);
    const int N = 4, C = 12;
    auto x = rng.normal(N * C, 1.0, 0.3), w = rng.normal(C, 0.3, 1.0), wout = rng.normal(N * C);
    std::vector<float> y(N * C), rstd(N);
    auto L = [&] {
      k.rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, eps);
      return dot(wout, y.data(), y.size());
    };
    auto num_x = numeric_grad(x, kEps, L), num_w = numeric_grad(w, kEps, L);
    L();  // rstd of the unperturbed input

    std::vector<float> dx(N * C, 1e3f), dw(C, -4.f);
    k.rmsnorm_backward_input(dx.data(), wout.data(), x.data(), rstd.data(), w.data(), N, C, false);
    k.rmsnorm_backward_weight(dw.data(), wout.data(), x.data(), rstd.data(), N, C, false);
    size_t worst = 0;
    double err_x = grad_error(dx, num_x, kFloor, {}, &worst);
    INFO("dx worst element " << worst << ": analytic " << dx[worst] << " numeric " << num_x[worst]);
    CHECK(err_x < kGradTol);
    CHECK(grad_error(dw, num_w, kFloor) < kGradTol);

    auto prev_x = rng.normal(N * C), prev_w = rng.normal(C);
    std::vector<float> ax = prev_x, aw = prev_w;
    k.rmsnorm_backward_input(ax.data(), wout.data(), x.data(), rstd.data(), w.data(), N, C, true);
    k.rmsnorm_backward_weight(aw.data(), wout.data(), x.data(), rstd.data(), N, C, true);
    CHECK(grad_error(minus(ax, prev_x), num_x, kFloor) < kGradTol);
    CHECK(grad_error(minus(aw, prev_w), num_w, kFloor) < kGradTol);
    CHECK_CLOSE(ax, plus(prev_x, dx), 1e-5, 1e-6, "dx accumulated = previous + overwritten");
    CHECK_CLOSE(aw, plus(prev_w, dw), 1e-5, 1e-6, "dw accumulated = previous + overwritten");
  }
}

TEST_CASE("rmsnorm backward matches a double reference on rows split across threads", "[kernels]") {
  const int N = 701, C = 48;  // N·C ≥ 32768: rows and columns are split across threads
  Rand rng(221);
  auto x = rng.normal(size_t(N) * C, 1.5, 0.2), w = rng.normal(size_t(C), 0.3, 1.0), dy = rng.normal(size_t(N) * C);
  std::vector<double> rs;
  rmsnorm_ref(x, w, N, C, 1e-6, &rs);
  // dx_i = rs (dy_i w_i − x_i rs² Σ_j dy_j w_j x_j / C); dw_c = Σ_r dy x rs
  std::vector<double> dx_ref(x.size()), dw_ref(size_t(C), 0.0);
  for (int r = 0; r < N; ++r) {
    double d = 0;
    for (int c = 0; c < C; ++c) d += double(dy[size_t(r) * C + c]) * w[size_t(c)] * x[size_t(r) * C + c];
    const double s = rs[size_t(r)];
    for (int c = 0; c < C; ++c) {
      const size_t e = size_t(r) * C + c;
      dx_ref[e] = s * (double(dy[e]) * w[size_t(c)] - double(x[e]) * s * s * d / C);
      dw_ref[size_t(c)] += double(dy[e]) * x[e] * s;
    }
  }
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    CpuKernels k(threads);
    std::vector<float> y(x.size()), rstd(x.size() / C), dx(x.size(), 5.f), dw(size_t(C), 5.f);
    k.rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
    k.rmsnorm_backward_input(dx.data(), dy.data(), x.data(), rstd.data(), w.data(), N, C, false);
    k.rmsnorm_backward_weight(dw.data(), dy.data(), x.data(), rstd.data(), N, C, false);
    CHECK_CLOSE(dx, dx_ref, 1e-6, 1e-6, "rmsnorm dx");
    CHECK_CLOSE(dw, dw_ref, 1e-4, 1e-5, "rmsnorm dw");
  }
}

TEST_CASE("rope matches a double reference of the rotate-half convention, the inverse undoes it and is its transpose",
          "[kernels]") {
  struct Shape { int B, T, H, D; float theta; };
  // The last shape is split across threads (B·T·H·D ≥ 32768) and reaches angles of ~2000 radians.
  for (Shape s : {Shape{2, 37, 3, 16, 10000.f}, Shape{1, 9, 2, 8, 1e6f}, Shape{1, 2048, 2, 64, 1e6f}}) {
    const int B = s.B, T = s.T, H = s.H, D = s.D;
    Rand rng(231);
    auto x = rng.normal(size_t(B) * T * H * D);
    auto fwd_ref = rope_ref(x, B, T, H, D, s.theta, false), inv_ref = rope_ref(x, B, T, H, D, s.theta, true);
    for (int threads : {1, 2}) {
      INFO("B " << B << " T " << T << " H " << H << " D " << D << " theta " << s.theta << " threads " << threads);
      CpuKernels k(threads);
      std::vector<float> y = x;
      k.rope(y.data(), B, T, H, D, s.theta, false);
      CHECK_CLOSE(y, fwd_ref, 1e-6, 1e-6, "rope forward");
      // position 0 is not rotated at all
      bool same = true;
      for (int b = 0; b < B; ++b)
        for (size_t e = 0; e < size_t(H) * D; ++e) {
          const size_t at = size_t(b) * T * H * D + e;  // (b, t = 0, h, i)
          same = same && y[at] == x[at];
        }
      CHECK(same);
      std::vector<float> z = x;
      k.rope(z.data(), B, T, H, D, s.theta, true);
      CHECK_CLOSE(z, inv_ref, 1e-6, 1e-6, "rope inverse");
      k.rope(y.data(), B, T, H, D, s.theta, true);  // inverse(forward(x)) = x
      CHECK_CLOSE(y, x, 1e-6, 1e-6, "inverse undoes forward");
    }
  }
  // rope is linear, so its gradient is its transpose: d/dx Σ w·rope(x) = rope_inverse(w).
  const int B = 1, T = 6, H = 2, D = 8;
  const float theta = 10000.f;
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    CpuKernels k(threads);
    Rand rng(232);
    auto x = rng.normal(size_t(B) * T * H * D), wout = rng.normal(x.size());
    auto L = [&] {
      std::vector<float> y = x;
      k.rope(y.data(), B, T, H, D, theta, false);
      return dot(wout, y.data(), y.size());
    };
    auto num = numeric_grad(x, kEps, L);
    std::vector<float> g = wout;
    k.rope(g.data(), B, T, H, D, theta, true);
    CHECK(grad_error(g, num, kFloor) < 1e-3);
  }
}

TEST_CASE("swiglu forward matches a double reference and backward matches the analytic and numeric derivative",
          "[kernels]") {
  for (size_t n : {size_t(601), size_t(40000)}) {  // the second is split across threads
    for (int threads : {1, 2}) {
      INFO("n " << n << " threads " << threads);
      CpuKernels k(threads);
      Rand rng(241);
      // gates on a grid over [-30, 30] (both tails of the sigmoid), up and da random
      std::vector<float> g(n);
      for (size_t i = 0; i < n; ++i) g[i] = float(-30.0 + 60.0 * double(i) / double(n - 1));
      auto u = rng.normal(n), da = rng.normal(n);
      std::vector<double> a_ref(n), dg_ref(n), du_ref(n);
      for (size_t i = 0; i < n; ++i) {
        a_ref[i] = silu_ref(g[i]) * u[i];
        dg_ref[i] = double(da[i]) * u[i] * silu_grad_ref(g[i]);
        du_ref[i] = double(da[i]) * silu_ref(g[i]);
      }
      std::vector<float> a(n, 7.f), dg(n, 7.f), du(n, 7.f);
      k.swiglu_forward(a.data(), g.data(), u.data(), n);
      k.swiglu_backward(dg.data(), du.data(), da.data(), g.data(), u.data(), n);
      CHECK_CLOSE(a, a_ref, 1e-6, 2e-6, "swiglu a");
      CHECK_CLOSE(dg, dg_ref, 1e-6, 2e-6, "swiglu dg");
      CHECK_CLOSE(du, du_ref, 1e-6, 2e-6, "swiglu du");
    }
  }
  for (int threads : {1, 2}) {
    INFO("finite differences, threads " << threads);
    CpuKernels k(threads);
    Rand rng(242);
    const size_t n = 64;
    auto g = rng.normal(n, 2.0), u = rng.normal(n), wout = rng.normal(n);
    auto L = [&] {
      std::vector<float> a(n);
      k.swiglu_forward(a.data(), g.data(), u.data(), n);
      return dot(wout, a.data(), n);
    };
    auto num_g = numeric_grad(g, kEps, L), num_u = numeric_grad(u, kEps, L);
    std::vector<float> dg(n), du(n);
    k.swiglu_backward(dg.data(), du.data(), wout.data(), g.data(), u.data(), n);
    CHECK(grad_error(dg, num_g, kFloor) < kGradTol);
    CHECK(grad_error(du, num_u, kFloor) < kGradTol);
  }
}

TEST_CASE("token embedding forward gathers rows, its backward scatter-adds repeated tokens, accumulate or overwrite",
          "[kernels]") {
  const int N = 12, C = 8, V = 5;
  // Repeats; token 4 never occurs, so its gradient row is zero after an overwrite.
  const std::vector<int32_t> tok = {0, 1, 1, 3, 0, 2, 3, 3, 1, 0, 2, 1};
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    CpuKernels k(threads);
    Rand rng(251);
    auto w = rng.normal(size_t(V) * C), dx = rng.normal(size_t(N) * C);
    std::vector<float> x(size_t(N) * C, 9.f);
    k.token_embedding_forward(x.data(), tok.data(), w.data(), N, C);
    bool ok = true;
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < C; ++c) ok = ok && x[size_t(r) * C + c] == w[size_t(tok[size_t(r)]) * C + c];
    CHECK(ok);

    auto L = [&] {
      k.token_embedding_forward(x.data(), tok.data(), w.data(), N, C);
      return dot(dx, x.data(), x.size());
    };
    auto num = numeric_grad(w, kEps, L);
    std::vector<double> ref(w.size(), 0.0);
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < C; ++c) ref[size_t(tok[size_t(r)]) * C + c] += dx[size_t(r) * C + c];
    auto prev = rng.normal(w.size());
    for (bool acc : {false, true}) {
      INFO("accumulate " << acc);
      std::vector<float> dw = prev;
      k.token_embedding_backward(dw.data(), dx.data(), tok.data(), N, C, V, acc);
      std::vector<double> g(dw.begin(), dw.end());
      if (acc)
        for (size_t i = 0; i < g.size(); ++i) g[i] -= prev[i];
      CHECK(grad_error(g, num, kFloor) < kGradTol);
      CHECK_CLOSE(g, ref, 1e-6, 1e-6, "scatter-add");
      for (int c = 0; c < C; ++c) CHECK(dw[size_t(4) * C + c] == (acc ? prev[size_t(4) * C + c] : 0.f));
    }
  }
  // Sizes split across threads
  const int N2 = 1024, C2 = 40, V2 = 50;
  Rand rng(252);
  auto tok2 = rng.ints(size_t(N2), 0, V2);
  auto w2 = rng.normal(size_t(V2) * C2), dx2 = rng.normal(size_t(N2) * C2);
  std::vector<double> ref2(w2.size(), 0.0);
  for (int r = 0; r < N2; ++r)
    for (int c = 0; c < C2; ++c) ref2[size_t(tok2[size_t(r)]) * C2 + c] += dx2[size_t(r) * C2 + c];
  for (int threads : {1, 2}) {
    INFO("large, threads " << threads);
    CpuKernels k(threads);
    std::vector<float> x(size_t(N2) * C2), dw(w2.size(), 3.f);
    k.token_embedding_forward(x.data(), tok2.data(), w2.data(), N2, C2);
    bool ok = true;
    for (int r = 0; r < N2; ++r)
      ok = ok && std::memcmp(&x[size_t(r) * C2], &w2[size_t(tok2[size_t(r)]) * C2], sizeof(float) * C2) == 0;
    CHECK(ok);
    k.token_embedding_backward(dw.data(), dx2.data(), tok2.data(), N2, C2, V2, false);
    CHECK_CLOSE(dw, ref2, 1e-5, 1e-5, "scatter-add, large");
  }
}

TEST_CASE("gqa_attention_forward matches a double reference of causal grouped-query attention", "[kernels]") {
  // T = 70 and 130 cover several 64-row query blocks with a partial last one; KV = H/2, KV = H and KV = 1.
  for (GqaShape s : {GqaShape{2, 70, 4, 2, 16}, GqaShape{1, 130, 2, 2, 8}, GqaShape{2, 70, 3, 1, 8},
                     GqaShape{1, 64, 4, 1, 8}, GqaShape{2, 5, 2, 1, 4}, GqaShape{1, 1, 2, 2, 4}}) {
    Rand rng(261);
    const size_t nq = size_t(s.B) * s.T * s.H * s.D, nk = size_t(s.B) * s.T * s.KV * s.D;
    auto q = rng.normal(nq), k = rng.normal(nk), v = rng.normal(nk);
    std::vector<double> lse_ref;
    auto y_ref = gqa_ref(q, k, v, s, &lse_ref);
    for (int threads : {1, 2}) {
      INFO(describe(s) << " threads " << threads);
      CpuKernels kern(threads);
      std::vector<float> y(nq, 5.f), lse(size_t(s.B) * s.H * s.T, 5.f);  // junk must be replaced
      kern.gqa_attention_forward(y.data(), lse.data(), q.data(), k.data(), v.data(), s.B, s.T, s.H, s.KV, s.D);
      CHECK_CLOSE(y, y_ref, 3e-6, 3e-6, "gqa y");
      CHECK_CLOSE(lse, lse_ref, 3e-6, 1e-6, "gqa lse");
    }
  }
}

TEST_CASE("gqa attention with one key/value head per query head equals attention_forward", "[kernels]") {
  const int B = 2, T = 70, H = 4, D = 8, C = H * D;
  Rand rng(262);
  auto qkv = rng.normal(size_t(B) * T * 3 * C);
  std::vector<float> q(size_t(B) * T * C), k(q.size()), v(q.size());
  for (size_t r = 0; r < size_t(B) * T; ++r)
    for (int c = 0; c < C; ++c) {
      q[r * C + c] = qkv[r * 3 * C + c];
      k[r * C + c] = qkv[r * 3 * C + C + c];
      v[r * C + c] = qkv[r * 3 * C + 2 * C + c];
    }
  CpuKernels kern(2);
  std::vector<float> y(q.size()), lse(size_t(B) * H * T), y_mha(q.size()), att(size_t(B) * H * T * T);
  kern.gqa_attention_forward(y.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, H, D);
  kern.attention_forward(y_mha.data(), att.data(), qkv.data(), B, T, C, H);
  CHECK_CLOSE(y, y_mha, 1e-6, 1e-5, "gqa (KV = H) against attention_forward");
}

TEST_CASE("gqa_attention_backward matches finite differences and writes (does not accumulate) dq, dk, dv",
          "[kernels]") {
  const GqaShape s{1, 70, 4, 2, 8};  // two query blocks, two query heads per key/value head
  const size_t nq = size_t(s.B) * s.T * s.H * s.D, nk = size_t(s.B) * s.T * s.KV * s.D;
  for (int threads : {1, 2}) {
    INFO(describe(s) << " threads " << threads);
    CpuKernels kern(threads);
    Rand rng(271);
    auto q = rng.normal(nq), k = rng.normal(nk), v = rng.normal(nk), wout = rng.normal(nq);
    std::vector<float> y(nq), lse(size_t(s.B) * s.H * s.T);
    auto L = [&] {
      kern.gqa_attention_forward(y.data(), lse.data(), q.data(), k.data(), v.data(), s.B, s.T, s.H, s.KV, s.D);
      return dot(wout, y.data(), y.size());
    };
    auto num_q = numeric_grad(q, kAttnEps, L), num_k = numeric_grad(k, kAttnEps, L),
         num_v = numeric_grad(v, kAttnEps, L);
    L();
    Guarded scratch(kern.gqa_attention_scratch_floats(s.B, s.T, s.H, s.KV, s.D) * sizeof(float));
    std::vector<float> dq(nq, 1e3f), dk(nk, -1e3f), dv(nk, 1e3f);
    kern.gqa_attention_backward(dq.data(), dk.data(), dv.data(), wout.data(), q.data(), k.data(), v.data(), y.data(),
                                lse.data(), scratch.data(), s.B, s.T, s.H, s.KV, s.D);
    size_t wq = 0, wk = 0, wv = 0;
    double eq = grad_error(dq, num_q, kFloor, {}, &wq), ek = grad_error(dk, num_k, kFloor, {}, &wk),
           ev = grad_error(dv, num_v, kFloor, {}, &wv);
    INFO("dq error " << eq << " at " << wq << ": analytic " << dq[wq] << " numeric " << num_q[wq]);
    INFO("dk error " << ek << " at " << wk << ": analytic " << dk[wk] << " numeric " << num_k[wk]);
    INFO("dv error " << ev << " at " << wv << ": analytic " << dv[wv] << " numeric " << num_v[wv]);
    CHECK(eq < kGradTol);
    CHECK(ek < kGradTol);
    CHECK(ev < kGradTol);
    CHECK(scratch.intact());
  }
}

TEST_CASE("gqa_attention_backward matches a double reference backward for grouped, multi-head and single-KV shapes",
          "[kernels]") {
  for (GqaShape s : {GqaShape{2, 130, 4, 2, 16}, GqaShape{1, 70, 3, 3, 8}, GqaShape{2, 70, 4, 1, 8},
                     GqaShape{1, 130, 2, 1, 8}, GqaShape{2, 5, 2, 2, 4}, GqaShape{1, 1, 2, 1, 4}}) {
    Rand rng(281);
    const size_t nq = size_t(s.B) * s.T * s.H * s.D, nk = size_t(s.B) * s.T * s.KV * s.D;
    auto q = rng.normal(nq), k = rng.normal(nk), v = rng.normal(nk), dy = rng.normal(nq);
    std::vector<double> dq_ref, dk_ref, dv_ref;
    gqa_backward_ref(dy, q, k, v, s, dq_ref, dk_ref, dv_ref);
    for (int threads : {1, 2}) {
      INFO(describe(s) << " threads " << threads);
      CpuKernels kern(threads);
      std::vector<float> y(nq), lse(size_t(s.B) * s.H * s.T);
      kern.gqa_attention_forward(y.data(), lse.data(), q.data(), k.data(), v.data(), s.B, s.T, s.H, s.KV, s.D);
      Guarded scratch(kern.gqa_attention_scratch_floats(s.B, s.T, s.H, s.KV, s.D) * sizeof(float));
      std::vector<float> dq(nq, 1e3f), dk(nk, -1e3f), dv(nk, 1e3f);
      kern.gqa_attention_backward(dq.data(), dk.data(), dv.data(), dy.data(), q.data(), k.data(), v.data(), y.data(),
                                  lse.data(), scratch.data(), s.B, s.T, s.H, s.KV, s.D);
      CHECK_CLOSE(dq, dq_ref, 5e-6, 5e-6, "gqa dq");
      CHECK_CLOSE(dk, dk_ref, 5e-6, 5e-6, "gqa dk");
      CHECK_CLOSE(dv, dv_ref, 5e-6, 5e-6, "gqa dv");
      CHECK(scratch.intact());
    }
  }
}

TEST_CASE("transformer kernels give bit-identical results with 1 and 2 threads", "[kernels]") {
  // Sizes reach the thresholds where rows, columns, elements and (sequence, head) pairs are split.
  const int N = 512, C = 96, V = 77;
  const GqaShape s{2, 130, 4, 2, 16};
  const size_t nq = size_t(s.B) * s.T * s.H * s.D, nk = size_t(s.B) * s.T * s.KV * s.D;
  Rand rng(291);
  auto x = rng.normal(size_t(N) * C), dy = rng.normal(size_t(N) * C), w = rng.normal(size_t(C), 0.2, 1.0),
       emb = rng.normal(size_t(V) * C), q = rng.normal(nq), k = rng.normal(nk), v = rng.normal(nk),
       gdy = rng.normal(nq), rx = rng.normal(size_t(4) * 256 * 4 * 16);
  auto tok = rng.ints(size_t(N), 0, V);
  struct Out {
    std::vector<float> y, rstd, dx, dw, rope_f, rope_i, a, dg, du, ex, demb, gy, lse, dq, dk, dv;
  };
  auto run = [&](int threads) {
    CpuKernels kern(threads);
    Out o;
    o.y.resize(x.size()), o.rstd.resize(size_t(N)), o.dx.resize(x.size()), o.dw.resize(size_t(C));
    kern.rmsnorm_forward(o.y.data(), o.rstd.data(), x.data(), w.data(), N, C, 1e-6f);
    kern.rmsnorm_backward_input(o.dx.data(), dy.data(), x.data(), o.rstd.data(), w.data(), N, C, false);
    kern.rmsnorm_backward_weight(o.dw.data(), dy.data(), x.data(), o.rstd.data(), N, C, false);
    o.rope_f = rx;
    kern.rope(o.rope_f.data(), 4, 256, 4, 16, 1e6f, false);
    o.rope_i = rx;
    kern.rope(o.rope_i.data(), 4, 256, 4, 16, 1e6f, true);
    o.a.resize(x.size()), o.dg.resize(x.size()), o.du.resize(x.size());
    kern.swiglu_forward(o.a.data(), x.data(), dy.data(), x.size());
    kern.swiglu_backward(o.dg.data(), o.du.data(), dy.data(), x.data(), o.y.data(), x.size());
    o.ex.resize(size_t(N) * C), o.demb.resize(emb.size());
    kern.token_embedding_forward(o.ex.data(), tok.data(), emb.data(), N, C);
    kern.token_embedding_backward(o.demb.data(), dy.data(), tok.data(), N, C, V, false);
    o.gy.resize(nq), o.lse.resize(size_t(s.B) * s.H * s.T), o.dq.resize(nq), o.dk.resize(nk), o.dv.resize(nk);
    kern.gqa_attention_forward(o.gy.data(), o.lse.data(), q.data(), k.data(), v.data(), s.B, s.T, s.H, s.KV, s.D);
    std::vector<float> scratch(kern.gqa_attention_scratch_floats(s.B, s.T, s.H, s.KV, s.D));
    kern.gqa_attention_backward(o.dq.data(), o.dk.data(), o.dv.data(), gdy.data(), q.data(), k.data(), v.data(),
                                o.gy.data(), o.lse.data(), scratch.data(), s.B, s.T, s.H, s.KV, s.D);
    return o;
  };
  Out one = run(1), two = run(2);
  CHECK(bitwise_equal(one.y, two.y));
  CHECK(bitwise_equal(one.rstd, two.rstd));
  CHECK(bitwise_equal(one.dx, two.dx));
  CHECK(bitwise_equal(one.dw, two.dw));
  CHECK(bitwise_equal(one.rope_f, two.rope_f));
  CHECK(bitwise_equal(one.rope_i, two.rope_i));
  CHECK(bitwise_equal(one.a, two.a));
  CHECK(bitwise_equal(one.dg, two.dg));
  CHECK(bitwise_equal(one.du, two.du));
  CHECK(bitwise_equal(one.ex, two.ex));
  CHECK(bitwise_equal(one.demb, two.demb));
  CHECK(bitwise_equal(one.gy, two.gy));
  CHECK(bitwise_equal(one.lse, two.lse));
  CHECK(bitwise_equal(one.dq, two.dq));
  CHECK(bitwise_equal(one.dk, two.dk));
  CHECK(bitwise_equal(one.dv, two.dv));
}
