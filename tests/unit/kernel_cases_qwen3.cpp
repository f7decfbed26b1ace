// Kernel cases of the Qwen3 family: RMSNorm, rotary embedding, SwiGLU, token embedding and causal grouped-query
// attention, forward and backward, against double references and finite differences.
#include <algorithm>
#include <cmath>
#include <tuple>

#include "kernel_cases.hpp"

namespace piper::test {

namespace {

double silu(double g) { return g / (1.0 + std::exp(-g)); }
double silu_grad(double g) {
  const double s = 1.0 / (1.0 + std::exp(-g));
  return s * (1.0 + g * (1.0 - s));
}

// y(N,C) = x · rstd · w, rstd = 1 / sqrt(mean(x²) + eps), in double
std::vector<double> rmsnorm_ref(const std::vector<float>& x, const std::vector<float>& w, int N, int C, double eps,
                                std::vector<double>* rstd = nullptr) {
  std::vector<double> y(x.size());
  if (rstd) rstd->assign(size_t(N), 0.0);
  for (int n = 0; n < N; ++n) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += double(x[size_t(n) * C + c]) * x[size_t(n) * C + c];
    const double r = 1.0 / std::sqrt(ss / C + eps);
    if (rstd) (*rstd)[size_t(n)] = r;
    for (int c = 0; c < C; ++c) y[size_t(n) * C + c] = double(x[size_t(n) * C + c]) * r * w[size_t(c)];
  }
  return y;
}

void rmsnorm_cases(std::vector<KernelCase>& cases) {
  struct Shape {
    int N, C;
    float eps;
  };
  // small (finite differences of every element), odd, rows split across threads (N·C ≥ 32768), wide rows, few
  // rows of Qwen3's width, and an eps that matters
  for (Shape s : {Shape{5, 16, 1e-5f}, Shape{70, 96, 1e-6f}, Shape{701, 48, 1e-6f}, Shape{300, 1000, 1e-6f},
                  Shape{5, 2048, 1e-6f}, Shape{5, 16, 1e-2f}, Shape{701, 48, 1e-2f}}) {
    const int N = s.N, C = s.C;
    const float eps = s.eps;
    const std::string shape = dims({{"N", N}, {"C", C}}) + (eps > 1e-3f ? " eps=1e-2" : "");
    const bool small = N * C < 100;
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["x"] = f32(uniform(gen, size_t(N) * C, -2.f, 3.f));
      t["w"] = f32(uniform(gen, C, 0.5f, 1.5f));
      t["dy"] = f32(uniform(gen, size_t(N) * C));
      t["dx"] = f32(uniform(gen, size_t(N) * C));  // priors
      t["dw"] = f32(uniform(gen, C));
      std::vector<float> y(size_t(N) * C), rstd(static_cast<size_t>(N));
      host().rmsnorm_forward(y.data(), rstd.data(), t["x"].f.data(), t["w"].f.data(), N, C, eps);
      t["y"] = f32(filled(y.size(), 3.f));
      t["rstd"] = f32(rstd);
      return t;
    };
    auto loss = [=](const Tensors& t) { return dot(t.at("dy").f, rmsnorm_ref(t.at("x").f, t.at("w").f, N, C, eps)); };
    // from the saved rstd: dx = rstd · (dy · w − x · rstd² · Σ_c dy·w·x / C); dw = Σ_n dy · x · rstd
    auto backward = [=](const Tensors& t, std::vector<double>& dx, std::vector<double>& dw) {
      dx.assign(size_t(N) * C, 0.0);
      dw.assign(size_t(C), 0.0);
      const auto &x = t.at("x").f, &w = t.at("w").f, &dy = t.at("dy").f;
      for (int n = 0; n < N; ++n) {
        const double r = t.at("rstd").f[size_t(n)];
        double d = 0;
        for (int c = 0; c < C; ++c) d += double(dy[size_t(n) * C + c]) * w[size_t(c)] * x[size_t(n) * C + c];
        for (int c = 0; c < C; ++c) {
          const size_t e = size_t(n) * C + c;
          dx[e] = r * (double(dy[e]) * w[size_t(c)] - double(x[e]) * r * r * d / C);
          dw[size_t(c)] += double(dy[e]) * x[e] * r;
        }
      }
    };
    cases.push_back(
        {.name = "rmsnorm_forward " + shape,
         .make = start,
         .call = [=](Kernels& k,
                     Buffers& b) { k.rmsnorm_forward(b.f("y"), b.f("rstd"), b.f("x"), b.f("w"), N, C, eps); },
         .outs = {{"y", 1e-5, 2e-6, 0, 1}, {"rstd", 1e-5, 1e-6}},
         .reference =
             [=](Tensors& t) {
               std::vector<double> rstd;
               t["y"] = as_f32(rmsnorm_ref(t["x"].f, t["w"].f, N, C, eps, &rstd));
               t["rstd"] = as_f32(rstd);
             }});
    for (bool acc : {false, true}) {
      KernelCase in{
          .name = std::string("rmsnorm_backward_input ") + (acc ? "accumulate " : "") + shape,
          .make = start,
          .call = [=](Kernels& k,
                      Buffers& b) { k.rmsnorm_backward_input(b.f("dx"), b.f("dy"), b.f("x"), b.f("rstd"), b.f("w"), N, C, acc); },
          .outs = {{"dx", 1e-4, 1e-5, 0, 1}},
          .reference =
              [=](Tensors& t) {
                std::vector<double> dx, dw;
                backward(t, dx, dw);
                t["dx"] = as_f32(add_prior(dx, t["dx"].f, acc));
              },
          .gradients = acc || !small ? std::vector<Gradient>{} : std::vector<Gradient>{{"x", "dx", loss}}};
      KernelCase wt{
          .name = std::string("rmsnorm_backward_weight ") + (acc ? "accumulate " : "") + shape,
          .make = start,
          .call = [=](Kernels& k,
                      Buffers& b) { k.rmsnorm_backward_weight(b.f("dw"), b.f("dy"), b.f("x"), b.f("rstd"), N, C, acc); },
          .outs = {{"dw", 1e-4, 1e-4, 0, 1}},
          .reference =
              [=](Tensors& t) {
                std::vector<double> dx, dw;
                backward(t, dx, dw);
                t["dw"] = as_f32(add_prior(dw, t["dw"].f, acc));
              },
          .gradients = acc || !small ? std::vector<Gradient>{} : std::vector<Gradient>{{"w", "dw", loss}},
          .cuda_repeatable = true};  // no atomics
      if (acc) {
        in.twins.push_back(overwrite_then_add({{"dx", size_t(N) * C}}, [=](Kernels& k, Buffers& b, auto tmp) {
          k.rmsnorm_backward_input(tmp[0], b.f("dy"), b.f("x"), b.f("rstd"), b.f("w"), N, C, false);
        }));
        wt.twins.push_back(overwrite_then_add({{"dw", size_t(C)}}, [=](Kernels& k, Buffers& b, auto tmp) {
          k.rmsnorm_backward_weight(tmp[0], b.f("dy"), b.f("x"), b.f("rstd"), N, C, false);
        }));
      }
      cases.push_back(in);
      cases.push_back(wt);
    }
  }
}

struct RopeShape {
  int B, T, H, D;
  float theta;
};

// Rotate-half RoPE on x(B,T,H,D) as Hugging Face computes it: inv_freq = 1 / theta^(2i/D) and the angle t · inv_freq
// are float values (torch builds them in float); cos, sin and the rotation are taken in double.
std::vector<double> rope_ref(const std::vector<float>& x, RopeShape s, bool inverse) {
  const int half = s.D / 2;
  std::vector<double> y(x.begin(), x.end());
  for (int b = 0; b < s.B; ++b)
    for (int p = 0; p < s.T; ++p)
      for (int h = 0; h < s.H; ++h) {
        const size_t row = ((size_t(b) * s.T + p) * s.H + h) * s.D;
        for (int i = 0; i < half; ++i) {
          const float inv_freq = 1.0f / float(std::pow(double(s.theta), double(float(2 * i) / float(s.D))));
          const double a = double(float(p) * inv_freq) * (inverse ? -1 : 1);
          const double x1 = x[row + i], x2 = x[row + i + half];
          y[row + i] = x1 * std::cos(a) - x2 * std::sin(a);
          y[row + i + half] = x2 * std::cos(a) + x1 * std::sin(a);
        }
      }
  return y;
}

void rope_cases(std::vector<KernelCase>& cases) {
  // odd head counts and sizes, Qwen3's theta at long positions (angles of thousands of radians), split across threads
  for (RopeShape s : {RopeShape{2, 70, 4, 64, 10000.f}, RopeShape{1, 4096, 2, 128, 1e6f}, RopeShape{3, 5, 1, 6, 500.f},
                      RopeShape{4, 1000, 3, 128, 1e6f}, RopeShape{2, 37, 3, 16, 10000.f}, RopeShape{1, 9, 2, 8, 1e6f},
                      RopeShape{1, 2048, 2, 64, 1e6f}}) {
    const std::string shape = dims({{"B", s.B}, {"T", s.T}, {"H", s.H}, {"D", s.D}});
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["x"] = f32(uniform(gen, size_t(s.B) * s.T * s.H * s.D));
      return t;
    };
    // position 0 is not rotated at all: the same bits
    auto unrotated_first = [=](const Tensors& start_t, const Tensors& out) {
      bool same = true;
      for (int b = 0; b < s.B; ++b)
        for (size_t e = 0; e < size_t(s.H) * s.D; ++e) {
          const size_t at = size_t(b) * s.T * s.H * s.D + e;
          same = same && out.at("x").f[at] == start_t.at("x").f[at];
        }
      CHECK(same);
    };
    for (bool inverse : {false, true})
      cases.push_back({.name = std::string(inverse ? "rope inverse " : "rope ") + shape,
                       .make = start,
                       .call = [=](Kernels& k, Buffers& b) { k.rope(b.f("x"), s.B, s.T, s.H, s.D, s.theta, inverse); },
                       .outs = {{"x", 1e-5, 2e-6, 0, 1}},
                       .reference = [=](Tensors& t) { t["x"] = as_f32(rope_ref(t["x"].f, s, inverse)); },
                       .property = unrotated_first});
    cases.push_back({.name = "rope, then its inverse " + shape,  // gives x back
                     .make = start,
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           k.rope(b.f("x"), s.B, s.T, s.H, s.D, s.theta, false);
                           k.rope(b.f("x"), s.B, s.T, s.H, s.D, s.theta, true);
                         },
                     .outs = {{"x", 1e-5, 2e-6, 0, 1}},
                     .reference = [](Tensors&) {}});
  }
  // rope is linear, so its gradient is its transpose: d/dx Σ dy · rope(x) = rope_inverse(dy)
  const RopeShape s{1, 6, 2, 8, 10000.f};
  cases.push_back({.name = "rope inverse is the gradient of rope",
                   .make =
                       [=](std::mt19937& gen) {
                         Tensors t;
                         t["x"] = f32(uniform(gen, size_t(s.B) * s.T * s.H * s.D));
                         t["dy"] = f32(uniform(gen, t["x"].f.size()));
                         return t;
                       },
                   .call = [=](Kernels& k, Buffers& b) { k.rope(b.f("dy"), s.B, s.T, s.H, s.D, s.theta, true); },
                   .outs = {{"dy", 1e-5}},
                   .reference = {},
                   .gradients = {{"x", "dy", [=](const Tensors& t) { return dot(t.at("dy").f, rope_ref(t.at("x").f, s, false)); },
                                  1e-3}}});
}

void swiglu_cases(std::vector<KernelCase>& cases) {
  // random gates, and gates on a grid over [-30, 30] (both tails of the sigmoid); the large ones split across threads
  for (auto [n, grid] : {std::pair{size_t(37), false}, std::pair{size_t(100003), false}, std::pair{size_t(601), true},
                         std::pair{size_t(40000), true}}) {
    const std::string shape = dims({{"n", long(n)}}) + (grid ? " gates on a grid" : "");
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      std::vector<float> g = uniform(gen, n, -20.f, 20.f);
      if (grid)
        for (size_t i = 0; i < n; ++i) g[i] = float(-30.0 + 60.0 * double(i) / double(n - 1));
      t["g"] = f32(g);
      t["u"] = f32(uniform(gen, n));
      t["da"] = f32(uniform(gen, n));
      t["a"] = f32(filled(n, 7.f));
      t["dg"] = f32(filled(n, 7.f));
      t["du"] = f32(filled(n, 7.f));
      return t;
    };
    auto forward = [](const Tensors& t) {  // a = silu(g) · u
      std::vector<double> a(t.at("g").f.size());
      for (size_t k = 0; k < a.size(); ++k) a[k] = silu(t.at("g").f[k]) * t.at("u").f[k];
      return a;
    };
    auto loss = [=](const Tensors& t) { return dot(t.at("da").f, forward(t)); };
    cases.push_back({.name = "swiglu_forward " + shape,
                     .make = start,
                     .call = [=](Kernels& k, Buffers& b) { k.swiglu_forward(b.f("a"), b.f("g"), b.f("u"), n); },
                     .outs = {{"a", 1e-5, 4e-6, 0, 1}},
                     .reference = [=](Tensors& t) { t["a"] = as_f32(forward(t)); }});
    cases.push_back(
        {.name = "swiglu_backward " + shape,  // dg = da · u · silu'(g), du = da · silu(g)
         .make = start,
         .call = [=](Kernels& k,
                     Buffers& b) { k.swiglu_backward(b.f("dg"), b.f("du"), b.f("da"), b.f("g"), b.f("u"), n); },
         .outs = {{"dg", 1e-5, 4e-6, 0, 1}, {"du", 1e-5, 4e-6, 0, 1}},
         .reference =
             [](Tensors& t) {
               std::vector<double> dg(t["g"].f.size()), du(dg.size());
               for (size_t k = 0; k < dg.size(); ++k) {
                 dg[k] = double(t["da"].f[k]) * t["u"].f[k] * silu_grad(t["g"].f[k]);
                 du[k] = double(t["da"].f[k]) * silu(t["g"].f[k]);
               }
               t["dg"] = as_f32(dg);
               t["du"] = as_f32(du);
             },
         .gradients = n > 100 ? std::vector<Gradient>{} : std::vector<Gradient>{{"g", "dg", loss}, {"u", "du", loss}}});
  }
}

void token_embedding_cases(std::vector<KernelCase>& cases) {
  // small with a token that never occurs; odd; split across threads; Qwen3's vocabulary size class
  for (auto [N, C, V] : {std::tuple{12, 8, 5}, std::tuple{60, 40, 300}, std::tuple{1024, 40, 50},
                         std::tuple{1000, 96, 5000}, std::tuple{4096, 66, 100000}}) {
    const std::string shape = dims({{"N", N}, {"C", C}, {"V", V}});
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["tok"] = V == 5 ? i32({0, 1, 1, 3, 0, 2, 3, 3, 1, 0, 2, 1}) : i32(hot_tokens(gen, size_t(N), V));
      t["w"] = f32(uniform(gen, size_t(V) * C));
      t["dx"] = f32(uniform(gen, size_t(N) * C));
      t["x"] = f32(filled(size_t(N) * C, 9.f));
      // the prior of an accumulating backward: random where small, a constant where it has millions of values
      t["dw"] = size_t(V) * C < (1u << 20) ? f32(uniform(gen, size_t(V) * C)) : f32(filled(size_t(V) * C, 0.25f));
      return t;
    };
    cases.push_back(
        {.name = "token_embedding_forward " + shape,  // a gather: exact
         .make = start,
         .call = [=](Kernels& k, Buffers& b) { k.token_embedding_forward(b.f("x"), b.i("tok"), b.f("w"), N, C); },
         .outs = {{"x", 0, 0}},
         .reference =
             [=](Tensors& t) {
               for (int n = 0; n < N; ++n)
                 for (int c = 0; c < C; ++c)
                   t["x"].f[size_t(n) * C + c] = t["w"].f[size_t(t["tok"].i[size_t(n)]) * C + c];
             },
         .cuda_repeatable = true});
    auto loss = [=](const Tensors& t) {  // Σ dx · w[tok]
      double s = 0;
      for (int n = 0; n < N; ++n)
        for (int c = 0; c < C; ++c)
          s += double(t.at("dx").f[size_t(n) * C + c]) * t.at("w").f[size_t(t.at("tok").i[size_t(n)]) * C + c];
      return s;
    };
    for (bool acc : {false, true})
      cases.push_back(
          {.name = std::string("token_embedding_backward ") + (acc ? "accumulate " : "") + shape,
           .make = start,
           .call = [=](Kernels& k,
                       Buffers& b) { k.token_embedding_backward(b.f("dw"), b.f("dx"), b.i("tok"), N, C, V, acc); },
           .outs = {{"dw", 1e-5, 1e-4}},  // the hot token sums over a thousand rows in float
           .reference =
               [=](Tensors& t) {  // dw[tok] (+)= dx, rows in order
                 std::vector<double> dw(t["dw"].f.size(), 0.0);
                 for (int n = 0; n < N; ++n)
                   for (int c = 0; c < C; ++c)
                     dw[size_t(t["tok"].i[size_t(n)]) * C + c] += t["dx"].f[size_t(n) * C + c];
                 t["dw"] = as_f32(add_prior(dw, t["dw"].f, acc));
               },
           .gradients = acc || V != 5 ? std::vector<Gradient>{} : std::vector<Gradient>{{"w", "dw", loss}},
           .cuda_repeatable = true,
           .twins = {},
           .property = V == 5 ? untouched_row("dw", 4, C, acc) : nullptr});  // token 4 never occurs
  }
}

struct GqaShape {
  int B, T, H, KV, D;
};

// Probabilities of query row i of (b, h) over keys j ≤ i, from q_i · k_j / sqrt(D); the row's log-sum-exp.
std::vector<double> gqa_probs(const Tensors& t, const GqaShape& s, int b, int h, int i, double* lse) {
  const auto &q = t.at("q").f, &k = t.at("k").f;
  const int kvh = h / (s.H / s.KV);
  std::vector<double> p(size_t(i) + 1);
  double mx = -1e300;
  for (int j = 0; j <= i; ++j) {
    double d = 0;
    for (int c = 0; c < s.D; ++c)
      d += double(q[((size_t(b) * s.T + i) * s.H + h) * s.D + c]) * k[((size_t(b) * s.T + j) * s.KV + kvh) * s.D + c];
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
std::vector<double> gqa_ref(const Tensors& t, const GqaShape& s, std::vector<double>* lse = nullptr) {
  const auto& v = t.at("v").f;
  std::vector<double> y(size_t(s.B) * s.T * s.H * s.D, 0.0);
  if (lse) lse->assign(size_t(s.B) * s.H * s.T, 0.0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h) {
      const int kvh = h / (s.H / s.KV);
      for (int i = 0; i < s.T; ++i) {
        double l = 0;
        auto p = gqa_probs(t, s, b, h, i, &l);
        if (lse) (*lse)[(size_t(b) * s.H + h) * s.T + i] = l;
        for (int j = 0; j <= i; ++j)
          for (int c = 0; c < s.D; ++c)
            y[((size_t(b) * s.T + i) * s.H + h) * s.D + c] += p[size_t(j)] * v[((size_t(b) * s.T + j) * s.KV + kvh) * s.D + c];
      }
    }
  return y;
}

// The textbook backward of gqa_ref given dy: dP = dy · v, dS = P (dP − Σ P dP), dq = dS k / sqrt(D),
// dk = Σ over the group's heads of dSᵀ q / sqrt(D), dv = Σ over the group's heads of Pᵀ dy.
void gqa_backward_ref(const Tensors& t, const GqaShape& s, std::vector<double>& dq, std::vector<double>& dk,
                      std::vector<double>& dv) {
  const auto &q = t.at("q").f, &k = t.at("k").f, &v = t.at("v").f, &dy = t.at("dy").f;
  dq.assign(q.size(), 0.0);
  dk.assign(k.size(), 0.0);
  dv.assign(v.size(), 0.0);
  const double scale = 1.0 / std::sqrt(double(s.D));
  auto qi = [&](int b, int p, int h) { return ((size_t(b) * s.T + p) * s.H + h) * s.D; };
  auto ki = [&](int b, int p, int h) { return ((size_t(b) * s.T + p) * s.KV + h) * s.D; };
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h) {
      const int kvh = h / (s.H / s.KV);
      for (int i = 0; i < s.T; ++i) {
        auto p = gqa_probs(t, s, b, h, i, nullptr);
        std::vector<double> dp(p.size());
        double pdp = 0;
        for (int j = 0; j <= i; ++j) {
          double d = 0;
          for (int c = 0; c < s.D; ++c) d += double(dy[qi(b, i, h) + c]) * v[ki(b, j, kvh) + c];
          dp[size_t(j)] = d;
          pdp += p[size_t(j)] * d;
        }
        for (int j = 0; j <= i; ++j) {
          const double ds = p[size_t(j)] * (dp[size_t(j)] - pdp);
          for (int c = 0; c < s.D; ++c) {
            dq[qi(b, i, h) + c] += ds * k[ki(b, j, kvh) + c] * scale;
            dk[ki(b, j, kvh) + c] += ds * q[qi(b, i, h) + c] * scale;
            dv[ki(b, j, kvh) + c] += p[size_t(j)] * dy[qi(b, i, h) + c];
          }
        }
      }
    }
}

void gqa_attention_cases(std::vector<KernelCase>& cases) {
  // Several 64-row query blocks with a partial last one; KV = H/2, KV = H, KV = 1; odd head sizes; D = 256 (over
  // 48 KiB of CUDA shared memory); a single position, where dq and dk are zero by cancellation; a small shape with
  // finite differences of every element.
  for (GqaShape s : {GqaShape{2, 70, 4, 2, 16}, GqaShape{1, 130, 2, 2, 8}, GqaShape{2, 70, 3, 1, 8},
                     GqaShape{1, 64, 4, 1, 8}, GqaShape{2, 5, 2, 1, 4}, GqaShape{2, 5, 2, 2, 4}, GqaShape{1, 1, 2, 2, 4},
                     GqaShape{1, 1, 2, 1, 4}, GqaShape{2, 130, 4, 2, 16}, GqaShape{1, 70, 3, 3, 8},
                     GqaShape{2, 70, 4, 2, 64}, GqaShape{1, 130, 2, 1, 128}, GqaShape{2, 33, 3, 3, 40},
                     GqaShape{1, 45, 2, 1, 256}, GqaShape{1, 1, 2, 2, 16}, GqaShape{1, 70, 4, 2, 8}}) {
    const std::string shape = dims({{"B", s.B}, {"T", s.T}, {"H", s.H}, {"KV", s.KV}, {"D", s.D}});
    const size_t nq = size_t(s.B) * s.T * s.H * s.D, nk = size_t(s.B) * s.T * s.KV * s.D;
    const size_t nl = size_t(s.B) * s.H * s.T;
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["q"] = f32(uniform(gen, nq, -2.f, 2.f));
      t["k"] = f32(uniform(gen, nk, -2.f, 2.f));
      t["v"] = f32(uniform(gen, nk));
      t["dy"] = f32(uniform(gen, nq));
      t["y"] = f32(filled(nq, 5.f));
      t["lse"] = f32(filled(nl, 5.f));
      t["dq"] = f32(filled(nq, 1e3f));  // written, not accumulated
      t["dk"] = f32(filled(nk, -1e3f));
      t["dv"] = f32(filled(nk, 1e3f));
      return t;
    };
    cases.push_back({.name = "gqa_attention_forward " + shape,
                     .make = start,
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           k.gqa_attention_forward(b.f("y"), b.f("lse"), b.f("q"), b.f("k"), b.f("v"), s.B, s.T, s.H,
                                                   s.KV, s.D);
                         },
                     .outs = {{"y", 1e-4, 1e-5, 0, 1}, {"lse", 1e-5, 3e-6, 0, 1}},
                     .reference =
                         [=](Tensors& t) {
                           std::vector<double> lse;
                           t["y"] = as_f32(gqa_ref(t, s, &lse));
                           t["lse"] = as_f32(lse);
                         },
                     .cuda_repeatable = true});
    // dq = scale · Σ_j P_ij (dy_i · v_j − dy_i · y_i) k_j, and dk alike with q: terms up to √D |dy| |v| |k|
    // that cancel exactly at T = 1 (P = 1, y = v), where dq and dk are zero and only their rounding is left
    const double terms = std::sqrt(double(s.D)) * 1.0 * 1.0 * 2.0;  // |dy|, |v| ≤ 1; |q|, |k| ≤ 2
    auto loss = [=](const Tensors& t) { return dot(t.at("dy").f, gqa_ref(t, s)); };
    const bool small = s.T > 1 && nq <= 2240;  // finite differences (not at T = 1, where dq and dk are 0)
    cases.push_back(
        {.name = "gqa_attention_backward " + shape,  // from the CPU forward's y and lse
         .make =
             [=](std::mt19937& gen) {
               Tensors t = start(gen);
               host().gqa_attention_forward(t["y"].f.data(), t["lse"].f.data(), t["q"].f.data(), t["k"].f.data(),
                                            t["v"].f.data(), s.B, s.T, s.H, s.KV, s.D);
               return t;
             },
         .call =
             [=](Kernels& k, Buffers& b) {
               float* scratch = b.scratch(k.gqa_attention_scratch_floats(s.B, s.T, s.H, s.KV, s.D));
               k.gqa_attention_backward(b.f("dq"), b.f("dk"), b.f("dv"), b.f("dy"), b.f("q"), b.f("k"), b.f("v"),
                                        b.f("y"), b.f("lse"), scratch, s.B, s.T, s.H, s.KV, s.D);
             },
         .outs = {{"dq", 1e-3, 2e-5, 1e-4 * terms, 1}, {"dk", 1e-3, 2e-5, 1e-4 * terms, 1}, {"dv", 1e-3, 2e-5, 0, 1}},
         .reference =
             [=](Tensors& t) {
               std::vector<double> dq, dk, dv;
               gqa_backward_ref(t, s, dq, dk, dv);
               t["dq"] = as_f32(dq);
               t["dk"] = as_f32(dk);
               t["dv"] = as_f32(dv);
             },
         .gradients = small ? std::vector<Gradient>{{"q", "dq", loss}, {"k", "dk", loss}, {"v", "dv", loss}}
                            : std::vector<Gradient>{},
         .cuda_repeatable = true});
  }
  // q, k and v as views of one fused qkv(B,T,3C) (GPT-2's: HeadRows {3C, 3C}), dq, dk and dv written into a fused
  // dqkv likewise: the bits of the calls on separate packed tensors
  const int B = 2, T = 70, H = 4, D = 8, C = H * D;
  const size_t n = size_t(B) * T * C, nl = size_t(B) * H * T;
  const HeadRows fused{3 * int64_t(C), 3 * int64_t(C)};
  auto split = [=](std::mt19937& gen) {
    Tensors t;
    auto qkv = uniform(gen, 3 * n, -2.f, 2.f);
    std::vector<float> q(n), k(n), v(n);
    for (size_t r = 0; r < size_t(B) * T; ++r)
      for (int c = 0; c < C; ++c) {
        q[r * C + c] = qkv[r * 3 * C + c];
        k[r * C + c] = qkv[r * 3 * C + C + c];
        v[r * C + c] = qkv[r * 3 * C + 2 * C + c];
      }
    t["qkv"] = f32(qkv);
    t["q"] = f32(q);
    t["k"] = f32(k);
    t["v"] = f32(v);
    t["dy"] = f32(uniform(gen, n));
    t["y"] = f32(filled(n, 5.f));
    t["lse"] = f32(filled(nl, 5.f));
    t["dqkv"] = f32(filled(3 * n, 1e3f));
    return t;
  };
  cases.push_back(
      {.name = "gqa_attention_forward KV=H on a fused qkv",
       .make = split,
       .call = [=](Kernels& k,
                   Buffers& b) { k.gqa_attention_forward(b.f("y"), b.f("lse"), b.f("q"), b.f("k"), b.f("v"), B, T, H, H, D); },
       .outs = {{"y", 1e-4}, {"lse", 1e-5}},
       .cuda_repeatable = true,
       .twins = {{.what = "q, k, v as views of the fused qkv",
                  .call =
                      [=](Kernels& k, Buffers& b) {
                        const float* qkv = b.f("qkv");
                        k.gqa_attention_forward(b.f("y"), b.f("lse"), qkv, qkv + C, qkv + 2 * C, B, T, H, H, D, fused);
                      },
                  .rtol = 0}}});
  cases.push_back(
      {.name = "gqa_attention_backward KV=H into a fused dqkv",
       .make =
           [=](std::mt19937& gen) {
             Tensors t = split(gen);
             host().gqa_attention_forward(t["y"].f.data(), t["lse"].f.data(), t["q"].f.data(), t["k"].f.data(),
                                          t["v"].f.data(), B, T, H, H, D);
             return t;
           },
       .call =  // into separate dq, dk, dv, then their rows copied into dqkv's thirds
       [=](Kernels& k, Buffers& b) {
         float* d = b.scratch(3 * n);  // dq, dk, dv (B,T,C) each
         float* scratch = b.scratch(k.gqa_attention_scratch_floats(B, T, H, H, D));
         k.gqa_attention_backward(d, d + n, d + 2 * n, b.f("dy"), b.f("q"), b.f("k"), b.f("v"), b.f("y"), b.f("lse"),
                                  scratch, B, T, H, H, D);
         for (size_t r = 0; r < size_t(B) * T; ++r)
           for (int part = 0; part < 3; ++part)
             k.copy(b.f("dqkv") + r * 3 * C + size_t(part) * C, d + size_t(part) * n + r * C, sizeof(float) * C);
       },
       .outs = {{"dqkv", 1e-3}},
       .cuda_repeatable = true,
       .twins = {{.what = "q, k, v and dq, dk, dv as views of the fused qkv and dqkv",
                  .call =
                      [=](Kernels& k, Buffers& b) {
                        const float* qkv = b.f("qkv");
                        float* dqkv = b.f("dqkv");
                        float* scratch = b.scratch(k.gqa_attention_scratch_floats(B, T, H, H, D));
                        k.gqa_attention_backward(dqkv, dqkv + C, dqkv + 2 * C, b.f("dy"), qkv, qkv + C, qkv + 2 * C,
                                                 b.f("y"), b.f("lse"), scratch, B, T, H, H, D, fused);
                      },
                  .rtol = 0}}});
}

}  // namespace

void add_qwen3_cases(std::vector<KernelCase>& cases) {
  rmsnorm_cases(cases);
  rope_cases(cases);
  swiglu_cases(cases);
  token_embedding_cases(cases);
  gqa_attention_cases(cases);
}

}  // namespace piper::test
