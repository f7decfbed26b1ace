// Kernel cases of the bf16 activations a bf16 run holds where only matmuls read them (kernels.hpp's Act): the norms
// (and RMSNorm's backward), SwiGLU (forward and backward) and the fused GELU write them rounded, the linear calls read
// them; each against the fp32 call rounded after (a twin, to the bit) and the double reference rounded to bf16.
#include <cmath>

#include "kernel_cases.hpp"
#include "qwen3_reference.hpp"
#include "test_util.hpp"
#include "util/precision.hpp"

namespace piper::test {

// `call` writes a bf16 activation of n values (in scratch), which is then widened into the fp32 tensor `out`.
std::function<void(Kernels&, Buffers&)> into_bf16(const std::string& out, size_t n,
                                                  std::function<void(Kernels&, Buffers&, Act)> call) {
  return [=](Kernels& k, Buffers& b) {
    auto* held = reinterpret_cast<uint16_t*>(b.scratch((n + 1) / 2));
    call(k, b, Act(held, true));
    k.from_bf16(b.f(out), held, n);
  };
}

// The twin of a call that writes `outs` (name, values) in bf16: the fp32 call, then each rounded in place (to bf16
// and back).
Twin fp32_then_rounded(std::vector<std::pair<std::string, size_t>> outs,
                       std::function<void(Kernels&, Buffers&)> fp32_call) {
  return {.what = "the fp32 call, then rounded",
          .call =
              [=](Kernels& k, Buffers& b) {
                fp32_call(k, b);
                for (const auto& [out, n] : outs) round_in_place(k, b, out, n);
              },
          .rtol = 0};
}

namespace {

// Against a reference rounded to bf16: a kernel's fp32 value near a tie may round to the other neighbour, one bf16
// step (2^-7 of the value at most) away.
constexpr double kBf16Step = 8e-3;

HostTensor rounded_f32(const std::vector<double>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = round_bf16(float(v[i]));
  return f32(r);
}

void norm_cases(std::vector<KernelCase>& cases) {
  for (auto [N, C] : {std::pair{37, 48}, std::pair{300, 256}}) {
    const std::string shape = dims({{"N", N}, {"C", C}});
    const size_t n = size_t(N) * C;
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["x"] = f32(uniform(gen, n, -2.f, 2.f));
      t["w"] = f32(uniform(gen, size_t(C), 0.5f, 1.5f));
      t["b"] = f32(uniform(gen, size_t(C)));
      t["y"] = f32(filled(n, 3.f));
      t["mean"] = f32(filled(size_t(N), 3.f));
      t["rstd"] = f32(filled(size_t(N), 3.f));
      return t;
    };
    cases.push_back(
        {.name = "layernorm_forward into bf16 " + shape,
         .make = start,
         .call = into_bf16("y", n,
                           [=](Kernels& k, Buffers& b, Act y) {
                             k.layernorm_forward(y, b.f("mean"), b.f("rstd"), b.f("x"), b.f("w"), b.f("b"), N, C);
                           }),
         .outs = {{"y", kBf16Step, kBf16Step, 0, 1}, {"mean", 1e-5, 1e-5, 0, 1}, {"rstd", 1e-5, 1e-5}},
         .reference =
             [=](Tensors& t) {
               std::vector<double> mean, rstd;
               t["y"] = rounded_f32(layernorm_ref(t["x"].f, t["w"].f, t["b"].f, N, C, &mean, &rstd));
               t["mean"] = as_f32(mean);
               t["rstd"] = as_f32(rstd);
             },
         .cuda_repeatable = true,
         .twins = {fp32_then_rounded({{"y", n}}, [=](Kernels& k, Buffers& b) {
           k.layernorm_forward(b.f("y"), b.f("mean"), b.f("rstd"), b.f("x"), b.f("w"), b.f("b"), N, C);
         })}});
    const float eps = 1e-6f;
    cases.push_back(
        {.name = "rmsnorm_forward into bf16 " + shape,
         .make = start,
         .call = into_bf16("y", n,
                           [=](Kernels& k, Buffers& b, Act y) {
                             k.rmsnorm_forward(y, b.f("rstd"), b.f("x"), b.f("w"), N, C, eps);
                           }),
         .outs = {{"y", kBf16Step, kBf16Step, 0, 1}, {"rstd", 1e-5, 1e-5}},
         .reference =
             [=](Tensors& t) {
               t["y"] = rounded_f32(rmsnorm_ref(t["x"].f, t["w"].f, N, C, eps));
               std::vector<double> rstd(static_cast<size_t>(N));
               for (int r = 0; r < N; ++r) {
                 double ss = 0;
                 for (int c = 0; c < C; ++c) ss += double(t["x"].f[size_t(r) * C + c]) * t["x"].f[size_t(r) * C + c];
                 rstd[size_t(r)] = 1.0 / std::sqrt(ss / C + eps);
               }
               t["rstd"] = as_f32(rstd);
             },
         .cuda_repeatable = true,
         .twins = {fp32_then_rounded({{"y", n}}, [=](Kernels& k, Buffers& b) {
           k.rmsnorm_forward(b.f("y"), b.f("rstd"), b.f("x"), b.f("w"), N, C, eps);
         })}});
    // the backward from the saved rstd, dx written in bf16 (Qwen3's q and k norms: dx is a projection's gradient)
    auto with_rstd = [=](std::mt19937& gen) {
      Tensors t = start(gen);
      t["dy"] = f32(uniform(gen, n));
      std::vector<float> y(n), rstd(static_cast<size_t>(N));
      host().rmsnorm_forward(y.data(), rstd.data(), t["x"].f.data(), t["w"].f.data(), N, C, eps);
      t["rstd"] = f32(rstd);
      t["dx"] = f32(filled(n, 3.f));
      return t;
    };
    cases.push_back(
        {.name = "rmsnorm_backward_input into bf16 " + shape,
         .make = with_rstd,
         .call = into_bf16("dx", n,
                           [=](Kernels& k, Buffers& b, Act dx) {
                             k.rmsnorm_backward_input(dx, b.f("dy"), b.f("x"), b.f("rstd"), b.f("w"), N, C, false);
                           }),
         .outs = {{"dx", kBf16Step, kBf16Step, 0, 1}},
         .reference =
             [=](Tensors& t) {  // dx = rstd · (dy · w − x · rstd² · Σ_c dy·w·x / C)
               std::vector<double> dx(n);
               for (int r = 0; r < N; ++r) {
                 const double rs = t["rstd"].f[size_t(r)];
                 double dot = 0;
                 for (int c = 0; c < C; ++c) {
                   const size_t e = size_t(r) * C + c;
                   dot += double(t["dy"].f[e]) * t["w"].f[size_t(c)] * t["x"].f[e];
                 }
                 for (int c = 0; c < C; ++c) {
                   const size_t e = size_t(r) * C + c;
                   dx[e] = rs * (double(t["dy"].f[e]) * t["w"].f[size_t(c)] - double(t["x"].f[e]) * rs * rs * dot / C);
                 }
               }
               t["dx"] = rounded_f32(dx);
             },
         .cuda_repeatable = true,
         .twins = {fp32_then_rounded({{"dx", n}}, [=](Kernels& k, Buffers& b) {
           k.rmsnorm_backward_input(b.f("dx"), b.f("dy"), b.f("x"), b.f("rstd"), b.f("w"), N, C, false);
         })}});
     // from a bf16 x (Qwen3's q and k before their norms): the bits of the calls on x rounded first
    auto from_rounded = [=](std::function<void(Kernels&, Buffers&, ConstAct)> call) {
      return Twin{.what = "on x rounded first",
                  .call =
                      [=](Kernels& k, Buffers& b) {
                        round_in_place(k, b, "x", n);
                        call(k, b, b.f("x"));
                      },
                  .rtol = 0};
    };
    auto forward = [=](Kernels& k, Buffers& b, ConstAct x) {
      k.rmsnorm_forward(b.f("y"), b.f("rstd"), x, b.f("w"), N, C, eps);
    };
    cases.push_back({.name = "rmsnorm_forward from a bf16 x " + shape,
                     .make = start,
                     .call = [=](Kernels& k, Buffers& b) { forward(k, b, as_bf16(k, b, "x", n)); },
                     .outs = {{"y", 1e-5, 0}, {"rstd", 1e-5, 0}},
                     .cuda_repeatable = true,
                     .twins = {from_rounded(forward)}});
    auto backward = [=](Kernels& k, Buffers& b, ConstAct x) {
      k.rmsnorm_backward_input(b.f("dx"), b.f("dy"), x, b.f("rstd"), b.f("w"), N, C, true);
      k.rmsnorm_backward_weight(b.f("dw"), b.f("dy"), x, b.f("rstd"), N, C, true);
    };
    cases.push_back({.name = "rmsnorm_backward_input and _weight from a bf16 x " + shape,
                     .make =
                         [=](std::mt19937& gen) {
                           Tensors t = with_rstd(gen);
                           t["dw"] = f32(uniform(gen, size_t(C)));
                           return t;
                         },
                     .call = [=](Kernels& k, Buffers& b) { backward(k, b, as_bf16(k, b, "x", n)); },
                     .outs = {{"dx", 1e-5, 0}, {"dw", 1e-5, 0}},
                     .cuda_repeatable = true,
                     .twins = {from_rounded(backward)}});
  }
}

void swiglu_cases(std::vector<KernelCase>& cases) {
  for (size_t n : {size_t(5), size_t(70001)}) {
    cases.push_back({.name = "swiglu_forward into bf16 " + dims({{"n", long(n)}}),
                     .make =
                         [=](std::mt19937& gen) {
                           Tensors t;
                           t["g"] = f32(uniform(gen, n, -4.f, 4.f));
                           t["u"] = f32(uniform(gen, n, -2.f, 2.f));
                           t["a"] = f32(filled(n, 3.f));
                           return t;
                         },
                     .call = into_bf16("a", n,
                                       [=](Kernels& k, Buffers& b, Act a) {
                                         k.swiglu_forward(a, b.f("g"), b.f("u"), n);
                                       }),
                     .outs = {{"a", kBf16Step, kBf16Step, 0, 1}},
                     .reference =
                         [=](Tensors& t) {
                           std::vector<double> a(n);
                           for (size_t i = 0; i < n; ++i) {
                             const double g = t["g"].f[i];
                             a[i] = g / (1.0 + std::exp(-g)) * t["u"].f[i];
                           }
                           t["a"] = rounded_f32(a);
                         },
                     .cuda_repeatable = true,
                     .twins = {fp32_then_rounded({{"a", n}}, [=](Kernels& k, Buffers& b) {
                       k.swiglu_forward(b.f("a"), b.f("g"), b.f("u"), n);
                     })}});
  }
}

// SwiGLU's backward writing dg and du in bf16 (the gradients only matmuls read).
void swiglu_backward_cases(std::vector<KernelCase>& cases) {
  for (size_t n : {size_t(5), size_t(70001)}) {
    cases.push_back(
        {.name = "swiglu_backward into bf16 " + dims({{"n", long(n)}}),
         .make =
             [=](std::mt19937& gen) {
               Tensors t;
               t["g"] = f32(uniform(gen, n, -4.f, 4.f));
               t["u"] = f32(uniform(gen, n, -2.f, 2.f));
               t["da"] = f32(uniform(gen, n));
               t["dg"] = f32(filled(n, 3.f));
               t["du"] = f32(filled(n, 3.f));
               return t;
             },
         .call =
             [=](Kernels& k, Buffers& b) {
               auto* held = reinterpret_cast<uint16_t*>(b.scratch(n + 1));  // dg's n bf16, then du's
               uint16_t* dg = held;
               uint16_t* du = held + (n + 1) / 2 * 2;
               k.swiglu_backward(Act(dg, true), Act(du, true), b.f("da"), b.f("g"), b.f("u"), n);
               k.from_bf16(b.f("dg"), dg, n);
               k.from_bf16(b.f("du"), du, n);
             },
         .outs = {{"dg", kBf16Step, kBf16Step, 0, 1}, {"du", kBf16Step, kBf16Step, 0, 1}},
         .reference =
             [=](Tensors& t) {
               std::vector<double> dg(n), du(n);
               for (size_t i = 0; i < n; ++i) {
                 const double g = t["g"].f[i], sig = 1.0 / (1.0 + std::exp(-g)), da = t["da"].f[i];
                 dg[i] = da * t["u"].f[i] * sig * (1.0 + g * (1.0 - sig));
                 du[i] = da * g * sig;
               }
               t["dg"] = rounded_f32(dg);
               t["du"] = rounded_f32(du);
             },
         .cuda_repeatable = true,
         .twins = {fp32_then_rounded({{"dg", n}, {"du", n}}, [=](Kernels& k, Buffers& b) {
           k.swiglu_backward(b.f("dg"), b.f("du"), b.f("da"), b.f("g"), b.f("u"), n);
         })}});
  }
}

// The linear calls of a bf16 run on bf16 activations: the same bits as on the fp32 values they round.
void linear_cases(std::vector<KernelCase>& cases) {
  for (auto [N, C, OC] : {std::tuple{37, 48, 70}, std::tuple{256, 128, 96}}) {
    const std::string shape = dims({{"N", N}, {"C", C}, {"OC", OC}});
    const size_t nx = size_t(N) * C, ny = size_t(N) * OC;
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["x"] = f32(uniform(gen, nx));
      t["w"] = f32(uniform(gen, size_t(OC) * C));
      t["b"] = f32(uniform(gen, size_t(OC)));
      t["dy"] = f32(uniform(gen, ny));
      t["y"] = f32(filled(ny, 123.f));
      t["dgelu"] = f32(filled(ny, 123.f));
      t["dw"] = f32(uniform(gen, size_t(OC) * C));  // the priors of an accumulating backward
      t["dx"] = f32(uniform(gen, nx));
      return t;
    };
    auto forward = [=](const Tensors& t) { return linear_forward_ref(t, N, C, OC, true); };
    cases.push_back({.name = "bf16 linear_forward from bf16 " + shape,
                     .make = start,
                     .call = in_bf16([=](Kernels& k, Buffers& b) {
                       k.linear_forward(b.f("y"), as_bf16(k, b, "x", nx), b.f("w"), b.f("b"), N, C, OC);
                     }),
                     .outs = {{"y", 1e-4, 1e-4, 0, 1}},
                     .reference = [=](Tensors& t) { t["y"] = as_f32(forward(t)); },
                     .threads_rtol = 1e-4,
                     .twins = {{.what = "on the fp32 values",
                                .call = in_bf16([=](Kernels& k, Buffers& b) {
                                  k.linear_forward(b.f("y"), b.f("x"), b.f("w"), b.f("b"), N, C, OC);
                                }),
                                .rtol = 0}}});
    cases.push_back(
        {.name = "bf16 linear_gelu_forward from and into bf16 " + shape,
         .make = start,
         .call = in_bf16(into_bf16("y", ny,
                                   [=](Kernels& k, Buffers& b, Act y) {
                                     k.linear_gelu_forward(b.f("dgelu"), y, as_bf16(k, b, "x", nx), b.f("w"), b.f("b"),
                                                           N, C, OC);
                                   })),
         .outs = {{"y", kBf16Step, kBf16Step, 0, 1}, {"dgelu", 1e-4, 1e-4, 0, 1}},
         .reference =
             [=](Tensors& t) {
               auto pre = forward(t);
               std::vector<double> y(pre.size()), dg(pre.size());
               for (size_t i = 0; i < pre.size(); ++i) y[i] = gelu_ref(pre[i]), dg[i] = gelu_grad_ref(pre[i]);
               t["y"] = rounded_f32(y);
               t["dgelu"] = as_f32(dg);
             },
         .threads_rtol = 1e-4,
         .twins = {fp32_then_rounded({{"y", ny}}, in_bf16([=](Kernels& k, Buffers& b) {
           k.linear_gelu_forward(b.f("dgelu"), b.f("y"), b.f("x"), b.f("w"), b.f("b"), N, C, OC);
         }))}});
    for (bool acc : {false, true}) {
      cases.push_back({.name = std::string("bf16 linear_backward_input from bf16 ") + (acc ? "accumulate " : "") + shape,
                       .make = start,
                       .call = in_bf16([=](Kernels& k, Buffers& b) {
                         k.linear_backward_input(b.f("dx"), as_bf16(k, b, "dy", ny), b.f("w"), N, C, OC, acc);
                       }),
                       .outs = {{"dx", 1e-4, 1e-4, 0, 1}},
                       .reference =
                           [=](Tensors& t) {
                             t["dx"] = as_f32(
                                 add_prior(product(rounded(t["dy"].f), rounded(t["w"].f), N, OC, C, true), t["dx"].f, acc));
                           },
                       .threads_rtol = 1e-4,
                       .twins = {{.what = "on the fp32 values",
                                  .call = in_bf16([=](Kernels& k, Buffers& b) {
                                    k.linear_backward_input(b.f("dx"), b.f("dy"), b.f("w"), N, C, OC, acc);
                                  }),
                                  .rtol = 0}}});
      cases.push_back({.name = std::string("bf16 linear_backward_weight from bf16 dy and x ") + (acc ? "accumulate " : "") +
                               shape,
                       .make = start,
                       .call = in_bf16([=](Kernels& k, Buffers& b) {
                         k.linear_backward_weight(b.f("dw"), nullptr, as_bf16(k, b, "dy", ny), as_bf16(k, b, "x", nx),
                                                  N, C, OC, acc);
                       }),
                       .outs = {{"dw", 1e-4, 1e-4, 0, 1}},
                       .threads_rtol = 1e-4,
                       .twins = {{.what = "on the fp32 values",
                                  .call = in_bf16([=](Kernels& k, Buffers& b) {
                                    k.linear_backward_weight(b.f("dw"), nullptr, b.f("dy"), b.f("x"), N, C, OC, acc);
                                  }),
                                  .rtol = 0}}});
      cases.push_back({.name = std::string("bf16 linear_backward_weight from bf16 ") + (acc ? "accumulate " : "") + shape,
                       .make = start,
                       .call = in_bf16([=](Kernels& k, Buffers& b) {
                         k.linear_backward_weight(b.f("dw"), nullptr, b.f("dy"), as_bf16(k, b, "x", nx), N, C, OC,
                                                  acc);
                       }),
                       .outs = {{"dw", 1e-4, 1e-4, 0, 1}},
                       .reference =
                           [=](Tensors& t) {
                             std::vector<float> dyt(ny);  // dy transposed (OC,N)
                             for (int r = 0; r < N; ++r)
                               for (int o = 0; o < OC; ++o) dyt[size_t(o) * N + r] = t["dy"].f[size_t(r) * OC + o];
                             t["dw"] = as_f32(add_prior(product(rounded(dyt), rounded(t["x"].f), OC, N, C, true),
                                                        t["dw"].f, acc));
                           },
                       .threads_rtol = 1e-4,
                       .twins = {{.what = "on the fp32 values",
                                  .call = in_bf16([=](Kernels& k, Buffers& b) {
                                    k.linear_backward_weight(b.f("dw"), nullptr, b.f("dy"), b.f("x"), N, C, OC, acc);
                                  }),
                                  .rtol = 0}}});
    }
  }
}

// `names` (n values each) rounded to bf16 in place.
void round_each(Kernels& k, Buffers& b, const std::vector<std::string>& names, size_t n) {
  for (const std::string& name : names) round_in_place(k, b, name, n);
}

// The elementwise kernels that read what a held stash gives back in bf16 (GELU's derivative, SwiGLU's g and u) from
// bf16 activations, and GELU's derivative written so: the same bits as the fp32 call on the values rounded before
// (or its results rounded after).
void stash_input_cases(std::vector<KernelCase>& cases) {
  for (size_t n : {size_t(5), size_t(70001)}) {
    const std::string shape = dims({{"n", long(n)}});
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["g"] = f32(uniform(gen, n, -4.f, 4.f));
      t["u"] = f32(uniform(gen, n, -2.f, 2.f));
      t["da"] = f32(uniform(gen, n));
      t["a"] = f32(filled(n, 3.f));
      t["dg"] = f32(filled(n, 3.f));
      t["du"] = f32(filled(n, 3.f));
      t["dy"] = f32(uniform(gen, n));
      t["dgelu"] = f32(uniform(gen, n, 0.f, 1.2f));
      return t;
    };
    cases.push_back({.name = "swiglu_forward from bf16 g and u " + shape,
                     .make = start,
                     .call = [=](Kernels& k, Buffers& b) {
                       k.swiglu_forward(b.f("a"), as_bf16(k, b, "g", n), as_bf16(k, b, "u", n), n);
                     },
                     .outs = {{"a", 1e-5, 4e-6, 0, 1}},
                     .cuda_repeatable = true,
                     .twins = {{.what = "on g and u rounded first",
                                .call = [=](Kernels& k, Buffers& b) {
                                  round_each(k, b, {"g", "u"}, n);
                                  k.swiglu_forward(b.f("a"), b.f("g"), b.f("u"), n);
                                },
                                .rtol = 0}}});
    cases.push_back({.name = "swiglu_backward from bf16 g and u " + shape,
                     .make = start,
                     .call = [=](Kernels& k, Buffers& b) {
                       k.swiglu_backward(b.f("dg"), b.f("du"), b.f("da"), as_bf16(k, b, "g", n),
                                         as_bf16(k, b, "u", n), n);
                     },
                     .outs = {{"dg", 1e-5, 4e-6, 0, 1}, {"du", 1e-5, 4e-6, 0, 1}},
                     .cuda_repeatable = true,
                     .twins = {{.what = "on g and u rounded first",
                                .call = [=](Kernels& k, Buffers& b) {
                                  round_each(k, b, {"g", "u"}, n);
                                  k.swiglu_backward(b.f("dg"), b.f("du"), b.f("da"), b.f("g"), b.f("u"), n);
                                },
                                .rtol = 0}}});
    cases.push_back({.name = "gelu_backward from a bf16 dgelu " + shape,
                     .make = start,
                     .call = [=](Kernels& k, Buffers& b) {
                       k.gelu_backward(b.f("dy"), b.f("dy"), as_bf16(k, b, "dgelu", n), n);
                     },
                     .outs = {{"dy", 1e-6, 0}},
                     .cuda_repeatable = true,
                     .twins = {{.what = "on dgelu rounded first",
                                .call = [=](Kernels& k, Buffers& b) {
                                  round_each(k, b, {"dgelu"}, n);
                                  k.gelu_backward(b.f("dy"), b.f("dy"), b.f("dgelu"), n);
                                },
                                .rtol = 0,
                                .outs = {"dy"}}}});
  }
  for (auto [N, C, OC] : {std::tuple{37, 48, 70}, std::tuple{256, 128, 96}}) {
    const std::string shape = dims({{"N", N}, {"C", C}, {"OC", OC}});
    const size_t nx = size_t(N) * C, ny = size_t(N) * OC;
    cases.push_back(
        {.name = "bf16 linear_gelu_forward into bf16 y and dgelu " + shape,
         .make =
             [=](std::mt19937& gen) {
               Tensors t;
               t["x"] = f32(uniform(gen, nx));
               t["w"] = f32(uniform(gen, size_t(OC) * C));
               t["b"] = f32(uniform(gen, size_t(OC)));
               t["y"] = f32(filled(ny, 123.f));
               t["dgelu"] = f32(filled(ny, 123.f));
               return t;
             },
         .call = in_bf16([=](Kernels& k, Buffers& b) {
           auto* y = reinterpret_cast<uint16_t*>(b.scratch((ny + 1) / 2));
           auto* dgelu = reinterpret_cast<uint16_t*>(b.scratch((ny + 1) / 2));
           k.linear_gelu_forward(Act(dgelu, true), Act(y, true), as_bf16(k, b, "x", nx), b.f("w"), b.f("b"), N, C,
                                 OC, b.scratch(ny));
           k.from_bf16(b.f("y"), y, ny);
           k.from_bf16(b.f("dgelu"), dgelu, ny);
         }),
         .outs = {{"y", kBf16Step, kBf16Step, 0, 1}, {"dgelu", kBf16Step, kBf16Step, 0, 1}},
         .threads_rtol = kBf16Step,
         .twins = {fp32_then_rounded({{"y", ny}, {"dgelu", ny}}, in_bf16([=](Kernels& k, Buffers& b) {
           k.linear_gelu_forward(b.f("dgelu"), b.f("y"), b.f("x"), b.f("w"), b.f("b"), N, C, OC);
         }))}});
  }
}

}  // namespace

void add_bf16_activation_cases(std::vector<KernelCase>& cases) {
  norm_cases(cases);
  swiglu_cases(cases);
  swiglu_backward_cases(cases);
  linear_cases(cases);
  stash_input_cases(cases);
}

}  // namespace piper::test
