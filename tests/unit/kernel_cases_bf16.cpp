// Kernel cases of a bf16 run: its matmuls (Kernels::set_matmul_precision(Bf16)), the linear calls with both operands
// rounded to bf16 and fp32 accumulation, against double products of the rounded operands; and its stashes, stored
// in bf16 and read back (to_bf16, from_bf16), to the bit of util/precision.hpp's rounding.
#include <cmath>

#include "kernel_cases.hpp"
#include "test_util.hpp"
#include "util/precision.hpp"

namespace piper::test {

namespace {

// The call in bf16 matmul precision, the kernels left in fp32 after it.
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

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

// a(n,in) · b (out,in)ᵀ, or with b_transposed b (in,out), in double: (n,out)
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
    // y = x · wᵀ + b over the operands as given (fp32) or rounded to bf16
    auto forward = [=](const Tensors& t, bool bf16) {
      auto y = product(bf16 ? rounded(t.at("x").f) : t.at("x").f, bf16 ? rounded(t.at("w").f) : t.at("w").f, N, C,
                       OC, false);
      for (int r = 0; r < N; ++r)
        for (int o = 0; o < OC; ++o) y[size_t(r) * OC + o] += t.at("b").f[size_t(o)];
      return y;
    };
    cases.push_back({.name = "bf16 linear_forward " + shape,
                     .make = start,
                     .call = in_bf16([=](Kernels& k, Buffers& b) {
                       k.linear_forward(b.f("y"), b.f("x"), b.f("w"), b.f("b"), N, C, OC);
                     }),
                     .outs = {{"y", 1e-4, 1e-4, 0, 1}},
                     .reference = [=](Tensors& t) { t["y"] = as_f32(forward(t, true)); },
                     .threads_rtol = 1e-4,
                     .property = rounded_not_fp32("y", [=](const Tensors& t) { return forward(t, false); })});
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
                     .cuda_repeatable = true});
  }
}

}  // namespace

void add_bf16_cases(std::vector<KernelCase>& cases) {
  bf16_linear_cases(cases);
  bf16_grouped_cases(cases);
  bf16_storage_cases(cases);
}

}  // namespace piper::test
