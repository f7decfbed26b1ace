// The table of kernel cases: every Kernels call on the shapes that matter to it (odd sizes, sizes that split
// across threads or CUDA blocks, repeated and dropped indices), with double references and finite differences
// where they are cheap. A new kernel is one row here; the CPU and CUDA runners pick it up.
#include <cmath>
#include <initializer_list>
#include <utility>

#include "backend/cpu/cpu_kernels.hpp"
#include "kernel_harness.hpp"

namespace piper::test {

namespace {

// "N=70 C=96"
std::string dims(std::initializer_list<std::pair<const char*, long>> d) {
  std::string s;
  for (const auto& [name, v] : d) {
    if (!s.empty()) s += ' ';
    s.append(name).append("=").append(std::to_string(v));
  }
  return s;
}

// The CPU kernels that make a backward case's saved tensors (the forward's statistics), so that every backend
// differentiates at the same point.
CpuKernels& host() {
  static CpuKernels k(1);
  return k;
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }

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

double dot(const std::vector<float>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t k = 0; k < a.size(); ++k) s += double(a[k]) * b[k];
  return s;
}

HostTensor as_f32(const std::vector<double>& v) { return f32(std::vector<float>(v.begin(), v.end())); }

void linear_cases(std::vector<KernelCase>& cases) {
  for (int N : {37, 1000}) {
    const int C = 48, OC = 70;
    const std::string shape = dims({{"N", N}});
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["x"] = f32(uniform(gen, size_t(N) * C));
      t["w"] = f32(uniform(gen, size_t(OC) * C));
      t["b"] = f32(uniform(gen, OC));
      t["dy"] = f32(uniform(gen, size_t(N) * OC));
      t["y"] = f32(std::vector<float>(size_t(N) * OC));
      t["dgelu"] = f32(std::vector<float>(size_t(N) * OC));
      t["dx"] = f32(uniform(gen, size_t(N) * C));
      t["dw"] = f32(uniform(gen, size_t(OC) * C));
      t["db"] = f32(uniform(gen, OC));
      return t;
    };
    // x · wᵀ (+ b), in double
    auto xw = [=](const Tensors& t, bool bias) {
      std::vector<double> y(size_t(N) * OC);
      for (int n = 0; n < N; ++n)
        for (int o = 0; o < OC; ++o) {
          double s = bias ? t.at("b").f[size_t(o)] : 0.0;
          for (int c = 0; c < C; ++c) s += double(t.at("x").f[size_t(n) * C + c]) * t.at("w").f[size_t(o) * C + c];
          y[size_t(n) * OC + o] = s;
        }
      return y;
    };
    auto loss = [=](const Tensors& t) { return dot(t.at("dy").f, xw(t, true)); };  // Σ dy · (x · wᵀ + b)
    for (bool bias : {true, false})                                                // y(N,OC) = x · wᵀ (+ b)
      cases.push_back({.name = std::string("linear_forward ") + (bias ? "" : "no bias ") + shape,
                       .make = start,
                       .call =
                           [=](Kernels& k, Buffers& b) {
                             k.linear_forward(b.f("y"), b.f("x"), b.f("w"), bias ? b.f("b") : nullptr, N, C, OC);
                           },
                       .outs = {{"y", 1e-4, 1e-4}},  // float products of 48 terms against double
                       .reference = [=](Tensors& t) { t["y"] = as_f32(xw(t, bias)); },
                       .gradients = {},
                       .threads_rtol = 1e-4});
    cases.push_back({.name = "linear_gelu_forward " + shape,  // y = gelu(x · wᵀ + b), dgelu = gelu'(x · wᵀ + b)
                     .make = start,
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           k.linear_gelu_forward(b.f("dgelu"), b.f("y"), b.f("x"), b.f("w"), b.f("b"), N, C, OC);
                         },
                     .outs = {{"dgelu", 1e-4}, {"y", 1e-4}},
                     .reference = {},
                     .gradients = {},
                     .threads_rtol = 1e-4});
    for (bool acc : {false, true})  // dx(N,C) (+)= dy · w
      cases.push_back(
          {.name = std::string("linear_backward_input ") + (acc ? "accumulate " : "") + shape,
           .make = start,
           .call = [=](Kernels& k,
                       Buffers& b) { k.linear_backward_input(b.f("dx"), b.f("dy"), b.f("w"), N, C, OC, acc); },
           .outs = {{"dx", 1e-4}},
           .reference = {},
           .gradients = acc || N > 100 ? std::vector<Gradient>{}  // one shape: each probe is a product
                                       : std::vector<Gradient>{{"x", "dx", loss}},
           .threads_rtol = 1e-4});
    for (bool acc : {false, true})  // dw(OC,C) (+)= dyᵀ · x; db(OC) (+)= Σ dy
      for (bool with_db : {true, false})
        cases.push_back({.name = std::string("linear_backward_weight ") + (acc ? "accumulate " : "") +
                                 (with_db ? "" : "no db ") + shape,
                         .make = start,
                         .call =
                             [=](Kernels& k, Buffers& b) {
                               k.linear_backward_weight(b.f("dw"), with_db ? b.f("db") : nullptr, b.f("dy"), b.f("x"),
                                                        N, C, OC, acc);
                             },
                         .outs = {{"dw", 1e-4}, {"db", 1e-4}},
                         .reference = {},
                         .gradients = acc || !with_db || N > 100
                                          ? std::vector<Gradient>{}
                                          : std::vector<Gradient>{{"w", "dw", loss}, {"b", "db", loss}},
                         .threads_rtol = 1e-4});
    cases.push_back(
        {.name = "gelu_backward " + shape,  // dpre = dy · dgelu, in place on dy
         .make =
             [=](std::mt19937& gen) {
               Tensors t;
               t["dy"] = f32(uniform(gen, size_t(N) * OC));
               t["dgelu"] = f32(uniform(gen, size_t(N) * OC, 0.f, 1.1f));  // gelu' lies in about [-0.13, 1.13]
               return t;
             },
         .call = [=](Kernels& k, Buffers& b) { k.gelu_backward(b.f("dy"), b.f("dy"), b.f("dgelu"), size_t(N) * OC); },
         .outs = {{"dy", 1e-4}},
         .reference =
             [](Tensors& t) {
               for (size_t k = 0; k < t["dy"].f.size(); ++k) t["dy"].f[k] *= t["dgelu"].f[k];
             }});
  }
}

void grouped_linear_cases(std::vector<KernelCase>& cases) {
  // experts of different row counts (one empty, one of a single row), as a mixture of experts' gate/up
  // (C → DE) and down (DE → C); w holds the experts' (DE,C) weights one after the other
  const int C = 96, DE = 40;
  static const std::vector<int> counts = {37, 0, 1, 250, 64, 5};
  const int groups = int(counts.size());
  int rows = 0;
  for (int n : counts) rows += n;
  auto start = [=](std::mt19937& gen) {
    Tensors t;
    t["x"] = f32(uniform(gen, size_t(rows) * C));
    t["dy"] = f32(uniform(gen, size_t(rows) * DE));
    t["w"] = f32(uniform(gen, size_t(groups) * DE * C));
    t["y"] = f32(std::vector<float>(size_t(rows) * DE));
    t["dx"] = f32(uniform(gen, size_t(rows) * C));
    for (int e = 0; e < groups; ++e) t["dw" + std::to_string(e)] = f32(uniform(gen, size_t(DE) * C));
    return t;
  };
  const size_t wsz = size_t(DE) * C;
  cases.push_back({.name = "linear_forward_grouped",  // y(n,DE) = x(n,C) · wᵀ per expert
                   .make = start,
                   .call =
                       [=](Kernels& k, Buffers& b) {
                         std::vector<LinearGroup> g;
                         for (int e = 0, at = 0; e < groups; at += counts[size_t(e)], ++e)
                           g.push_back({b.f("y") + size_t(at) * DE, b.f("x") + size_t(at) * C, b.f("w") + e * wsz,
                                        counts[size_t(e)], C, DE});
                         k.linear_forward_grouped(g.data(), groups);
                       },
                   .outs = {{"y", 1e-4}},
                   .threads_rtol = 1e-4});
  cases.push_back({.name = "linear_backward_input_grouped",  // dx(n,C) = dy · w, then dy · (another expert's w) added
                   .make = start,
                   .call =
                       [=](Kernels& k, Buffers& b) {
                         std::vector<LinearGroup> g;
                         for (bool add : {false, true})
                           for (int e = 0, at = 0; e < groups; at += counts[size_t(e)], ++e)
                             g.push_back({b.f("dx") + size_t(at) * C, b.f("dy") + size_t(at) * DE,
                                          b.f("w") + (add ? (e + 1) % groups : e) * wsz, counts[size_t(e)], C, DE,
                                          add});
                         k.linear_backward_input_grouped(g.data(), int(g.size()));
                       },
                   .outs = {{"dx", 1e-4}},
                   .threads_rtol = 1e-4});
  // each expert's dw on its own, so that each is judged against its own scale (one has a single row)
  std::vector<Out> dw_outs;
  for (int e = 0; e < groups; ++e) dw_outs.push_back({"dw" + std::to_string(e), 1e-4});
  for (bool acc : {false, true})  // dw(DE,C) (+)= dyᵀ · x per expert; expert 3 also gets expert 0's rows
    cases.push_back({.name = std::string("linear_backward_weight_grouped ") + (acc ? "accumulate" : "write"),
                     .make = start,
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           std::vector<LinearGroup> g;
                           for (int e = 0, at = 0; e < groups; at += counts[size_t(e)], ++e)
                             g.push_back({b.f("dw" + std::to_string(e)), b.f("dy") + size_t(at) * DE,
                                          b.f("x") + size_t(at) * C, counts[size_t(e)], C, DE, acc});
                           g.push_back({b.f("dw3"), b.f("dy"), b.f("x"), counts[0], C, DE, true});
                           k.linear_backward_weight_grouped(g.data(), int(g.size()));
                         },
                     .outs = dw_outs,
                     .threads_rtol = 1e-4});
}

void layernorm_cases(std::vector<KernelCase>& cases) {
  for (auto [N, C] : {std::pair{70, 96}, std::pair{300, 1000}}) {
    const std::string shape = dims({{"N", N}, {"C", C}});
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["x"] = f32(uniform(gen, size_t(N) * C, -2.f, 3.f));
      t["w"] = f32(uniform(gen, C));
      t["b"] = f32(uniform(gen, C));
      t["dy"] = f32(uniform(gen, size_t(N) * C));
      t["dx"] = f32(uniform(gen, size_t(N) * C));
      t["dw"] = f32(uniform(gen, C));
      t["db"] = f32(uniform(gen, C));
      std::vector<float> y(size_t(N) * C), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
      host().layernorm_forward(y.data(), mean.data(), rstd.data(), t["x"].f.data(), t["w"].f.data(), t["b"].f.data(), N,
                               C);
      t["y"] = f32(std::vector<float>(y.size()));
      t["mean"] = f32(mean);
      t["rstd"] = f32(rstd);
      return t;
    };
    cases.push_back({.name = "layernorm_forward " + shape,
                     .make = start,
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           k.layernorm_forward(b.f("y"), b.f("mean"), b.f("rstd"), b.f("x"), b.f("w"), b.f("b"), N, C);
                         },
                     .outs = {{"y", 1e-4}, {"mean", 1e-4}, {"rstd", 1e-4}}});
    for (bool acc : {false, true}) {
      cases.push_back({.name = std::string("layernorm_backward_input ") + (acc ? "accumulate " : "") + shape,
                       .make = start,
                       .call =
                           [=](Kernels& k, Buffers& b) {
                             k.layernorm_backward_input(b.f("dx"), b.f("dy"), b.f("x"), b.f("mean"), b.f("rstd"),
                                                        b.f("w"), N, C, acc);
                           },
                       .outs = {{"dx", 1e-4}}});
      cases.push_back({.name = std::string("layernorm_backward_weight ") + (acc ? "accumulate " : "") + shape,
                       .make = start,
                       .call =
                           [=](Kernels& k, Buffers& b) {
                             k.layernorm_backward_weight(b.f("dw"), b.f("db"), b.f("dy"), b.f("x"), b.f("mean"),
                                                         b.f("rstd"), N, C, acc);
                           },
                       .outs = {{"dw", 1e-4}, {"db", 1e-4}}});
    }
  }
}

void attention_cases(std::vector<KernelCase>& cases) {
  struct Shape {
    int B, T, C, NH;
  };
  for (Shape s : {Shape{2, 33, 48, 4}, Shape{4, 64, 64, 2}, Shape{3, 7, 24, 3}}) {
    const std::string shape = dims({{"B", s.B}, {"T", s.T}, {"C", s.C}, {"NH", s.NH}});
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["qkv"] = f32(uniform(gen, size_t(s.B) * s.T * 3 * s.C, -2.f, 2.f));
      t["dy"] = f32(uniform(gen, size_t(s.B) * s.T * s.C));
      std::vector<float> y(size_t(s.B) * s.T * s.C), att(size_t(s.B) * s.NH * s.T * s.T);
      host().attention_forward(y.data(), att.data(), t["qkv"].f.data(), s.B, s.T, s.C, s.NH);
      t["y"] = f32(std::vector<float>(y.size()));
      t["att"] = f32(att);
      t["dqkv"] = f32(std::vector<float>(t["qkv"].f.size(), 1e3f));  // written, not accumulated
      return t;
    };
    cases.push_back(
        {.name = "attention_forward " + shape,
         .make = start,
         .call = [=](Kernels& k,
                     Buffers& b) { k.attention_forward(b.f("y"), b.f("att"), b.f("qkv"), s.B, s.T, s.C, s.NH); },
         .outs = {{"y", 1e-3}, {"att", 1e-3}}});
    cases.push_back({.name = "attention_backward " + shape,  // from the CPU forward's att
                     .make = start,
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           float* scratch = b.scratch(k.attention_scratch_floats(s.B, s.T, s.C, s.NH));
                           k.attention_backward(b.f("dqkv"), b.f("dy"), b.f("qkv"), b.f("att"), scratch, s.B, s.T, s.C,
                                                s.NH);
                         },
                     .outs = {{"dqkv", 1e-3}}});
  }
}

// tokens with a hot one: every third row scatters into token 7
std::vector<int32_t> hot_tokens(std::mt19937& gen, size_t n, int V) {
  auto tok = tokens(gen, n, V);
  for (size_t i = 0; i < tok.size(); i += 3) tok[i] = 7;
  return tok;
}

void embedding_cases(std::vector<KernelCase>& cases) {
  {
    const int B = 3, T = 20, C = 40, V = 300;
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["tok"] = i32(hot_tokens(gen, size_t(B) * T, V));
      t["wte"] = f32(uniform(gen, size_t(V) * C));
      t["wpe"] = f32(uniform(gen, size_t(T) * C));
      t["dx"] = f32(uniform(gen, size_t(B) * T * C));
      t["x"] = f32(std::vector<float>(size_t(B) * T * C));
      t["dwte"] = f32(uniform(gen, size_t(V) * C));
      t["dwpe"] = f32(uniform(gen, size_t(T) * C));
      return t;
    };
    cases.push_back(
        {.name = "embedding_forward",
         .make = start,
         .call = [=](Kernels& k,
                     Buffers& b) { k.embedding_forward(b.f("x"), b.i("tok"), b.f("wte"), b.f("wpe"), B, T, C); },
         .outs = {{"x", 1e-6}},
         .reference =
             [=](Tensors& t) {
               for (int n = 0; n < B * T; ++n)
                 for (int c = 0; c < C; ++c)
                   t["x"].f[size_t(n) * C + c] =
                       t["wte"].f[size_t(t["tok"].i[size_t(n)]) * C + c] + t["wpe"].f[size_t(n % T) * C + c];
             }});
    for (bool acc_wte : {false, true})
      for (bool acc_wpe : {false, true})
        cases.push_back({.name = std::string("embedding_backward") + (acc_wte ? " accumulate wte" : "") +
                                 (acc_wpe ? " accumulate wpe" : ""),
                         .make = start,
                         .call =
                             [=](Kernels& k, Buffers& b) {
                               k.embedding_backward(b.f("dwte"), b.f("dwpe"), b.f("dx"), b.i("tok"), B, T, C, V,
                                                    acc_wte, acc_wpe);
                             },
                         .outs = {{"dwte", 1e-5}, {"dwpe", 1e-5}},
                         .cuda_repeatable = true});
  }
  {
    // vocabulary far larger than the tokens; hot tokens repeat hundreds of times, one over a thousand, next to
    // tokens seen once, the first and the last token id; C not a multiple of the column tile
    const int B = 4, T = 512, C = 200, V = 151936;
    const size_t N = size_t(B) * T;
    auto start = [=](std::mt19937& gen) {
      auto tok = tokens(gen, N, V);
      std::uniform_int_distribution<int> hot(0, 7);
      for (size_t i = 0; i < N; ++i) {
        if (i % 2 == 0)
          tok[i] = 11;
        else if (i % 5 == 1)
          tok[i] = 1000 + hot(gen);
      }
      tok[3] = 0;
      tok[N - 2] = V - 1;
      Tensors t;
      t["tok"] = i32(tok);
      t["dx"] = f32(uniform(gen, N * C));
      t["dwte"] = f32(std::vector<float>(size_t(V) * C, 0.25f));  // 30 M values: a constant is quicker to make
      t["dwpe"] = f32(uniform(gen, size_t(T) * C));
      return t;
    };
    for (bool acc_wte : {false, true})
      cases.push_back({.name = std::string("embedding_backward V=151936 ") + (acc_wte ? "accumulate" : "write"),
                       .make = start,
                       .call =
                           [=](Kernels& k, Buffers& b) {
                             k.embedding_backward(b.f("dwte"), b.f("dwpe"), b.f("dx"), b.i("tok"), B, T, C, V, acc_wte,
                                                  true);
                           },
                       .outs = {{"dwte", 1e-6}, {"dwpe", 1e-5}},  // dwte: the CPU's additions in the CPU's order
                       .cuda_repeatable = true});
  }
}

void softmax_xent_cases(std::vector<KernelCase>& cases) {
  for (auto [N, V] : {std::pair{50, 300}, std::pair{9, 5000}}) {
    const std::string shape = dims({{"N", N}, {"V", V}});
    const float scale = 0.37f;
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["logits"] = f32(uniform(gen, size_t(N) * V, -5.f, 5.f));
      t["targets"] = i32(tokens(gen, size_t(N), V));
      t["loss"] = f64({0.5});
      return t;
    };
    // loss += scale · Σ -log softmax(logits)[target], probs in place of the logits
    cases.push_back({.name = "softmax_xent_forward " + shape,
                     .make = start,
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           k.softmax_xent_forward(b.f("logits"), b.d("loss"), b.f("logits"), b.i("targets"), N, V,
                                                  scale);
                         },
                     .outs = {{"logits", 1e-4}, {"loss", 1e-5}},
                     .reference =
                         [=](Tensors& t) {
                           double loss = t["loss"].d[0];
                           for (int n = 0; n < N; ++n) {
                             float* row = t["logits"].f.data() + size_t(n) * V;
                             double mx = row[0], sum = 0;
                             for (int v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
                             for (int v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
                             loss -= scale * (double(row[t["targets"].i[size_t(n)]]) - mx - std::log(sum));
                             for (int v = 0; v < V; ++v) row[v] = float(std::exp(double(row[v]) - mx) / sum);
                           }
                           t["loss"].d[0] = loss;
                         }});
    cases.push_back({.name = "softmax_xent_backward " + shape,  // dlogits = scale · (probs - onehot), in place
                     .make =
                         [=](std::mt19937& gen) {
                           Tensors t = start(gen);
                           double loss = 0;
                           host().softmax_xent_forward(t["logits"].f.data(), &loss, t["logits"].f.data(),
                                                       t["targets"].i.data(), N, V, scale);
                           return t;
                         },
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           k.softmax_xent_backward(b.f("logits"), b.f("logits"), b.i("targets"), N, V, scale);
                         },
                     .outs = {{"logits", 1e-4}}});
  }
}

void elementwise_cases(std::vector<KernelCase>& cases) {
  const size_t n = 100003;
  auto start = [=](std::mt19937& gen) {
    Tensors t;
    t["a"] = f32(uniform(gen, n));
    t["b"] = f32(uniform(gen, n));
    t["y"] = f32(uniform(gen, n));
    t["acc"] = f64({1.25});
    t["m"] = f32(uniform(gen, n, -0.1f, 0.1f));
    t["v"] = f32(uniform(gen, n, 0.f, 0.01f));
    return t;
  };
  auto each = [](Tensors& t, auto f) {
    for (size_t k = 0; k < t["y"].f.size(); ++k) t["y"].f[k] = f(t["a"].f[k], t["b"].f[k], t["y"].f[k]);
  };
  cases.push_back({.name = "add",
                   .make = start,
                   .call = [=](Kernels& k, Buffers& b) { k.add(b.f("y"), b.f("a"), b.f("b"), n); },
                   .outs = {{"y", 0, 0}},
                   .reference = [=](Tensors& t) { each(t, [](float a, float b, float) { return a + b; }); },
                   .cuda_repeatable = true});
  cases.push_back({.name = "accumulate",
                   .make = start,
                   .call = [=](Kernels& k, Buffers& b) { k.accumulate(b.f("y"), b.f("a"), n); },
                   .outs = {{"y", 0, 0}},
                   .reference = [=](Tensors& t) { each(t, [](float a, float, float y) { return y + a; }); },
                   .cuda_repeatable = true});
  cases.push_back({.name = "fill",
                   .make = start,
                   .call = [=](Kernels& k, Buffers& b) { k.fill(b.f("y"), 2.5f, n); },
                   .outs = {{"y", 0, 0}},
                   .reference = [=](Tensors& t) { each(t, [](float, float, float) { return 2.5f; }); }});
  cases.push_back({.name = "copy, and a copy to itself",
                   .make = start,
                   .call =
                       [=](Kernels& k, Buffers& b) {
                         k.copy(b.f("y"), b.f("b"), sizeof(float) * n);
                         k.copy(b.f("y"), b.f("y"), sizeof(float) * n);
                       },
                   .outs = {{"y", 0, 0}},
                   .reference = [=](Tensors& t) { each(t, [](float, float b, float) { return b; }); }});
  cases.push_back({.name = "sum_squares",
                   .make = start,  // acc += Σ a², summed in double
                   .call = [=](Kernels& k, Buffers& b) { k.sum_squares(b.d("acc"), b.f("a"), n); },
                   .outs = {{"acc", 1e-5, 1e-7}},  // squares of floats summed in double, in chunks
                   .reference =
                       [=](Tensors& t) {
                         for (float a : t["a"].f) t["acc"].d[0] += double(a) * a;
                       },
                   .cuda_repeatable = true});
  AdamWArgs args;
  args.lr = 3e-3f;
  args.weight_decay = 0.1f;
  args.grad_scale = 0.7f;
  args.step = 3;
  cases.push_back({.name = "adamw",
                   .make = start,  // param a, gradient b
                   .call = [=](Kernels& k, Buffers& b) { k.adamw(b.f("a"), b.f("b"), b.f("m"), b.f("v"), n, args); },
                   .outs = {{"a", 1e-5}, {"m", 1e-5}, {"v", 1e-5}}});
}

void rmsnorm_cases(std::vector<KernelCase>& cases) {
  const float eps = 1e-6f;
  for (auto [N, C] : {std::pair{70, 96}, std::pair{300, 1000}, std::pair{5, 2048}}) {
    const std::string shape = dims({{"N", N}, {"C", C}});
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["x"] = f32(uniform(gen, size_t(N) * C, -2.f, 3.f));
      t["w"] = f32(uniform(gen, C, 0.5f, 1.5f));
      t["dy"] = f32(uniform(gen, size_t(N) * C));
      t["dx"] = f32(uniform(gen, size_t(N) * C));
      t["dw"] = f32(uniform(gen, C));
      std::vector<float> y(size_t(N) * C), rstd(static_cast<size_t>(N));
      host().rmsnorm_forward(y.data(), rstd.data(), t["x"].f.data(), t["w"].f.data(), N, C, eps);
      t["y"] = f32(std::vector<float>(y.size()));
      t["rstd"] = f32(rstd);
      return t;
    };
    auto loss = [=](const Tensors& t) { return dot(t.at("dy").f, rmsnorm_ref(t.at("x").f, t.at("w").f, N, C, eps)); };
    cases.push_back(
        {.name = "rmsnorm_forward " + shape,
         .make = start,
         .call = [=](Kernels& k,
                     Buffers& b) { k.rmsnorm_forward(b.f("y"), b.f("rstd"), b.f("x"), b.f("w"), N, C, eps); },
         .outs = {{"y", 1e-5}, {"rstd", 1e-5}},
         .reference =
             [=](Tensors& t) {
               std::vector<double> rstd;
               t["y"] = as_f32(rmsnorm_ref(t["x"].f, t["w"].f, N, C, eps, &rstd));
               t["rstd"] = as_f32(rstd);
             }});
    for (bool acc : {false, true}) {
      cases.push_back({.name = std::string("rmsnorm_backward_input ") + (acc ? "accumulate " : "") + shape,
                       .make = start,
                       .call =
                           [=](Kernels& k, Buffers& b) {
                             k.rmsnorm_backward_input(b.f("dx"), b.f("dy"), b.f("x"), b.f("rstd"), b.f("w"), N, C, acc);
                           },
                       .outs = {{"dx", 1e-4}},
                       .reference = {},
                       .gradients = acc ? std::vector<Gradient>{} : std::vector<Gradient>{{"x", "dx", loss}}});
      cases.push_back({.name = std::string("rmsnorm_backward_weight ") + (acc ? "accumulate " : "") + shape,
                       .make = start,
                       .call =
                           [=](Kernels& k, Buffers& b) {
                             k.rmsnorm_backward_weight(b.f("dw"), b.f("dy"), b.f("x"), b.f("rstd"), N, C, acc);
                           },
                       .outs = {{"dw", 1e-4}},
                       .reference = {},
                       .gradients = acc ? std::vector<Gradient>{} : std::vector<Gradient>{{"w", "dw", loss}},
                       .cuda_repeatable = true});  // no atomics
    }
  }
}

void rope_cases(std::vector<KernelCase>& cases) {
  struct Shape {
    int B, T, H, D;
    float theta;
  };
  for (Shape s : {Shape{2, 70, 4, 64, 10000.f}, Shape{1, 4096, 2, 128, 1e6f}, Shape{3, 5, 1, 6, 500.f},
                  Shape{4, 1000, 3, 128, 1e6f}}) {
    for (bool inverse : {false, true})
      cases.push_back({.name = std::string(inverse ? "rope inverse " : "rope ") +
                               dims({{"B", s.B}, {"T", s.T}, {"H", s.H}, {"D", s.D}}),
                       .make =
                           [=](std::mt19937& gen) {
                             Tensors t;
                             t["x"] = f32(uniform(gen, size_t(s.B) * s.T * s.H * s.D));
                             return t;
                           },
                       .call = [=](Kernels& k, Buffers& b) { k.rope(b.f("x"), s.B, s.T, s.H, s.D, s.theta, inverse); },
                       .outs = {{"x", 1e-5}},
                       .reference = [=](Tensors& t) {  // rotate-half: (x1, x2) → (x1 cos − x2 sin, x2 cos + x1 sin)
                         const int half = s.D / 2;
                         for (int b = 0; b < s.B; ++b)
                           for (int p = 0; p < s.T; ++p)
                             for (int h = 0; h < s.H; ++h) {
                               float* x = t["x"].f.data() + ((size_t(b) * s.T + p) * s.H + h) * s.D;
                               for (int i = 0; i < half; ++i) {
                                 // the angle as torch (and the kernels) make it, in float; its cos and sin in double
                                 const float inv_freq =
                                     1.0f / float(std::pow(double(s.theta), double(float(2 * i) / float(s.D))));
                                 const double a = double(float(p) * inv_freq) * (inverse ? -1 : 1);
                                 const double x1 = x[i], x2 = x[i + half];
                                 x[i] = float(x1 * std::cos(a) - x2 * std::sin(a));
                                 x[i + half] = float(x2 * std::cos(a) + x1 * std::sin(a));
                               }
                             }
                       }});
  }
}

void swiglu_cases(std::vector<KernelCase>& cases) {
  for (size_t n : {size_t(37), size_t(100003)}) {
    const std::string shape = dims({{"n", long(n)}});
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["g"] = f32(uniform(gen, n, -20.f, 20.f));
      t["u"] = f32(uniform(gen, n));
      t["da"] = f32(uniform(gen, n));
      t["a"] = f32(std::vector<float>(n));
      t["dg"] = f32(std::vector<float>(n));
      t["du"] = f32(std::vector<float>(n));
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
                     .outs = {{"a", 1e-5}},
                     .reference = [=](Tensors& t) { t["a"] = as_f32(forward(t)); }});
    cases.push_back(
        {.name = "swiglu_backward " + shape,
         .make = start,
         .call = [=](Kernels& k,
                     Buffers& b) { k.swiglu_backward(b.f("dg"), b.f("du"), b.f("da"), b.f("g"), b.f("u"), n); },
         .outs = {{"dg", 1e-5}, {"du", 1e-5}},
         .reference = {},
         .gradients = {{"g", "dg", loss}, {"u", "du", loss}}});
  }
}

void token_embedding_cases(std::vector<KernelCase>& cases) {
  for (auto [N, C, V] : {std::tuple{60, 40, 300}, std::tuple{1000, 96, 5000}, std::tuple{4096, 130, 100000}}) {
    const std::string shape = dims({{"N", N}, {"C", C}, {"V", V}});
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["tok"] = i32(hot_tokens(gen, size_t(N), V));
      t["w"] = f32(uniform(gen, size_t(V) * C));
      t["dx"] = f32(uniform(gen, size_t(N) * C));
      t["x"] = f32(std::vector<float>(size_t(N) * C));
      // the prior of an accumulating backward: random where small, a constant where it has millions of values
      t["dw"] =
          size_t(V) * C < (1u << 20) ? f32(uniform(gen, size_t(V) * C)) : f32(std::vector<float>(size_t(V) * C, 0.25f));
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
                 if (acc) dw.assign(t["dw"].f.begin(), t["dw"].f.end());
                 for (int n = 0; n < N; ++n)
                   for (int c = 0; c < C; ++c)
                     dw[size_t(t["tok"].i[size_t(n)]) * C + c] += t["dx"].f[size_t(n) * C + c];
                 t["dw"] = as_f32(dw);
               },
           .cuda_repeatable = true});
  }
}

void gqa_attention_cases(std::vector<KernelCase>& cases) {
  struct Shape {
    int B, T, H, KV, D;
  };
  // grouped, single key/value head, multi-head with an odd head size, D = 256 (over 48 KiB of shared memory),
  // and a single position, where dq and dk are zero by cancellation
  for (Shape s : {Shape{2, 70, 4, 2, 64}, Shape{1, 130, 2, 1, 128}, Shape{2, 33, 3, 3, 40}, Shape{1, 45, 2, 1, 256},
                  Shape{1, 1, 2, 2, 16}}) {
    const std::string shape = dims({{"B", s.B}, {"T", s.T}, {"H", s.H}, {"KV", s.KV}, {"D", s.D}});
    const size_t nq = size_t(s.B) * s.T * s.H * s.D, nk = size_t(s.B) * s.T * s.KV * s.D;
    const size_t nl = size_t(s.B) * s.H * s.T;
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["q"] = f32(uniform(gen, nq, -2.f, 2.f));
      t["k"] = f32(uniform(gen, nk, -2.f, 2.f));
      t["v"] = f32(uniform(gen, nk));
      t["dy"] = f32(uniform(gen, nq));
      std::vector<float> y(nq), lse(nl);
      host().gqa_attention_forward(y.data(), lse.data(), t["q"].f.data(), t["k"].f.data(), t["v"].f.data(), s.B, s.T,
                                   s.H, s.KV, s.D);
      t["y"] = f32(y);
      t["lse"] = f32(lse);
      t["dq"] = f32(std::vector<float>(nq, 1e3f));  // written, not accumulated
      t["dk"] = f32(std::vector<float>(nk, 1e3f));
      t["dv"] = f32(std::vector<float>(nk, 1e3f));
      return t;
    };
    cases.push_back({.name = "gqa_attention_forward " + shape,
                     .make = start,
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           k.gqa_attention_forward(b.f("y"), b.f("lse"), b.f("q"), b.f("k"), b.f("v"), s.B, s.T, s.H,
                                                   s.KV, s.D);
                         },
                     .outs = {{"y", 1e-4}, {"lse", 1e-5}},
                     .cuda_repeatable = true});
    // dq = scale · Σ_j P_ij (dy_i · v_j − dy_i · y_i) k_j, and dk alike with q: terms up to √D |dy| |v| |k|
    // that cancel exactly at T = 1 (P = 1, y = v), where dq and dk are zero and only their rounding is left
    const double terms = std::sqrt(double(s.D)) * 1.0 * 1.0 * 2.0;  // |dy|, |v| ≤ 1; |q|, |k| ≤ 2
    cases.push_back({.name = "gqa_attention_backward " + shape,     // from the CPU forward's y and lse
                     .make = start,
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           float* scratch = b.scratch(k.gqa_attention_scratch_floats(s.B, s.T, s.H, s.KV, s.D));
                           k.gqa_attention_backward(b.f("dq"), b.f("dk"), b.f("dv"), b.f("dy"), b.f("q"), b.f("k"),
                                                    b.f("v"), b.f("y"), b.f("lse"), scratch, s.B, s.T, s.H, s.KV, s.D);
                         },
                     .outs = {{"dq", 1e-3, 1e-5, 1e-4 * terms}, {"dk", 1e-3, 1e-5, 1e-4 * terms}, {"dv", 1e-3}},
                     .cuda_repeatable = true});
  }
}

void moe_row_cases(std::vector<KernelCase>& cases) {
  struct Shape {
    int n, K, m, C;
  };
  // odd width, a power of two, one column, and a row wider than a CUDA block (C > 512)
  for (Shape sh : {Shape{60, 2, 90, 37}, Shape{3000, 4, 9000, 256}, Shape{40, 3, 50, 1}, Shape{100, 8, 500, 1000}}) {
    const std::string shape = dims({{"n", sh.n}, {"K", sh.K}, {"m", sh.m}, {"C", sh.C}});
    const size_t nk = size_t(sh.n) * sh.K, nc = size_t(sh.n) * sh.C, mc = size_t(sh.m) * sh.C;
    auto start = [=](std::mt19937& gen) {
      // rows(m) with repeats; pos(n,K) with repeats, a quarter dropped and the first token fully dropped
      auto pos = tokens(gen, nk, sh.m);
      std::uniform_real_distribution<float> u(0.f, 1.f);
      for (auto& p : pos)
        if (u(gen) < 0.25f) p = -1;
      for (int k = 0; k < sh.K; ++k) pos[size_t(k)] = -1;
      Tensors t;
      t["rows"] = i32(tokens(gen, size_t(sh.m), sh.n));
      t["pos"] = i32(pos);
      t["x"] = f32(uniform(gen, nc));
      t["e"] = f32(uniform(gen, mc));
      t["scale"] = f32(uniform(gen, size_t(sh.m)));
      t["w"] = f32(uniform(gen, nk));
      t["gathered"] = f32(std::vector<float>(mc));
      t["combined"] = f32(uniform(gen, nc));
      t["dots"] = f32(std::vector<float>(nk));
      return t;
    };
    // gather (one product) and combine (one fma per term, k in order) do the CPU's operations: the same to a
    // float's rounding; rows_dot sums in double
    for (bool scaled : {true, false})  // gathered[r] = x[rows[r]] (· scale[r])
      cases.push_back(
          {.name = std::string("gather_rows ") + (scaled ? "" : "unscaled ") + shape,
           .make = start,
           .call =
               [=](Kernels& k, Buffers& b) {
                 k.gather_rows(b.f("gathered"), b.f("x"), b.i("rows"), scaled ? b.f("scale") : nullptr, sh.m, sh.C);
               },
           .outs = {{"gathered", 1e-6, 1e-6}},
           .reference =
               [=](Tensors& t) {
                 for (int r = 0; r < sh.m; ++r)
                   for (int c = 0; c < sh.C; ++c)
                     t["gathered"].f[size_t(r) * sh.C + c] =
                         t["x"].f[size_t(t["rows"].i[size_t(r)]) * sh.C + c] * (scaled ? t["scale"].f[size_t(r)] : 1.f);
               },
           .cuda_repeatable = true});
    for (bool weighted : {true, false})
      for (bool acc : {false, true})  // combined[i] (+)= Σ_k e[pos[i,k]] (· w[i,k]), dropped pos (−1) skipped
        cases.push_back({.name = std::string("combine_rows ") + (weighted ? "" : "unweighted ") +
                                 (acc ? "accumulate " : "") + shape,
                         .make = start,
                         .call =
                             [=](Kernels& k, Buffers& b) {
                               k.combine_rows(b.f("combined"), b.f("e"), b.i("pos"), weighted ? b.f("w") : nullptr,
                                              sh.n, sh.K, sh.C, acc);
                             },
                         .outs = {{"combined", 1e-6, 1e-5}},  // the reference sums in double
                         .reference =
                             [=](Tensors& t) {
                               std::vector<double> out(nc, 0.0);
                               if (acc) out.assign(t["combined"].f.begin(), t["combined"].f.end());
                               for (int i = 0; i < sh.n; ++i)
                                 for (int k = 0; k < sh.K; ++k) {
                                   const int p = t["pos"].i[size_t(i) * sh.K + k];
                                   if (p < 0) continue;
                                   const double wk = weighted ? t["w"].f[size_t(i) * sh.K + k] : 1.0;
                                   for (int c = 0; c < sh.C; ++c)
                                     out[size_t(i) * sh.C + c] += wk * t["e"].f[size_t(p) * sh.C + c];
                                 }
                               t["combined"] = as_f32(out);
                             },
                         .cuda_repeatable = true});
    cases.push_back(
        {.name = "rows_dot " + shape,  // dots[i,k] = x[i] · e[pos[i,k]], 0 where dropped
         .make = start,
         .call = [=](Kernels& k,
                     Buffers& b) { k.rows_dot(b.f("dots"), b.f("x"), b.f("e"), b.i("pos"), sh.n, sh.K, sh.C); },
         .outs = {{"dots", 1e-5, 1e-6}},
         .reference =
             [=](Tensors& t) {
               for (int i = 0; i < sh.n; ++i)
                 for (int k = 0; k < sh.K; ++k) {
                   const int p = t["pos"].i[size_t(i) * sh.K + k];
                   double s = 0;
                   for (int c = 0; p >= 0 && c < sh.C; ++c)
                     s += double(t["x"].f[size_t(i) * sh.C + c]) * t["e"].f[size_t(p) * sh.C + c];
                   t["dots"].f[size_t(i) * sh.K + k] = float(s);
                 }
             },
         .cuda_repeatable = true});
  }
}

}  // namespace

const std::vector<KernelCase>& kernel_cases() {
  static const std::vector<KernelCase> cases = [] {
    std::vector<KernelCase> c;
    linear_cases(c);
    grouped_linear_cases(c);
    layernorm_cases(c);
    attention_cases(c);
    embedding_cases(c);
    softmax_xent_cases(c);
    elementwise_cases(c);
    rmsnorm_cases(c);
    rope_cases(c);
    swiglu_cases(c);
    token_embedding_cases(c);
    gqa_attention_cases(c);
    moe_row_cases(c);
    return c;
  }();
  return cases;
}

}  // namespace piper::test
