// Kernel cases of the GPT-2 family: linear (with fused GELU), layernorm, causal multi-head attention, the
// learned-position embedding and the softmax cross-entropy, forward and backward, against double references.
#include <cmath>

#include "kernel_cases.hpp"
#include "test_util.hpp"

namespace piper::test {

namespace {

struct LinearShape {
  int N, C, OC;
};

// x · wᵀ (+ b) in double: (N,OC)
std::vector<double> xw(const Tensors& t, LinearShape s, bool bias) {
  return linear_ref(t.at("x").f, t.at("w").f, bias ? t.at("b").f.data() : nullptr, s.N, s.C, s.OC);
}

void linear_cases(std::vector<KernelCase>& cases) {
  // a small one whose every element gets a finite difference; rows then columns split across threads (dw = dyᵀx
  // splits the other way); several CUDA tiles
  for (LinearShape s : {LinearShape{4, 9, 6}, LinearShape{37, 48, 70}, LinearShape{256, 128, 96},
                        LinearShape{48, 128, 512}, LinearShape{1000, 48, 70}}) {
    const int N = s.N, C = s.C, OC = s.OC;
    const std::string shape = dims({{"N", N}, {"C", C}, {"OC", OC}});
    const bool small = N <= 37;  // finite differences: each probe is a product
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["x"] = f32(uniform(gen, size_t(N) * C));
      t["w"] = f32(uniform(gen, size_t(OC) * C));
      t["b"] = f32(uniform(gen, OC));
      t["dy"] = f32(uniform(gen, size_t(N) * OC));
      t["y"] = f32(filled(size_t(N) * OC, 123.f));  // written, also without a bias
      t["dgelu"] = f32(filled(size_t(N) * OC, 123.f));
      t["dx"] = f32(uniform(gen, size_t(N) * C));  // the prior of an accumulating backward
      t["dw"] = f32(uniform(gen, size_t(OC) * C));
      t["db"] = f32(uniform(gen, OC));
      return t;
    };
    auto loss = [=](const Tensors& t) { return dot(t.at("dy").f, xw(t, s, true)); };  // Σ dy · (x · wᵀ + b)
    for (bool bias : {true, false}) {
      const std::string b_name = bias ? "" : "no bias ";
      cases.push_back({.name = "linear_forward " + b_name + shape,  // y(N,OC) = x · wᵀ (+ b)
                       .make = start,
                       .call =
                           [=](Kernels& k, Buffers& b) {
                             k.linear_forward(b.f("y"), b.f("x"), b.f("w"), bias ? b.f("b") : nullptr, N, C, OC);
                           },
                       .outs = {{"y", 1e-4, 1e-4, 0, 1}},  // float products of up to 128 terms against double
                       .reference = [=](Tensors& t) { t["y"] = as_f32(xw(t, s, bias)); },
                       .gradients = {},
                       .threads_rtol = 1e-4});
      // y = gelu(x · wᵀ (+ b)), dgelu = gelu'(x · wᵀ (+ b))
      cases.push_back({.name = "linear_gelu_forward " + b_name + shape,
                       .make = start,
                       .call =
                           [=](Kernels& k, Buffers& b) {
                             k.linear_gelu_forward(b.f("dgelu"), b.f("y"), b.f("x"), b.f("w"), bias ? b.f("b") : nullptr,
                                                   N, C, OC);
                           },
                       .outs = {{"dgelu", 1e-4, 1e-4, 0, 1}, {"y", 1e-4, 1e-4, 0, 1}},
                       .reference =
                           [=](Tensors& t) {
                             auto pre = xw(t, s, bias);
                             std::vector<double> y(pre.size()), dg(pre.size());
                             for (size_t k = 0; k < pre.size(); ++k) {
                               y[k] = gelu_ref(pre[k]);
                               dg[k] = gelu_grad_ref(pre[k]);
                             }
                             t["y"] = as_f32(y);
                             t["dgelu"] = as_f32(dg);
                           },
                       .gradients = {},
                       .threads_rtol = 1e-4});
    }
    for (bool acc : {false, true}) {  // dx(N,C) (+)= dy · w
      KernelCase c{.name = std::string("linear_backward_input ") + (acc ? "accumulate " : "") + shape,
                   .make = start,
                   .call = [=](Kernels& k,
                               Buffers& b) { k.linear_backward_input(b.f("dx"), b.f("dy"), b.f("w"), N, C, OC, acc); },
                   .outs = {{"dx", 1e-4, 1e-4, 0, 1}},
                   .reference =
                       [=](Tensors& t) {
                         std::vector<double> dx(size_t(N) * C, 0.0);
                         for (int n = 0; n < N; ++n)
                           for (int o = 0; o < OC; ++o)
                             for (int c = 0; c < C; ++c)
                               dx[size_t(n) * C + c] += double(t["dy"].f[size_t(n) * OC + o]) * t["w"].f[size_t(o) * C + c];
                         t["dx"] = as_f32(add_prior(dx, t["dx"].f, acc));
                       },
                   .gradients = acc || !small ? std::vector<Gradient>{} : std::vector<Gradient>{{"x", "dx", loss}},
                   .threads_rtol = 1e-4};
      if (acc)
        c.twins.push_back(overwrite_then_add({{"dx", size_t(N) * C}}, [=](Kernels& k, Buffers& b, auto tmp) {
          k.linear_backward_input(tmp[0], b.f("dy"), b.f("w"), N, C, OC, false);
        }));
      cases.push_back(c);
    }
    for (bool acc : {false, true})  // dw(OC,C) (+)= dyᵀ · x; db(OC) (+)= Σ dy, or untouched when null
      for (bool with_db : {true, false}) {
        KernelCase c{
            .name = std::string("linear_backward_weight ") + (acc ? "accumulate " : "") + (with_db ? "" : "no db ") +
                    shape,
            .make = start,
            .call =
                [=](Kernels& k, Buffers& b) {
                  k.linear_backward_weight(b.f("dw"), with_db ? b.f("db") : nullptr, b.f("dy"), b.f("x"), N, C, OC,
                                           acc);
                },
            .outs = {{"dw", 1e-4, 1e-4, 0, 1}, {"db", 1e-4, 1e-4, 0, 1}},
            .reference =
                [=](Tensors& t) {
                  std::vector<double> dw(size_t(OC) * C, 0.0), db(size_t(OC), 0.0);
                  for (int n = 0; n < N; ++n)
                    for (int o = 0; o < OC; ++o) {
                      const double g = t["dy"].f[size_t(n) * OC + o];
                      db[size_t(o)] += g;
                      for (int c = 0; c < C; ++c) dw[size_t(o) * C + c] += g * t["x"].f[size_t(n) * C + c];
                    }
                  t["dw"] = as_f32(add_prior(dw, t["dw"].f, acc));
                  if (with_db) t["db"] = as_f32(add_prior(db, t["db"].f, acc));
                },
            .gradients = acc || !with_db || !small ? std::vector<Gradient>{}
                                                    : std::vector<Gradient>{{"w", "dw", loss}, {"b", "db", loss}},
            .threads_rtol = 1e-4};
        if (acc && with_db)
          c.twins.push_back(overwrite_then_add({{"dw", size_t(OC) * C}, {"db", size_t(OC)}},
                                               [=](Kernels& k, Buffers& b, auto tmp) {
                                                 k.linear_backward_weight(tmp[0], tmp[1], b.f("dy"), b.f("x"), N, C, OC,
                                                                          false);
                                               }));
        if (with_db && !acc)  // the bias gradient from the fp32 dy while it is rounded (a bf16 run's product gradient)
          c.twins.push_back({.what = "db by to_bf16_with_column_sums",
                             .call =
                                 [=](Kernels& k, Buffers& b) {
                                   auto* bits = reinterpret_cast<uint16_t*>(b.scratch((size_t(N) * OC + 1) / 2));
                                   k.to_bf16_with_column_sums(bits, b.f("db"), b.f("dy"), N, OC);
                                 },
                             .rtol = 0,
                             .outs = {"db"}});
        if (!with_db)  // dw does not depend on whether db is asked for
          c.twins.push_back({.what = "dw with a db",
                             .call =
                                 [=](Kernels& k, Buffers& b) {
                                   float* db = b.scratch(size_t(OC));
                                   k.linear_backward_weight(b.f("dw"), db, b.f("dy"), b.f("x"), N, C, OC, acc);
                                 },
                             .rtol = 0,
                             .outs = {"dw"}});
        cases.push_back(c);
      }
    cases.push_back(
        {.name = "gelu_backward " + shape,  // dpre = dy · dgelu, in place on dy: one float product
         .make =
             [=](std::mt19937& gen) {
               Tensors t;
               t["dy"] = f32(uniform(gen, size_t(N) * OC));
               t["dgelu"] = f32(uniform(gen, size_t(N) * OC, -0.13f, 1.13f));  // the range of gelu'
               return t;
             },
         .call = [=](Kernels& k, Buffers& b) { k.gelu_backward(b.f("dy"), b.f("dy"), b.f("dgelu"), size_t(N) * OC); },
         .outs = {{"dy", 1e-6, 0}},
         .reference =
             [](Tensors& t) {
               for (size_t k = 0; k < t["dy"].f.size(); ++k) t["dy"].f[k] = float(double(t["dy"].f[k]) * t["dgelu"].f[k]);
             },
         .twins = {{.what = "out of place",
                    .call =
                        [=](Kernels& k, Buffers& b) {
                          const size_t n = size_t(N) * OC;
                          float* out = b.scratch(n);
                          k.gelu_backward(out, b.f("dy"), b.f("dgelu"), n);
                          k.copy(b.f("dy"), out, n * sizeof(float));
                        }}}});
  }
}

// gelu and gelu' on a grid, through a 1×1 linear of weight 1. Within |x| ≤ 3 the float tanh-GELU derivative is good
// to about 5e-7; in the tails 1 − tanh² cancels in float (as in any float version of the formula), up to 2.5e-6.
void gelu_grid_cases(std::vector<KernelCase>& cases) {
  for (bool tails : {false, true})
    for (int n : {241, 40000}) {  // the second splits across threads
      cases.push_back(
          {.name = std::string("linear_gelu_forward on a grid ") + (tails ? "3 < |x| <= 12 " : "|x| <= 3 ") +
                   dims({{"n", n}}),
           .make =
               [=](std::mt19937&) {
                 std::vector<float> x(static_cast<size_t>(n));
                 for (int i = 0; i < n; ++i) {
                   const double u = double(i) / double(n - 1);  // [0, 1]
                   x[size_t(i)] = tails ? float((i % 2 ? 1 : -1) * (3.0 + 1e-3 + 9.0 * u)) : float(-3.0 + 6.0 * u);
                 }
                 Tensors t;
                 t["x"] = f32(x);
                 t["one"] = f32({1.f});
                 t["y"] = f32(filled(size_t(n), 5.f));
                 t["dgelu"] = f32(filled(size_t(n), 5.f));
                 return t;
               },
           .call = [=](Kernels& k,
                       Buffers& b) { k.linear_gelu_forward(b.f("dgelu"), b.f("y"), b.f("x"), b.f("one"), nullptr, n, 1, 1); },
           // absolute below 1 (min_scale 1), relative above
           .outs = {{"y", 1e-5, 2e-6, 1.0}, {"dgelu", 1e-5, tails ? 4e-6 : 1e-6, 1.0}},
           .reference =
               [](Tensors& t) {
                 std::vector<double> y, dg;
                 for (float x : t["x"].f) {
                   y.push_back(gelu_ref(x));
                   dg.push_back(gelu_grad_ref(x));
                 }
                 t["y"] = as_f32(y);
                 t["dgelu"] = as_f32(dg);
               }});
    }
  // The chain through the fused forward: L = Σ dy · gelu(x · wᵀ + b); gelu_backward, then both linear backwards.
  const int N = 4, C = 8, OC = 10;
  auto loss = [=](const Tensors& t) {
    auto pre = linear_ref(t.at("x").f, t.at("w").f, t.at("b").f.data(), N, C, OC);
    for (double& v : pre) v = gelu_ref(v);
    return dot(t.at("dy").f, pre);
  };
  cases.push_back({.name = "gelu_backward through linear_gelu_forward " + dims({{"N", N}, {"C", C}, {"OC", OC}}),
                   .make =
                       [=](std::mt19937& gen) {
                         Tensors t;
                         t["x"] = f32(uniform(gen, size_t(N) * C, -2.f, 2.f));
                         t["w"] = f32(uniform(gen, size_t(OC) * C));
                         t["b"] = f32(uniform(gen, OC));
                         t["dy"] = f32(uniform(gen, size_t(N) * OC));
                         std::vector<float> dgelu(size_t(N) * OC), y(size_t(N) * OC);
                         host().linear_gelu_forward(dgelu.data(), y.data(), t["x"].f.data(), t["w"].f.data(),
                                                    t["b"].f.data(), N, C, OC);
                         t["dgelu"] = f32(dgelu);
                         t["dx"] = f32(filled(size_t(N) * C, 1e3f));
                         t["dw"] = f32(filled(size_t(OC) * C, 1e3f));
                         t["db"] = f32(filled(size_t(OC), 1e3f));
                         return t;
                       },
                   .call =
                       [=](Kernels& k, Buffers& b) {
                         float* dpre = b.scratch(size_t(N) * OC);
                         k.gelu_backward(dpre, b.f("dy"), b.f("dgelu"), size_t(N) * OC);
                         k.linear_backward_input(b.f("dx"), dpre, b.f("w"), N, C, OC, false);
                         k.linear_backward_weight(b.f("dw"), b.f("db"), dpre, b.f("x"), N, C, OC, false);
                       },
                   .outs = {{"dx", 1e-4}, {"dw", 1e-4}, {"db", 1e-4}},
                   .reference = {},
                   .gradients = {{"x", "dx", loss}, {"w", "dw", loss}, {"b", "db", loss}}});
}

void layernorm_cases(std::vector<KernelCase>& cases) {
  // small (every element gets a finite difference), odd, rows split across threads (N·C ≥ 32768), wide rows
  for (auto [N, C] : {std::pair{5, 16}, std::pair{70, 96}, std::pair{701, 48}, std::pair{300, 1000}}) {
    const std::string shape = dims({{"N", N}, {"C", C}});
    const bool small = N * C < 100;
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["x"] = f32(uniform(gen, size_t(N) * C, -2.f, 3.f));
      t["w"] = f32(uniform(gen, C, 0.5f, 1.5f));
      t["b"] = f32(uniform(gen, C));
      t["dy"] = f32(uniform(gen, size_t(N) * C));
      t["dx"] = f32(uniform(gen, size_t(N) * C));  // priors
      t["dw"] = f32(uniform(gen, C));
      t["db"] = f32(uniform(gen, C));
      std::vector<float> y(size_t(N) * C), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
      host().layernorm_forward(y.data(), mean.data(), rstd.data(), t["x"].f.data(), t["w"].f.data(), t["b"].f.data(), N,
                               C);
      t["y"] = f32(filled(y.size(), 3.f));
      t["mean"] = f32(mean);
      t["rstd"] = f32(rstd);
      return t;
    };
    auto loss = [=](const Tensors& t) {
      return dot(t.at("dy").f, layernorm_ref(t.at("x").f, t.at("w").f, t.at("b").f, N, C));
    };
    // From the saved mean and rstd: x̂ = (x − mean) · rstd, g = dy · w;
    // dx = rstd · (g − mean(g) − x̂ · mean(g · x̂)), dw = Σ dy · x̂, db = Σ dy
    auto backward = [=](const Tensors& t, std::vector<double>& dx, std::vector<double>& dw, std::vector<double>& db) {
      dx.assign(size_t(N) * C, 0.0);
      dw.assign(size_t(C), 0.0);
      db.assign(size_t(C), 0.0);
      for (int n = 0; n < N; ++n) {
        const double mean = t.at("mean").f[size_t(n)], rstd = t.at("rstd").f[size_t(n)];
        double mg = 0, mgx = 0;
        for (int c = 0; c < C; ++c) {
          const size_t e = size_t(n) * C + c;
          const double xh = (t.at("x").f[e] - mean) * rstd, g = double(t.at("dy").f[e]) * t.at("w").f[size_t(c)];
          mg += g / C;
          mgx += g * xh / C;
          dw[size_t(c)] += double(t.at("dy").f[e]) * xh;
          db[size_t(c)] += t.at("dy").f[e];
        }
        for (int c = 0; c < C; ++c) {
          const size_t e = size_t(n) * C + c;
          const double xh = (t.at("x").f[e] - mean) * rstd, g = double(t.at("dy").f[e]) * t.at("w").f[size_t(c)];
          dx[e] = rstd * (g - mg - xh * mgx);
        }
      }
    };
    cases.push_back({.name = "layernorm_forward " + shape,
                     .make = start,
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           k.layernorm_forward(b.f("y"), b.f("mean"), b.f("rstd"), b.f("x"), b.f("w"), b.f("b"), N, C);
                         },
                     .outs = {{"y", 1e-4, 2e-5, 0, 1}, {"mean", 1e-4, 2e-5, 0, 1}, {"rstd", 1e-4, 2e-5, 0, 1}},
                     .reference =
                         [=](Tensors& t) {
                           std::vector<double> mean, rstd;
                           t["y"] = as_f32(layernorm_ref(t["x"].f, t["w"].f, t["b"].f, N, C, &mean, &rstd));
                           t["mean"] = as_f32(mean);
                           t["rstd"] = as_f32(rstd);
                         }});
    for (bool acc : {false, true}) {
      KernelCase in{.name = std::string("layernorm_backward_input ") + (acc ? "accumulate " : "") + shape,
                    .make = start,
                    .call =
                        [=](Kernels& k, Buffers& b) {
                          k.layernorm_backward_input(b.f("dx"), b.f("dy"), b.f("x"), b.f("mean"), b.f("rstd"), b.f("w"),
                                                     N, C, acc);
                        },
                    .outs = {{"dx", 1e-4, 1e-4, 0, 1}},
                    .reference =
                        [=](Tensors& t) {
                          std::vector<double> dx, dw, db;
                          backward(t, dx, dw, db);
                          t["dx"] = as_f32(add_prior(dx, t["dx"].f, acc));
                        },
                    .gradients = acc || !small ? std::vector<Gradient>{} : std::vector<Gradient>{{"x", "dx", loss}}};
      KernelCase wt{.name = std::string("layernorm_backward_weight ") + (acc ? "accumulate " : "") + shape,
                    .make = start,
                    .call =
                        [=](Kernels& k, Buffers& b) {
                          k.layernorm_backward_weight(b.f("dw"), b.f("db"), b.f("dy"), b.f("x"), b.f("mean"),
                                                      b.f("rstd"), N, C, acc);
                        },
                    .outs = {{"dw", 1e-4, 1e-4, 0, 1}, {"db", 1e-4, 1e-4, 0, 1}},
                    .reference =
                        [=](Tensors& t) {
                          std::vector<double> dx, dw, db;
                          backward(t, dx, dw, db);
                          t["dw"] = as_f32(add_prior(dw, t["dw"].f, acc));
                          t["db"] = as_f32(add_prior(db, t["db"].f, acc));
                        },
                    .gradients = acc || !small ? std::vector<Gradient>{}
                                               : std::vector<Gradient>{{"w", "dw", loss}, {"b", "db", loss}}};
      if (acc) {
        in.twins.push_back(overwrite_then_add({{"dx", size_t(N) * C}}, [=](Kernels& k, Buffers& b, auto tmp) {
          k.layernorm_backward_input(tmp[0], b.f("dy"), b.f("x"), b.f("mean"), b.f("rstd"), b.f("w"), N, C, false);
        }));
        wt.twins.push_back(
            overwrite_then_add({{"dw", size_t(C)}, {"db", size_t(C)}}, [=](Kernels& k, Buffers& b, auto tmp) {
              k.layernorm_backward_weight(tmp[0], tmp[1], b.f("dy"), b.f("x"), b.f("mean"), b.f("rstd"), N, C, false);
            }));
      }
      cases.push_back(in);
      cases.push_back(wt);
    }
  }
}

// GPT-2's attention: multi-head (KV = H) over its fused qkv(B,T,3C), q, k and v as views of it (HeadRows {3C, 3C}),
// dqkv(B,T,3C) written likewise.
void attention_cases(std::vector<KernelCase>& cases) {
  struct Shape {
    int B, T, C, NH;
  };
  // small (finite differences of every element), odd, one CUDA block of 64 rows, head size 8
  for (Shape s : {Shape{2, 6, 8, 2}, Shape{2, 33, 48, 4}, Shape{4, 64, 64, 2}, Shape{3, 7, 24, 3}}) {
    const std::string shape = dims({{"B", s.B}, {"T", s.T}, {"C", s.C}, {"NH", s.NH}});
    const int C = s.C, D = s.C / s.NH;
    const HeadRows fused{3 * int64_t(C), 3 * int64_t(C)};
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["qkv"] = f32(uniform(gen, size_t(s.B) * s.T * 3 * C, -2.f, 2.f));
      t["dy"] = f32(uniform(gen, size_t(s.B) * s.T * C));
      t["y"] = f32(filled(size_t(s.B) * s.T * C, 5.f));
      t["lse"] = f32(filled(size_t(s.B) * s.NH * s.T, 5.f));
      t["dqkv"] = f32(filled(t["qkv"].f.size(), 1e3f));  // written, not accumulated
      return t;
    };
    auto forward = [=](Kernels& k, float* y, float* lse, const float* qkv) {
      k.gqa_attention_forward(y, lse, qkv, qkv + C, qkv + 2 * C, s.B, s.T, s.NH, s.NH, D, fused);
    };
    cases.push_back({.name = "attention_forward fused qkv " + shape,
                     .make = start,
                     .call = [=](Kernels& k, Buffers& b) { forward(k, b.f("y"), b.f("lse"), b.f("qkv")); },
                     .outs = {{"y", 1e-4, 2e-5, 0, 1}, {"lse", 1e-5, 3e-6, 0, 1}},
                     .reference =
                         [=](Tensors& t) {
                           std::vector<double> lse;
                           t["y"] = as_f32(attention_ref(t["qkv"].f, s.B, s.T, C, s.NH, &lse));
                           t["lse"] = as_f32(lse);
                         },
                     .cuda_repeatable = true});
    auto loss = [=](const Tensors& t) { return dot(t.at("dy").f, attention_ref(t.at("qkv").f, s.B, s.T, C, s.NH)); };
    cases.push_back({.name = "attention_backward fused qkv " + shape,  // from the CPU forward's y and lse
                     .make =
                         [=](std::mt19937& gen) {
                           Tensors t = start(gen);
                           forward(host(), t["y"].f.data(), t["lse"].f.data(), t["qkv"].f.data());
                           return t;
                         },
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           float* scratch = b.scratch(k.gqa_attention_scratch_floats(s.B, s.T, s.NH, s.NH, D));
                           float *qkv = b.f("qkv"), *dqkv = b.f("dqkv");
                           k.gqa_attention_backward(dqkv, dqkv + C, dqkv + 2 * C, b.f("dy"), qkv, qkv + C, qkv + 2 * C,
                                                    b.f("y"), b.f("lse"), scratch, s.B, s.T, s.NH, s.NH, D, fused);
                         },
                     .outs = {{"dqkv", 1e-3}},
                     .reference = {},
                     .gradients = s.T < 10 && s.C < 10 ? std::vector<Gradient>{{"qkv", "dqkv", loss}}
                                                       : std::vector<Gradient>{},
                     .cuda_repeatable = true});
  }
}

void embedding_cases(std::vector<KernelCase>& cases) {
  struct Shape {
    int B, T, C, V;
  };
  // small with a token that never occurs (its gradient row is zero when written), odd, split across threads
  for (Shape s : {Shape{2, 6, 8, 5}, Shape{3, 20, 40, 300}, Shape{16, 64, 40, 50}}) {
    const int B = s.B, T = s.T, C = s.C, V = s.V;
    const std::string shape = dims({{"B", B}, {"T", T}, {"C", C}, {"V", V}});
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["tok"] = V == 5 ? i32({0, 1, 1, 3, 0, 2, 3, 3, 1, 0, 2, 1}) : i32(hot_tokens(gen, size_t(B) * T, V));
      t["wte"] = f32(uniform(gen, size_t(V) * C));
      t["wpe"] = f32(uniform(gen, size_t(T) * C));
      t["dx"] = f32(uniform(gen, size_t(B) * T * C));
      t["x"] = f32(filled(size_t(B) * T * C, 9.f));
      t["dwte"] = f32(uniform(gen, size_t(V) * C));  // priors
      t["dwpe"] = f32(uniform(gen, size_t(T) * C));
      return t;
    };
    cases.push_back(
        {.name = "embedding_forward " + shape,  // x(B,T,C) = wte[tok] + wpe[t]
         .make = start,
         .call = [=](Kernels& k,
                     Buffers& b) { k.embedding_forward(b.f("x"), b.i("tok"), b.f("wte"), b.f("wpe"), B, T, C); },
         .outs = {{"x", 1e-6, 0}},  // one float addition
         .reference = [=](Tensors& t) { t["x"] = as_f32(embedding_ref(t["tok"].i, t["wte"].f, t["wpe"].f, B, T, C)); },
         .cuda_repeatable = true});
    auto loss = [=](const Tensors& t) {
      return dot(t.at("dx").f, embedding_ref(t.at("tok").i, t.at("wte").f, t.at("wpe").f, B, T, C));
    };
    for (bool acc_wte : {false, true})
      for (bool acc_wpe : {false, true})
        cases.push_back(
            {.name = std::string("embedding_backward") + (acc_wte ? " accumulate wte" : "") +
                     (acc_wpe ? " accumulate wpe" : "") + " " + shape,
             .make = start,
             .call =
                 [=](Kernels& k, Buffers& b) {
                   k.embedding_backward(b.f("dwte"), b.f("dwpe"), b.f("dx"), b.i("tok"), B, T, C, V, acc_wte, acc_wpe);
                 },
             .outs = {{"dwte", 1e-5, 1e-5, 0, 1}, {"dwpe", 1e-5, 1e-5, 0, 1}},
             .reference =
                 [=](Tensors& t) {  // dwte[tok] (+)= dx, dwpe[t] (+)= Σ_b dx
                   std::vector<double> dwte(t["dwte"].f.size(), 0.0), dwpe(t["dwpe"].f.size(), 0.0);
                   for (int n = 0; n < B * T; ++n)
                     for (int c = 0; c < C; ++c) {
                       dwte[size_t(t["tok"].i[size_t(n)]) * C + c] += t["dx"].f[size_t(n) * C + c];
                       dwpe[size_t(n % T) * C + c] += t["dx"].f[size_t(n) * C + c];
                     }
                   t["dwte"] = as_f32(add_prior(dwte, t["dwte"].f, acc_wte));
                   t["dwpe"] = as_f32(add_prior(dwpe, t["dwpe"].f, acc_wpe));
                 },
             .gradients = acc_wte || acc_wpe || V != 5
                              ? std::vector<Gradient>{}
                              : std::vector<Gradient>{{"wte", "dwte", loss}, {"wpe", "dwpe", loss}},
             .cuda_repeatable = true,
             .twins = {},
             .property = V == 5 ? untouched_row("dwte", 4, C, acc_wte) : nullptr});  // token 4 never occurs
  }
  {
    // vocabulary far larger than the tokens; hot tokens repeat hundreds of times, one over a thousand, next to
    // tokens seen once, the first and the last token id; C not a multiple of CUDA's 64-column tile
    const int B = 4, T = 512, C = 72, V = 151936;
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
      t["dwte"] = f32(filled(size_t(V) * C, 0.25f));  // 11 M values: a constant is quicker to make
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
  struct Shape {
    int N, V;
    float shift;  // rows are shifted by shift · (row % 3): exp overflows float unless the row maximum is taken first
  };
  for (Shape s : {Shape{7, 11, 0.f}, Shape{50, 300, 0.f}, Shape{9, 5000, 0.f}, Shape{600, 64, 200.f}}) {
    const int N = s.N, V = s.V;
    const std::string shape = dims({{"N", N}, {"V", V}}) + (s.shift > 0 ? " shifted rows" : "");
    const float scale = 0.37f;
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      auto logits = uniform(gen, size_t(N) * V, -5.f, 5.f);
      for (int n = 0; n < N; ++n)
        for (int v = 0; v < V; ++v) logits[size_t(n) * V + v] += s.shift * float(n % 3);
      t["logits"] = f32(logits);
      t["targets"] = i32(tokens(gen, size_t(N), V));
      t["loss"] = f64({0.5});  // added to
      return t;
    };
    // loss += scale · Σ −log softmax(logits)[target]; probs in place of the logits
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
                           std::vector<double> probs;
                           t["loss"].d[0] += scale * xent_ref(t["logits"].f, t["targets"].i, N, V, &probs);
                           t["logits"] = as_f32(probs);
                         },
                     .twins = {{.what = "out of place",
                                .call =
                                    [=](Kernels& k, Buffers& b) {
                                      float* probs = b.scratch(size_t(N) * V);
                                      k.softmax_xent_forward(probs, b.d("loss"), b.f("logits"), b.i("targets"), N, V,
                                                             scale);
                                      k.copy(b.f("logits"), probs, sizeof(float) * size_t(N) * V);
                                    }}}});
    // dlogits = scale · (probs − onehot), in place on the probs; d/dlogits of the forward's loss
    auto loss = [=](const Tensors& t) { return scale * xent_ref(t.at("raw").f, t.at("targets").i, N, V); };
    cases.push_back(
        {.name = "softmax_xent_backward " + shape,
         .make =
             [=](std::mt19937& gen) {
               Tensors t = start(gen);
               t["raw"] = t["logits"];
               double unused = 0;
               host().softmax_xent_forward(t["logits"].f.data(), &unused, t["logits"].f.data(), t["targets"].i.data(),
                                           N, V, scale);
               return t;
             },
         .call = [=](Kernels& k,
                     Buffers& b) { k.softmax_xent_backward(b.f("logits"), b.f("logits"), b.i("targets"), N, V, scale); },
         .outs = {{"logits", 1e-4}},
         .reference =
             [=](Tensors& t) {
               std::vector<double> d(t["logits"].f.begin(), t["logits"].f.end());
               for (int n = 0; n < N; ++n) d[size_t(n) * V + size_t(t["targets"].i[size_t(n)])] -= 1.0;
               for (double& v : d) v *= scale;
               t["logits"] = as_f32(d);
             },
         .gradients = N * V < 100 ? std::vector<Gradient>{{"raw", "logits", loss}} : std::vector<Gradient>{},
         .twins = {{.what = "out of place",
                    .call =
                        [=](Kernels& k, Buffers& b) {
                          float* d = b.scratch(size_t(N) * V);
                          k.softmax_xent_backward(d, b.f("logits"), b.i("targets"), N, V, scale);
                          k.copy(b.f("logits"), d, sizeof(float) * size_t(N) * V);
                        }}}});
  }
}

}  // namespace

void add_gpt2_cases(std::vector<KernelCase>& cases) {
  linear_cases(cases);
  gelu_grid_cases(cases);
  layernorm_cases(cases);
  attention_cases(cases);
  embedding_cases(cases);
  softmax_xent_cases(cases);
}

}  // namespace piper::test
