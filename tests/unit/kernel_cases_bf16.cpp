// Kernel cases of a bf16 run: its matmuls (Kernels::set_matmul_precision(Bf16)), the linear calls and the products
// inside the attention calls with both operands rounded to bf16 and fp32 accumulation, against double products of
// the rounded operands; and its stashes, stored in bf16 and read back (to_bf16, from_bf16), to the bit of
// util/precision.hpp's rounding.
#include <cmath>

#include "kernel_cases.hpp"
#include "test_util.hpp"
#include "util/precision.hpp"

namespace piper::test {

std::function<void(Kernels&, Buffers&)> in_bf16(std::function<void(Kernels&, Buffers&)> call) {
  return [call](Kernels& k, Buffers& b) {
    struct Fp32Again {
      Kernels& k;
      ~Fp32Again() { k.set_matmul_precision(Precision::Fp32); }
    } again{k};
    k.set_matmul_precision(Precision::Bf16);
    call(k, b);
  };
}

ConstAct as_bf16(Kernels& k, Buffers& b, const std::string& in, size_t n) {
  auto* held = reinterpret_cast<uint16_t*>(b.scratch((n + 1) / 2));
  k.to_bf16(held, b.f(in), n);
  return ConstAct(held, true);
}

void round_in_place(Kernels& k, Buffers& b, const std::string& name, size_t n) {
  auto* held = reinterpret_cast<uint16_t*>(b.scratch((n + 1) / 2));
  k.to_bf16(held, b.f(name), n);
  k.from_bf16(b.f(name), held, n);
}

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

std::vector<double> product(const std::vector<float>& a, const std::vector<float>& b, int n, int in, int out,
                            bool b_transposed) {
  std::vector<double> y(size_t(n) * out, 0.0);
  for (int r = 0; r < n; ++r)
    for (int o = 0; o < out; ++o) {
      double s = 0;
      for (int c = 0; c < in; ++c)
        s += double(a[size_t(r) * in + c]) * (b_transposed ? b[size_t(c) * out + o] : b[size_t(o) * in + c]);
      y[size_t(r) * out + o] = s;
    }
  return y;
}

std::vector<double> linear_forward_ref(const Tensors& t, int N, int C, int OC, bool bf16) {
  auto y = product(bf16 ? rounded(t.at("x").f) : t.at("x").f, bf16 ? rounded(t.at("w").f) : t.at("w").f, N, C, OC,
                   false);
  for (int r = 0; r < N; ++r)
    for (int o = 0; o < OC; ++o) y[size_t(r) * OC + o] += t.at("b").f[size_t(o)];
  return y;
}

namespace {

std::vector<float> transposed(const std::vector<float>& m, int rows, int cols) {
  std::vector<float> t(m.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) t[size_t(c) * rows + r] = m[size_t(r) * cols + c];
  return t;
}

// That `out` is not the fp32 product `fp32` within 1e-4: the operands were rounded (uniform inputs in (-1, 1) move
// the products by up to 2^-8 of their terms' size).
std::function<void(const Tensors&, const Tensors&)> rounded_not_fp32(std::string out,
                                                                     std::function<std::vector<double>(const Tensors&)>
                                                                         fp32) {
  return [=](const Tensors& start, const Tensors& got) {
    const std::vector<double> want = fp32(start);
    const std::vector<float>& y = got.at(out).f;
    double worst = 0, scale = 0;
    for (size_t i = 0; i < y.size(); ++i) scale = std::max(scale, std::abs(want[i]));
    for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::abs(double(y[i]) - want[i]) / scale);
    INFO(out << ": largest difference from the fp32 product " << worst);
    CHECK(worst > 1e-4);
  };
}

void bf16_linear_cases(std::vector<KernelCase>& cases) {
  for (auto [N, C, OC] : {std::tuple{37, 48, 70}, std::tuple{256, 128, 96}, std::tuple{1000, 48, 70}}) {
    const std::string shape = dims({{"N", N}, {"C", C}, {"OC", OC}});
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["x"] = f32(uniform(gen, size_t(N) * C));
      t["w"] = f32(uniform(gen, size_t(OC) * C));
      t["b"] = f32(uniform(gen, OC));
      t["dy"] = f32(uniform(gen, size_t(N) * OC));
      t["y"] = f32(filled(size_t(N) * OC, 123.f));
      t["dgelu"] = f32(filled(size_t(N) * OC, 123.f));
      t["dx"] = f32(uniform(gen, size_t(N) * C));  // the prior of an accumulating backward
      t["dw"] = f32(uniform(gen, size_t(OC) * C));
      return t;
    };
    auto forward = [=](const Tensors& t, bool bf16) { return linear_forward_ref(t, N, C, OC, bf16); };
    cases.push_back({.name = "bf16 linear_forward " + shape,
                     .make = start,
                     .call = in_bf16([=](Kernels& k, Buffers& b) {
                       k.linear_forward(b.f("y"), b.f("x"), b.f("w"), b.f("b"), N, C, OC);
                     }),
                     .outs = {{"y", 1e-4, 1e-4, 0, 1}},
                     .reference = [=](Tensors& t) { t["y"] = as_f32(forward(t, true)); },
                     .threads_rtol = 1e-4,
                     .property = rounded_not_fp32("y", [=](const Tensors& t) { return forward(t, false); })});
    // the product written as bf16 (oneDNN's matmul primitive rounds as it stores, where it is the path): one bf16
    // step from the double product at most (relative to the output's scale), and linear_forward's values rounded to the bit
    cases.push_back({.name = "bf16 linear_forward_to_bf16 " + shape,
                     .make = start,
                     .call = in_bf16([=](Kernels& k, Buffers& b) {
                       const size_t n = size_t(N) * OC;
                       auto* bits = reinterpret_cast<uint16_t*>(b.scratch((n + 1) / 2));
                       k.linear_forward_to_bf16(bits, b.f("x"), b.f("w"), b.f("b"), N, C, OC, b.scratch(n));
                       k.from_bf16(b.f("y"), bits, n);
                     }),
                     .outs = {{"y", 8e-3, 8e-3, 0, 1}},
                     .reference = [=](Tensors& t) { t["y"] = as_f32(forward(t, true)); },
                     .threads_rtol = 8e-3,
                     .twins = {{.what = "linear_forward, then to_bf16",
                                .call = in_bf16([=](Kernels& k, Buffers& b) {
                                  k.linear_forward(b.f("y"), b.f("x"), b.f("w"), b.f("b"), N, C, OC);
                                  round_in_place(k, b, "y", size_t(N) * OC);
                                }),
                                .rtol = 0}}});
    cases.push_back({.name = "bf16 linear_gelu_forward " + shape,
                     .make = start,
                     .call = in_bf16([=](Kernels& k, Buffers& b) {
                       k.linear_gelu_forward(b.f("dgelu"), b.f("y"), b.f("x"), b.f("w"), b.f("b"), N, C, OC);
                     }),
                     .outs = {{"dgelu", 1e-4, 1e-4, 0, 1}, {"y", 1e-4, 1e-4, 0, 1}},
                     .reference =
                         [=](Tensors& t) {
                           auto pre = forward(t, true);
                           std::vector<double> y(pre.size()), dg(pre.size());
                           for (size_t i = 0; i < pre.size(); ++i) y[i] = gelu_ref(pre[i]), dg[i] = gelu_grad_ref(pre[i]);
                           t["y"] = as_f32(y);
                           t["dgelu"] = as_f32(dg);
                         },
                     .threads_rtol = 1e-4});
    for (bool acc : {false, true}) {
      auto dx = [=](const Tensors& t, bool bf16) {  // dx(N,C) = dy(N,OC) · w(OC,C)
        return product(bf16 ? rounded(t.at("dy").f) : t.at("dy").f, bf16 ? rounded(t.at("w").f) : t.at("w").f, N, OC,
                       C, true);
      };
      auto dw = [=](const Tensors& t, bool bf16) {  // dw(OC,C) = dyᵀ · x
        return product(transposed(bf16 ? rounded(t.at("dy").f) : t.at("dy").f, N, OC),
                       bf16 ? rounded(t.at("x").f) : t.at("x").f, OC, N, C, true);
      };
      const std::string a = acc ? "accumulate " : "";
      cases.push_back({.name = "bf16 linear_backward_input " + a + shape,
                       .make = start,
                       .call = in_bf16([=](Kernels& k, Buffers& b) {
                         k.linear_backward_input(b.f("dx"), b.f("dy"), b.f("w"), N, C, OC, acc);
                       }),
                       .outs = {{"dx", 1e-4, 1e-4, 0, 1}},
                       .reference = [=](Tensors& t) { t["dx"] = as_f32(add_prior(dx(t, true), t["dx"].f, acc)); },
                       .threads_rtol = 1e-4,
                       .property = acc ? nullptr : rounded_not_fp32("dx", [=](const Tensors& t) { return dx(t, false); })});
      cases.push_back({.name = "bf16 linear_backward_weight " + a + shape,
                       .make = start,
                       .call = in_bf16([=](Kernels& k, Buffers& b) {
                         k.linear_backward_weight(b.f("dw"), nullptr, b.f("dy"), b.f("x"), N, C, OC, acc);
                       }),
                       .outs = {{"dw", 1e-4, 1e-4, 0, 1}},
                       .reference = [=](Tensors& t) { t["dw"] = as_f32(add_prior(dw(t, true), t["dw"].f, acc)); },
                       .threads_rtol = 1e-4,
                       .property = acc ? nullptr : rounded_not_fp32("dw", [=](const Tensors& t) { return dw(t, false); })});
    }
  }
}

// Three experts' products in one grouped call (one of them empty), against the rounded double products.
void bf16_grouped_cases(std::vector<KernelCase>& cases) {
  constexpr int C = 64, OC = 40;
  const std::vector<int> rows = {37, 0, 90};
  int total = 0;
  for (int n : rows) total += n;
  auto start = [=](std::mt19937& gen) {
    Tensors t;
    t["x"] = f32(uniform(gen, size_t(total) * C));
    t["w"] = f32(uniform(gen, rows.size() * OC * C));
    t["y"] = f32(filled(size_t(total) * OC, 123.f));
    return t;
  };
  cases.push_back({.name = "bf16 linear_forward_grouped",
                   .make = start,
                   .call = in_bf16([=](Kernels& k, Buffers& b) {
                     std::vector<LinearGroup> g;
                     for (size_t e = 0, at = 0; e < rows.size(); at += size_t(rows[e]), ++e)
                       g.push_back({b.f("y") + at * OC, b.f("x") + at * C, b.f("w") + e * OC * C, rows[e], C, OC});
                     k.linear_forward_grouped(g.data(), int(g.size()));
                   }),
                   .outs = {{"y", 1e-4, 1e-4, 0, 1}},
                   .reference =
                       [=](Tensors& t) {
                         std::vector<double> y;
                         const auto x = rounded(t["x"].f), w = rounded(t["w"].f);
                         for (size_t e = 0, at = 0; e < rows.size(); at += size_t(rows[e]), ++e) {
                           std::vector<float> xe(x.begin() + long(at * C), x.begin() + long((at + size_t(rows[e])) * C));
                           std::vector<float> we(w.begin() + long(e * OC * C), w.begin() + long((e + 1) * OC * C));
                           auto ye = product(xe, we, rows[e], C, OC, false);
                           y.insert(y.end(), ye.begin(), ye.end());
                         }
                         t["y"] = as_f32(y);
                       },
                   .threads_rtol = 1e-4});
}

// x → bf16 → y on sizes that split across threads and CUDA blocks, with ties (to even, both ways), values that
// round up into the next binade, zeros of both signs, infinities and the largest floats (which round to infinity).
void bf16_storage_cases(std::vector<KernelCase>& cases) {
  // GPT-2's d(fc pre-activation) in a bf16 run: dy ⊙ gelu' rounded, with its bias gradient from the fp32 products
  for (bool bf16_dgelu : {false, true}) {
    const int N = 300, C = 70;
    const size_t n = size_t(N) * C;
    auto dgelu_of = [=](Kernels& k, Buffers& b) {
      return bf16_dgelu ? as_bf16(k, b, "dgelu", n) : ConstAct(b.f("dgelu"));
    };
    cases.push_back(
        {.name = std::string("gelu_backward, then to_bf16_with_column_sums") + (bf16_dgelu ? " from a bf16 dgelu " : " ") +
                 dims({{"N", N}, {"C", C}}),
         .make =
             [=](std::mt19937& gen) {
               Tensors t;
               t["dy"] = f32(uniform(gen, n));
               t["dgelu"] = f32(uniform(gen, n, -0.13f, 1.13f));  // the range of gelu'
               t["dpre"] = f32(filled(n, 123.f));
               t["db"] = f32(filled(size_t(C), 123.f));
               return t;
             },
         .call =
             [=](Kernels& k, Buffers& b) {
               float* products = b.scratch(n);
               auto* bits = reinterpret_cast<uint16_t*>(b.scratch((n + 1) / 2));
               k.gelu_backward(products, b.f("dy"), dgelu_of(k, b), n);
               k.to_bf16_with_column_sums(bits, b.f("db"), products, N, C);
               k.from_bf16(b.f("dpre"), bits, n);
             },
         .outs = {{"dpre", 0, 0}, {"db", 1e-5, 1e-5, 0, 1}},
         .reference =
             [=](Tensors& t) {
               const std::vector<float> g = bf16_dgelu ? rounded(t["dgelu"].f) : t["dgelu"].f;
               std::vector<float> dpre(n);
               std::vector<double> db(size_t(C), 0.0);
               for (size_t i = 0; i < n; ++i) {
                 const float p = t["dy"].f[i] * g[i];  // the kernels' float product
                 dpre[i] = round_bf16(p);
                 db[i % size_t(C)] += p;
               }
               t["dpre"] = f32(dpre);
               t["db"] = as_f32(db);
             },
         .twins = {{.what = "gelu_backward_to_bf16, without the fp32 products",
                    .call =
                        [=](Kernels& k, Buffers& b) {
                          auto* bits = reinterpret_cast<uint16_t*>(b.scratch((n + 1) / 2));
                          k.gelu_backward_to_bf16(bits, b.f("db"), b.f("dy"), dgelu_of(k, b), N, C);
                          k.from_bf16(b.f("dpre"), bits, n);
                        },
                    .rtol = 0}}});
  }
  for (size_t n : {size_t(5), size_t(70001)}) {
    cases.push_back({.name = "to_bf16 then from_bf16 " + dims({{"n", long(n)}}),
                     .make =
                         [=](std::mt19937& gen) {
                           Tensors t;
                           std::vector<float> x = uniform(gen, n, -3.f, 3.f);
                           const float special[] = {1.f + std::ldexp(1.f, -8), 1.f + 3 * std::ldexp(1.f, -8),
                                                    -(1.f + std::ldexp(1.f, -8)), 1.9999999f, 0.f, -0.f,
                                                    INFINITY, -INFINITY, 3.4e38f, 1e-40f};
                           for (size_t i = 0; i < std::size(special) && i < n; ++i) x[i * (n / std::size(special) + 1) % n] = special[i];
                           t["x"] = f32(x);
                           t["y"] = f32(filled(n, 123.f));
                           return t;
                         },
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           auto* held = reinterpret_cast<uint16_t*>(b.scratch((n + 1) / 2));
                           k.to_bf16(held, b.f("x"), n);
                           k.from_bf16(b.f("y"), held, n);
                         },
                     .outs = {{"y", 0, 0}},
                     .reference =
                         [=](Tensors& t) {
                           std::vector<float> y(n);
                           for (size_t i = 0; i < n; ++i) y[i] = round_bf16(t["x"].f[i]);
                           t["y"] = f32(y);
                         },
                     .cuda_repeatable = true,
                     // the same rounding where column sums are taken in the same pass: one row of 5, or n rows of 1
                     .twins = {{.what = "rounded by to_bf16_with_column_sums",
                                .call =
                                    [=](Kernels& k, Buffers& b) {
                                      const int C = n == 5 ? 5 : 1, N = int(n) / C;
                                      auto* held = reinterpret_cast<uint16_t*>(b.scratch((n + 1) / 2));
                                      k.to_bf16_with_column_sums(held, b.scratch(size_t(C)), b.f("x"), N, C);
                                      k.from_bf16(b.f("y"), held, n);
                                    },
                                .rtol = 0}}});
  }
}

// ---- attention in bf16 matmul precision (kernels.hpp): every product on rounded operands, the rest fp32 ----

// The double references below round what the kernels round. A kernel rounds fp32 values that carry their own errors
// (fp32 sums, exp), so near a tie it may round to the other neighbour: `doubt` is the bf16 step that x may take the
// other way when the kernel's value lies within `window` of x (0 almost always).
using test::rounded;  // the vector's, beside this one
double rounded(double x) { return double(round_bf16(float(x))); }
double doubt(double x, double window) { return std::abs(rounded(x + window) - rounded(x - window)); }

// Relative size of a kernel's fp32 error in P before its rounding (exp of scores summed in fp32 from |q|, |k| ≤ 2):
// a few 1e-7, taken generously.
constexpr double kProbWindow = 3e-5;
// The CPU against the double reference of the rounded operands: fp32 sums only (the products are exact).
constexpr double kRoundedRtol = 1e-4;

// Per element: max(|want|, 1% of the largest |want|) plus the rounding steps a kernel may take the other way,
// divided by the tolerance, so that a comparison at kRoundedRtol allows those steps in full and nothing more.
std::vector<double> doubt_scale(const std::vector<double>& want, const std::vector<double>& doubts) {
  double peak = 0;
  for (double w : want) peak = std::max(peak, std::abs(w));
  std::vector<double> s(want.size());
  for (size_t k = 0; k < want.size(); ++k) s[k] = std::max(std::abs(want[k]), 1e-2 * peak) + doubts[k] / kRoundedRtol;
  return s;
}

// Rows of a (T, D) matrix inside a tensor: element (t, c) at base + t · stride + c.
struct RowsView {
  size_t base, stride;
  size_t at(int t, int c) const { return base + size_t(t) * stride + size_t(c); }
};

// One causal head in bf16 matmul precision, in double from rounded q, k, v (rq, rk, rv: whole tensors rounded):
// P = softmax(scale · q kᵀ); y += round(P) · v into y at yv, with the doubt of each element; lse(T).
void bf16_head_forward(const std::vector<float>& rq, RowsView qv, const std::vector<float>& rk, RowsView kv,
                       const std::vector<float>& rv, RowsView vv, int T, int D, std::vector<double>& y,
                       std::vector<double>& y_doubt, RowsView yv, double* lse) {
  const double scale = 1.0 / std::sqrt(double(D));
  for (int i = 0; i < T; ++i) {
    std::vector<double> p(size_t(i) + 1);
    double mx = -1e300;
    for (int j = 0; j <= i; ++j) {
      double d = 0;
      for (int c = 0; c < D; ++c) d += double(rq[qv.at(i, c)]) * rk[kv.at(j, c)];
      p[size_t(j)] = d * scale;
      mx = std::max(mx, p[size_t(j)]);
    }
    double z = 0;
    for (double& e : p) z += (e = std::exp(e - mx));
    lse[i] = mx + std::log(z);
    for (int j = 0; j <= i; ++j) {
      const double pj = p[size_t(j)] / z, rp = rounded(pj), dp = doubt(pj, kProbWindow * pj);
      for (int c = 0; c < D; ++c) {
        y[yv.at(i, c)] += rp * rv[vv.at(j, c)];
        y_doubt[yv.at(i, c)] += dp * std::abs(double(rv[vv.at(j, c)]));
      }
    }
  }
}

// Its backward given dy (rdy rounded): dP = dy vᵀ, dS = P (dP − Drow), dq += scale · round(dS) k, dk += scale ·
// round(dS)ᵀ q, dv += round(P)ᵀ dy, with doubts. P is exp(scale · q kᵀ − lse); Drow is dy · y from the unrounded dy
// and the forward's y, as the kernels take it.
struct HeadGrads {
  std::vector<double>&dq, &dk, &dv, &dq_doubt, &dk_doubt, &dv_doubt;
};
void bf16_head_backward(const std::vector<float>& rq, RowsView qv, const std::vector<float>& rk, RowsView kv,
                        const std::vector<float>& rv, RowsView vv, const std::vector<float>& rdy,
                        const std::vector<float>& dy, const std::vector<float>& y, RowsView gv, const float* lse,
                        int T, int D, HeadGrads g) {
  const double scale = 1.0 / std::sqrt(double(D));
  for (int i = 0; i < T; ++i) {
    std::vector<double> P(size_t(i) + 1), dP(size_t(i) + 1), size(size_t(i) + 1);
    double drow = 0, drow_size = 0;
    for (int j = 0; j <= i; ++j) {
      double d = 0, m = 0;
      for (int c = 0; c < D; ++c) {
        d += double(rdy[gv.at(i, c)]) * rv[vv.at(j, c)];
        m += std::abs(double(rdy[gv.at(i, c)]) * rv[vv.at(j, c)]);
      }
      dP[size_t(j)] = d;
      size[size_t(j)] = m;
      double s = 0;
      for (int c = 0; c < D; ++c) s += double(rq[qv.at(i, c)]) * rk[kv.at(j, c)];
      P[size_t(j)] = std::exp(s * scale - double(lse[i]));
    }
    for (int c = 0; c < D; ++c) {
      drow += double(dy[gv.at(i, c)]) * y[gv.at(i, c)];
      drow_size += std::abs(double(dy[gv.at(i, c)]) * y[gv.at(i, c)]);
    }
    for (int j = 0; j <= i; ++j) {
      const double p = P[size_t(j)], ds = p * (dP[size_t(j)] - drow);
      // the kernel's dS: fp32 sums of dP and Drow (errors ~1e-7 of their terms' sizes), then two fp32 operations
      const double ds_window = 2e-6 * p * (size[size_t(j)] + drow_size) + 1e-6 * std::abs(ds);
      const double rds = rounded(ds), dds = doubt(ds, ds_window);
      const double rp = rounded(p), dp = doubt(p, kProbWindow * p);
      for (int c = 0; c < D; ++c) {
        g.dq[qv.at(i, c)] += scale * rds * rk[kv.at(j, c)];
        g.dq_doubt[qv.at(i, c)] += scale * dds * std::abs(double(rk[kv.at(j, c)]));
        g.dk[kv.at(j, c)] += scale * rds * rq[qv.at(i, c)];
        g.dk_doubt[kv.at(j, c)] += scale * dds * std::abs(double(rq[qv.at(i, c)]));
        g.dv[vv.at(j, c)] += rp * rdy[gv.at(i, c)];
        g.dv_doubt[vv.at(j, c)] += dp * std::abs(double(rdy[gv.at(i, c)]));
      }
    }
  }
}

// The host's kernels (kernel_cases.hpp) in bf16 matmul precision while alive: a bf16 run's forward, whose outputs
// a backward case starts from.
struct HostInBf16 {
  HostInBf16() { host().set_matmul_precision(Precision::Bf16); }
  ~HostInBf16() { host().set_matmul_precision(Precision::Fp32); }
};

// That each of `outs` differs from what the fp32 kernel (the host's, run here on the same inputs) writes by more
// than 1e-4 of its largest element: the products were rounded (by 2^-9 of their terms, about 1e-3 of the results).
std::function<void(const Tensors&, const Tensors&)> differs_from_fp32_kernel(
    std::vector<std::string> outs, std::function<void(CpuKernels&, Tensors&)> fp32_call) {
  return [=](const Tensors& start, const Tensors& got) {
    Tensors t = start;
    fp32_call(host(), t);
    for (const std::string& out : outs) {
      const std::vector<float>&a = got.at(out).f, &b = t.at(out).f;
      double worst = 0, peak = 0;
      for (float x : b) peak = std::max(peak, double(std::abs(x)));
      for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]) / peak);
      INFO(out << ": largest difference from the fp32 kernel, relative to its largest element: " << worst);
      CHECK(worst > 1e-4);
    }
  };
}

// The tensors of a GPT-2 attention case: qkv(B,T,3C) in (-2, 2), dy(B,T,C); y, lse(B,NH,T) and dqkv filled.
std::function<Tensors(std::mt19937&)> gpt2_attention_start(int B, int T, int C, int NH) {
  const size_t n_qkv = size_t(B) * T * 3 * C, n_y = size_t(B) * T * C, n_lse = size_t(B) * NH * T;
  return [=](std::mt19937& gen) {
    Tensors t;
    t["qkv"] = f32(uniform(gen, n_qkv, -2.f, 2.f));
    t["dy"] = f32(uniform(gen, n_y));
    t["y"] = f32(filled(n_y, 5.f));
    t["lse"] = f32(filled(n_lse, 5.f));
    t["dqkv"] = f32(filled(n_qkv, 1e3f));
    return t;
  };
}

// GPT-2 attention: multi-head (KV = H) on q, k and v as views of its fused qkv(B,T,3C), dq, dk and dv written into
// a fused dqkv; on CUDA the tensor-core kernels (flash style), on the CPU P rounded after its normalisation.
void bf16_gpt2_attention_cases(std::vector<KernelCase>& cases, int B, int T, int C, int NH) {
  const int hd = C / NH;
  const std::string shape = dims({{"B", B}, {"T", T}, {"C", C}, {"NH", NH}});
  const size_t n_qkv = size_t(B) * T * 3 * C, n_y = size_t(B) * T * C, n_lse = size_t(B) * NH * T;
  const HeadRows fused{3 * int64_t(C), 3 * int64_t(C)};
  auto start = gpt2_attention_start(B, T, C, NH);
  // head h of sequence b: q, k, v at columns part · C + h · hd of qkv's rows; y and dy at h · hd of theirs
  auto part = [=](int b, int h, int p) {
    return RowsView{size_t(b) * T * 3 * C + size_t(p) * C + size_t(h) * hd, size_t(3 * C)};
  };
  auto out = [=](int b, int h) { return RowsView{size_t(b) * T * C + size_t(h) * hd, size_t(C)}; };
  auto forward = [=](Kernels& k, float* y, float* lse, ConstAct qkv) {
    k.gqa_attention_forward(y, lse, qkv, qkv.at(C), qkv.at(2 * C), B, T, NH, NH, hd, fused);
  };
  auto backward = [=](Kernels& k, Buffers& b, ConstAct qkv) {
    float* scratch = b.scratch(k.gqa_attention_scratch_floats(B, T, NH, NH, hd));
    float* dqkv = b.f("dqkv");
    k.gqa_attention_backward(dqkv, dqkv + C, dqkv + 2 * C, b.f("dy"), qkv, qkv.at(C), qkv.at(2 * C), b.f("y"),
                             b.f("lse"), scratch, B, T, NH, NH, hd, fused);
  };
  // CUDA against the CPU, as the grouped-query cases below say: y 5e-3 of max(|y|, 2) (v in (-2, 2) here), dqkv
  // 1.5e-2.
  cases.push_back(
      {.name = "bf16 attention_forward fused qkv " + shape,
       .make = start,
       .call = in_bf16([=](Kernels& k, Buffers& b) { forward(k, b.f("y"), b.f("lse"), b.f("qkv")); }),
       .outs = {{"y", 5e-3, kRoundedRtol, 2}, {"lse", 1e-5, 3e-6, 0, 1}},
       .reference =
           [=](Tensors& t) {
             const auto rqkv = rounded(t["qkv"].f);
             std::vector<double> y(n_y, 0.0), y_doubt(n_y, 0.0), lse(n_lse, 0.0);
             for (int b = 0; b < B; ++b)
               for (int h = 0; h < NH; ++h)
                 bf16_head_forward(rqkv, part(b, h, 0), rqkv, part(b, h, 1), rqkv, part(b, h, 2), T, hd, y, y_doubt,
                                   out(b, h), lse.data() + (size_t(b) * NH + h) * T);
             t["y"] = as_f32(y);
             t["y.scale"] = f64(doubt_scale(y, y_doubt));
             t["lse"] = as_f32(lse);
           },
       .threads_rtol = 0,
       .cuda_repeatable = true,
       .twins = {{.what = "from a bf16 qkv",
                  .call = in_bf16([=](Kernels& k, Buffers& b) {
                    forward(k, b.f("y"), b.f("lse"), as_bf16(k, b, "qkv", n_qkv));
                  }),
                  .rtol = 0}},
       .property = differs_from_fp32_kernel({"y"}, [=](CpuKernels& k, Tensors& t) {
         forward(k, t["y"].f.data(), t["lse"].f.data(), t["qkv"].f.data());
       })});
  cases.push_back(
      {.name = "bf16 attention_backward fused qkv " + shape,  // from the CPU's bf16 forward's y and lse
       .make =
           [=](std::mt19937& gen) {
             Tensors t = start(gen);
             HostInBf16 bf16;
             forward(host(), t["y"].f.data(), t["lse"].f.data(), t["qkv"].f.data());
             return t;
           },
       .call = in_bf16([=](Kernels& k, Buffers& b) { backward(k, b, b.f("qkv")); }),
       .outs = {{"dqkv", 1.5e-2, kRoundedRtol}},
       .reference =
           [=](Tensors& t) {
             const auto rqkv = rounded(t["qkv"].f), rdy = rounded(t["dy"].f);
             std::vector<double> d(n_qkv, 0.0), dd(n_qkv, 0.0);
             for (int b = 0; b < B; ++b)
               for (int h = 0; h < NH; ++h)
                 bf16_head_backward(rqkv, part(b, h, 0), rqkv, part(b, h, 1), rqkv, part(b, h, 2), rdy, t["dy"].f,
                                    t["y"].f, out(b, h), t["lse"].f.data() + (size_t(b) * NH + h) * T, T, hd,
                                    HeadGrads{d, d, d, dd, dd, dd});
             t["dqkv"] = as_f32(d);
             t["dqkv.scale"] = f64(doubt_scale(d, dd));
           },
       .threads_rtol = 0,
       .cuda_repeatable = true,
       .twins = {{.what = "from a bf16 qkv",
                  .call = in_bf16([=](Kernels& k, Buffers& b) { backward(k, b, as_bf16(k, b, "qkv", n_qkv)); }),
                  .rtol = 0}},
       .property = differs_from_fp32_kernel({"dqkv"}, [=](CpuKernels& k, Tensors& t) {
         std::vector<float> scratch(k.gqa_attention_scratch_floats(B, T, NH, NH, hd));
         float *qkv = t["qkv"].f.data(), *dqkv = t["dqkv"].f.data();
         k.gqa_attention_backward(dqkv, dqkv + C, dqkv + 2 * C, t["dy"].f.data(), qkv, qkv + C, qkv + 2 * C,
                                  t["y"].f.data(), t["lse"].f.data(), scratch.data(), B, T, NH, NH, hd, fused);
       })});
}

// Grouped-query attention. On CUDA the tensor-core kernels: T = 37 inside one 64-row block, T = 130 over three (the
// last partial; key tiles of 64, query tiles of 32 in dk/dv); D = 8 padded with zero columns to 16.
void bf16_gqa_attention_cases(std::vector<KernelCase>& cases) {
  struct Shape {
    int B, T, H, KV, D;
  };
  // T = 128, D = 32: bf16 q, k, v on AMX tiles where the processor has them (two query blocks)
  for (Shape s : {Shape{2, 37, 4, 2, 64}, Shape{2, 37, 4, 2, 16}, Shape{1, 130, 4, 2, 32}, Shape{1, 37, 2, 1, 8},
                  Shape{1, 128, 4, 2, 32}}) {
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
      t["dq"] = f32(filled(nq, 1e3f));
      t["dk"] = f32(filled(nk, -1e3f));
      t["dv"] = f32(filled(nk, 1e3f));
      return t;
    };
    auto qrows = [=](int b, int h) {
      return RowsView{size_t(b) * s.T * s.H * s.D + size_t(h) * s.D, size_t(s.H) * s.D};
    };
    auto krows = [=](int b, int h) {
      const int kvh = h / (s.H / s.KV);
      return RowsView{size_t(b) * s.T * s.KV * s.D + size_t(kvh) * s.D, size_t(s.KV) * s.D};
    };
    // CUDA against the CPU. Forward: the tensor-core kernel rounds exp(s − running max) before the division by the
    // sum, the CPU the normalised P; either way each P_ij carries a relative rounding error of at most 2^-9, so y
    // differs by at most 2^-8 Σ_j P_ij |v_j| ≤ 2^-8 · max |v| = 2^-8 (v in (-1, 1)), plus fp32 sums: 5e-3 of
    // max(|y|, 1). (Relative to |y| alone there is no such bound: where y cancels, a CPU emulation of the CUDA
    // arithmetic differed by 2e-2 of max(|y|, 1% of the largest), as much as leaving P unrounded does.) Backward:
    // both recompute the normalised P = exp(s − lse) and round it, so only fp32 sums differ, and dS = P (dP − dy·y),
    // which cancels and so differs by far more than fp32's eps between the two and now and then rounds to the other
    // neighbour: one bf16 step (2^-7) of one term of dq or dk each time; emulated on these inputs 3e-3 (T = 130):
    // 1.5e-2.
    cases.push_back(
        {.name = "bf16 gqa_attention_forward " + shape,
         .make = start,
         .call = in_bf16([=](Kernels& k, Buffers& b) {
           k.gqa_attention_forward(b.f("y"), b.f("lse"), b.f("q"), b.f("k"), b.f("v"), s.B, s.T, s.H, s.KV, s.D);
         }),
         .outs = {{"y", 5e-3, kRoundedRtol, 1}, {"lse", 1e-5, 3e-6, 0, 1}},
         .reference =
             [=](Tensors& t) {
               const auto rq = rounded(t["q"].f), rk = rounded(t["k"].f), rv = rounded(t["v"].f);
               std::vector<double> y(nq, 0.0), y_doubt(nq, 0.0), lse(nl, 0.0);
               for (int b = 0; b < s.B; ++b)
                 for (int h = 0; h < s.H; ++h)
                   bf16_head_forward(rq, qrows(b, h), rk, krows(b, h), rv, krows(b, h), s.T, s.D, y, y_doubt,
                                     qrows(b, h), lse.data() + (size_t(b) * s.H + h) * s.T);
               t["y"] = as_f32(y);
               t["y.scale"] = f64(doubt_scale(y, y_doubt));
               t["lse"] = as_f32(lse);
             },
         .threads_rtol = 0,
         .cuda_repeatable = true,
         .twins = {{.what = "from bf16 q, k, v",
                    .call = in_bf16([=](Kernels& k, Buffers& b) {
                      k.gqa_attention_forward(b.f("y"), b.f("lse"), as_bf16(k, b, "q", nq), as_bf16(k, b, "k", nk),
                                              as_bf16(k, b, "v", nk), s.B, s.T, s.H, s.KV, s.D);
                    }),
                    .rtol = 0}},
         .property = differs_from_fp32_kernel({"y"}, [=](CpuKernels& k, Tensors& t) {
           k.gqa_attention_forward(t["y"].f.data(), t["lse"].f.data(), t["q"].f.data(), t["k"].f.data(),
                                   t["v"].f.data(), s.B, s.T, s.H, s.KV, s.D);
         })});
    cases.push_back(
        {.name = "bf16 gqa_attention_backward " + shape,  // from the CPU's bf16 forward's y and lse
         .make =
             [=](std::mt19937& gen) {
               Tensors t = start(gen);
               HostInBf16 bf16;
               host().gqa_attention_forward(t["y"].f.data(), t["lse"].f.data(), t["q"].f.data(), t["k"].f.data(),
                                            t["v"].f.data(), s.B, s.T, s.H, s.KV, s.D);
               return t;
             },
         .call = in_bf16([=](Kernels& k, Buffers& b) {
           float* scratch = b.scratch(k.gqa_attention_scratch_floats(s.B, s.T, s.H, s.KV, s.D));
           k.gqa_attention_backward(b.f("dq"), b.f("dk"), b.f("dv"), b.f("dy"), b.f("q"), b.f("k"), b.f("v"),
                                    b.f("y"), b.f("lse"), scratch, s.B, s.T, s.H, s.KV, s.D);
         }),
         .outs = {{"dq", 1.5e-2, kRoundedRtol}, {"dk", 1.5e-2, kRoundedRtol}, {"dv", 1.5e-2, kRoundedRtol}},
         .reference =
             [=](Tensors& t) {
               const auto rq = rounded(t["q"].f), rk = rounded(t["k"].f), rv = rounded(t["v"].f);
               const auto rdy = rounded(t["dy"].f);
               std::vector<double> dq(nq, 0.0), dk(nk, 0.0), dv(nk, 0.0), dqd(nq, 0.0), dkd(nk, 0.0), dvd(nk, 0.0);
               for (int b = 0; b < s.B; ++b)
                 for (int h = 0; h < s.H; ++h)
                   bf16_head_backward(rq, qrows(b, h), rk, krows(b, h), rv, krows(b, h), rdy, t["dy"].f, t["y"].f,
                                      qrows(b, h), t["lse"].f.data() + (size_t(b) * s.H + h) * s.T, s.T, s.D,
                                      HeadGrads{dq, dk, dv, dqd, dkd, dvd});
               t["dq"] = as_f32(dq);
               t["dk"] = as_f32(dk);
               t["dv"] = as_f32(dv);
               t["dq.scale"] = f64(doubt_scale(dq, dqd));
               t["dk.scale"] = f64(doubt_scale(dk, dkd));
               t["dv.scale"] = f64(doubt_scale(dv, dvd));
             },
         .threads_rtol = 0,
         .cuda_repeatable = true,
         .twins = {{.what = "from bf16 q, k, v",
                    .call = in_bf16([=](Kernels& k, Buffers& b) {
                      float* scratch = b.scratch(k.gqa_attention_scratch_floats(s.B, s.T, s.H, s.KV, s.D));
                      k.gqa_attention_backward(b.f("dq"), b.f("dk"), b.f("dv"), b.f("dy"), as_bf16(k, b, "q", nq),
                                               as_bf16(k, b, "k", nk), as_bf16(k, b, "v", nk), b.f("y"), b.f("lse"),
                                               scratch, s.B, s.T, s.H, s.KV, s.D);
                    }),
                    .rtol = 0}},
         .property = differs_from_fp32_kernel({"dq", "dk", "dv"}, [=](CpuKernels& k, Tensors& t) {
           std::vector<float> scratch(k.gqa_attention_scratch_floats(s.B, s.T, s.H, s.KV, s.D));
           k.gqa_attention_backward(t["dq"].f.data(), t["dk"].f.data(), t["dv"].f.data(), t["dy"].f.data(),
                                    t["q"].f.data(), t["k"].f.data(), t["v"].f.data(), t["y"].f.data(),
                                    t["lse"].f.data(), scratch.data(), s.B, s.T, s.H, s.KV, s.D);
         })});
     // y as a bf16 run holds it (rounded into the stash by the forward): the bits of the call on y rounded first
    cases.push_back(
        {.name = "bf16 gqa_attention_backward from a bf16 y " + shape,
         .make = cases.back().make,
         .call = in_bf16([=](Kernels& k, Buffers& b) {
           float* scratch = b.scratch(k.gqa_attention_scratch_floats(s.B, s.T, s.H, s.KV, s.D));
           k.gqa_attention_backward(b.f("dq"), b.f("dk"), b.f("dv"), b.f("dy"), as_bf16(k, b, "q", nq),
                                    as_bf16(k, b, "k", nk), as_bf16(k, b, "v", nk), as_bf16(k, b, "y", nq), b.f("lse"),
                                    scratch, s.B, s.T, s.H, s.KV, s.D);
         }),
         .outs = {{"dq", 1.5e-2, 0}, {"dk", 1.5e-2, 0}, {"dv", 1.5e-2, 0}},
         .threads_rtol = 0,
         .cuda_repeatable = true,
         .twins = {{.what = "on y rounded first",
                    .call = in_bf16([=](Kernels& k, Buffers& b) {
                      round_in_place(k, b, "y", nq);
                      float* scratch = b.scratch(k.gqa_attention_scratch_floats(s.B, s.T, s.H, s.KV, s.D));
                      k.gqa_attention_backward(b.f("dq"), b.f("dk"), b.f("dv"), b.f("dy"), b.f("q"), b.f("k"),
                                               b.f("v"), b.f("y"), b.f("lse"), scratch, s.B, s.T, s.H, s.KV, s.D);
                    }),
                    .rtol = 0,
                    .outs = {"dq", "dk", "dv"}}}});
  }
}

}  // namespace

void add_bf16_cases(std::vector<KernelCase>& cases) {
  bf16_linear_cases(cases);
  bf16_grouped_cases(cases);
  bf16_storage_cases(cases);
  // T = 64, a head width of 32: a bf16 qkv on AMX tiles where the processor has them
  for (auto [B, T, C, NH] : {std::tuple{2, 37, 96, 3}, std::tuple{2, 64, 64, 2}})
    bf16_gpt2_attention_cases(cases, B, T, C, NH);
  bf16_gqa_attention_cases(cases);
}

}  // namespace piper::test
