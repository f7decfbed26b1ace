// Kernel cases of a bf16 run's routed rows (the experts' inputs and outputs held and exchanged as bf16): gather_rows
// into bf16, combine_rows and rows_dot from bf16 rows, and the grouped products reading bf16 operands; each against
// its fp32 call with the rows rounded (a twin, to the bit) and a double reference of the rounded values.
#include <cmath>

#include "kernel_cases.hpp"
#include "util/precision.hpp"

namespace piper::test {

namespace {

struct Rows {
  int n, K, m, C;  // tokens, slots per token, expert rows, width
};

// rows(m): a token per expert row, the last fifth -1 (past the kept rows); pos(n,K): an expert row per slot, a
// quarter dropped (-1), and slots of different tokens on one row.
Tensors routed(std::mt19937& gen, const Rows& s) {
  std::vector<int32_t> rows = tokens(gen, size_t(s.m), s.n), pos = tokens(gen, size_t(s.n) * s.K, s.m);
  for (int a = s.m - s.m / 5; a < s.m; ++a) rows[size_t(a)] = -1;
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (auto& p : pos)
    if (u(gen) < 0.25f) p = -1;
  const size_t nc = size_t(s.n) * s.C, mc = size_t(s.m) * s.C, nk = size_t(s.n) * s.K;
  Tensors t;
  t["rows"] = i32(rows);
  t["pos"] = i32(pos);
  t["scale"] = f32(uniform(gen, size_t(s.m)));
  t["w"] = f32(uniform(gen, nk));
  t["x"] = f32(uniform(gen, nc));   // token rows (n,C)
  t["e"] = f32(uniform(gen, mc));   // expert rows (m,C)
  t["gathered"] = f32(filled(mc, std::nanf("")));
  t["combined"] = f32(uniform(gen, nc));
  t["dots"] = f32(filled(nk, std::nanf("")));
  return t;
}

void row_cases(std::vector<KernelCase>& cases) {
  for (Rows s : {Rows{60, 2, 90, 37}, Rows{300, 4, 1000, 256}, Rows{12, 8, 100, 600}}) {
    const std::string shape = dims({{"n", s.n}, {"K", s.K}, {"m", s.m}, {"C", s.C}});
    const size_t mc = size_t(s.m) * s.C;
    auto start = [=](std::mt19937& gen) { return routed(gen, s); };
    for (bool scaled : {true, false}) {  // gathered[a] = bf16(x[rows[a]] (· scale[a])): one float product, rounded
      auto gather = [=](Kernels& k, Buffers& b, Act dst) {
        k.gather_rows(dst, b.f("x"), b.i("rows"), scaled ? b.f("scale") : nullptr, s.m, s.C);
      };
      cases.push_back(
          {.name = std::string("gather_rows into bf16 ") + (scaled ? "" : "unscaled ") + shape,
           .make = start,
           .call = into_bf16("gathered", mc, gather),
           .outs = {{"gathered", 0, 0}},
           .reference =
               [=](Tensors& t) {
                 for (int a = 0; a < s.m; ++a) {
                   const int r = t["rows"].i[size_t(a)];
                   for (int c = 0; c < s.C; ++c)
                     t["gathered"].f[size_t(a) * s.C + c] =
                         r < 0 ? 0.f
                               : round_bf16(float(double(t["x"].f[size_t(r) * s.C + c]) *
                                                  (scaled ? t["scale"].f[size_t(a)] : 1.f)));
                 }
               },
           .cuda_repeatable = true,
           .twins = {fp32_then_rounded({{"gathered", mc}}, [=](Kernels& k, Buffers& b) {
             gather(k, b, Act(b.f("gathered")));
           })}});
    }
    for (bool acc : {false, true}) {  // combined[i] (+)= Σ_k w[i,k] · bf16(e)[pos[i,k]], in k order
      cases.push_back(
          {.name = std::string("combine_rows from bf16 rows ") + (acc ? "accumulate " : "") + shape,
           .make = start,
           .call =
               [=](Kernels& k, Buffers& b) {
                 k.combine_rows(b.f("combined"), as_bf16(k, b, "e", mc), b.i("pos"), b.f("w"), s.n, s.K, s.C, acc);
               },
           .outs = {{"combined", 1e-6, 1e-6}},  // of the sum of the terms' magnitudes
           .reference = [=](Tensors& t) { combine_rows_reference(t, rounded(t["e"].f), s.n, s.K, s.C, true, acc); },
           .cuda_repeatable = true,
           .twins = {{.what = "the fp32 rows rounded",
                      .call =
                          [=](Kernels& k, Buffers& b) {
                            round_in_place(k, b, "e", mc);
                            k.combine_rows(b.f("combined"), b.f("e"), b.i("pos"), b.f("w"), s.n, s.K, s.C, acc);
                          }}}});
    }
    cases.push_back(
        {.name = "rows_dot from bf16 rows " + shape,  // dots[i,k] = x[i] · bf16(e)[pos[i,k]], summed in double
         .make = start,
         .call =
             [=](Kernels& k, Buffers& b) {
               k.rows_dot(b.f("dots"), b.f("x"), as_bf16(k, b, "e", mc), b.i("pos"), s.n, s.K, s.C);
             },
         .outs = {{"dots", 1e-5, 1.2e-7}},  // one float rounding of the result, plus the double rounding of the terms
         .reference = [=](Tensors& t) { rows_dot_reference(t, rounded(t["e"].f), s.n, s.K, s.C); },
         .cuda_repeatable = true,
         .twins = {{.what = "the fp32 rows rounded", .call = [=](Kernels& k, Buffers& b) {
                      round_in_place(k, b, "e", mc);
                      k.rows_dot(b.f("dots"), b.f("x"), b.f("e"), b.i("pos"), s.n, s.K, s.C);
                    }}}});
  }
}

// The grouped products of the experts in bf16 matmul precision with the routed rows given as bf16: the same bits as
// the fp32 rows, which the products round themselves. Experts of 37, 0 and 90 rows; C → OC (gate, up) and back.
void grouped_cases(std::vector<KernelCase>& cases) {
  constexpr int C = 64, OC = 40;
  const std::vector<int> counts = {37, 0, 90};
  int total = 0;
  for (int n : counts) total += n;
  auto start = [=](std::mt19937& gen) {
    Tensors t;
    t["x"] = f32(uniform(gen, size_t(total) * C));    // routed rows (total,C)
    t["dy"] = f32(uniform(gen, size_t(total) * OC));  // d expert outputs (total,OC)
    t["w"] = f32(uniform(gen, counts.size() * OC * C));
    t["y"] = f32(filled(size_t(total) * OC, 123.f));
    t["dx"] = f32(filled(size_t(total) * C, 123.f));
    t["dw"] = f32(uniform(gen, counts.size() * OC * C));  // accumulated into
    return t;
  };
  // The groups of `kind` with x and dy as given: each expert's rows from its first on.
  enum Kind { Forward, BackwardInput, BackwardWeight };
  auto groups = [=](Buffers& b, Kind kind, ConstAct x, ConstAct dy) {
    std::vector<LinearGroup> g;
    for (size_t e = 0, at = 0; e < counts.size(); at += size_t(counts[e]), ++e) {
      const int n = counts[e];
      float* w = b.f("w") + e * OC * C;
      if (kind == Forward) g.push_back({b.f("y") + at * OC, x.at(int64_t(at) * C), w, n, C, OC});
      if (kind == BackwardInput) g.push_back({b.f("dx") + at * C, dy.at(int64_t(at) * OC), w, n, C, OC, false});
      if (kind == BackwardWeight)
        g.push_back({b.f("dw") + e * OC * C, dy.at(int64_t(at) * OC), x.at(int64_t(at) * C), n, C, OC, true});
    }
    return g;
  };
  auto run = [=](Kernels& k, Kind kind, std::vector<LinearGroup> g) {
    if (kind == Forward) k.linear_forward_grouped(g.data(), int(g.size()));
    if (kind == BackwardInput) k.linear_backward_input_grouped(g.data(), int(g.size()));
    if (kind == BackwardWeight) k.linear_backward_weight_grouped(g.data(), int(g.size()));
  };
  const size_t nx = size_t(total) * C, ny = size_t(total) * OC;
  const std::pair<Kind, const char*> kinds[] = {{Forward, "linear_forward_grouped"},
                                                {BackwardInput, "linear_backward_input_grouped"},
                                                {BackwardWeight, "linear_backward_weight_grouped accumulate"}};
  for (const auto& [kind, name] : kinds) {
    const std::string out = kind == Forward ? "y" : kind == BackwardInput ? "dx" : "dw";
    cases.push_back(
        {.name = std::string("bf16 ") + name + " from bf16 rows",
         .make = start,
         .call = in_bf16([=](Kernels& k, Buffers& b) {
           run(k, kind, groups(b, kind, as_bf16(k, b, "x", nx), as_bf16(k, b, "dy", ny)));
         }),
         .outs = {{out, 1e-4, 1e-4, 0, 1}},
         .reference =
             [=](Tensors& t) {
               const auto x = rounded(t["x"].f), dy = rounded(t["dy"].f), w = rounded(t["w"].f);
               std::vector<double> r;
               if (kind == BackwardWeight) r.assign(t["dw"].f.begin(), t["dw"].f.end());
               for (size_t e = 0, at = 0; e < counts.size(); at += size_t(counts[e]), ++e) {
                 const int n = counts[e];
                 const std::vector<float> we(w.begin() + long(e * OC * C), w.begin() + long((e + 1) * OC * C));
                 if (kind == Forward) {  // y(n,OC) = x(n,C) · wᵀ
                   const std::vector<float> xe(x.begin() + long(at * C), x.begin() + long((at + size_t(n)) * C));
                   const auto ye = product(xe, we, n, C, OC, false);
                   r.insert(r.end(), ye.begin(), ye.end());
                 } else if (kind == BackwardInput) {  // dx(n,C) = dy(n,OC) · w(OC,C)
                   const std::vector<float> de(dy.begin() + long(at * OC), dy.begin() + long((at + size_t(n)) * OC));
                   const auto xe = product(de, we, n, OC, C, true);
                   r.insert(r.end(), xe.begin(), xe.end());
                 } else {  // dw(OC,C) += Σ_rows dy(n,OC)ᵀ · x(n,C)
                   for (int o = 0; o < OC; ++o)
                     for (int c = 0; c < C; ++c)
                       for (int i = 0; i < n; ++i)
                         r[e * OC * C + size_t(o) * C + c] +=
                             double(dy[(at + size_t(i)) * OC + o]) * x[(at + size_t(i)) * C + c];
                 }
               }
               t[out] = as_f32(r);
             },
         .threads_rtol = 1e-4,
         .twins = {{.what = "the fp32 rows, rounded by the products", .call = in_bf16([=](Kernels& k, Buffers& b) {
                      run(k, kind, groups(b, kind, b.f("x"), b.f("dy")));
                    })}}});
  }
}

}  // namespace

void add_bf16_moe_cases(std::vector<KernelCase>& cases) {
  row_cases(cases);
  grouped_cases(cases);
}

}  // namespace piper::test
