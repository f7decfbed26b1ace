// Kernel cases of the mixture of experts: grouped linear products (one group per expert) and the row kernels that
// dispatch tokens to experts and combine them back (gather_rows, combine_rows, rows_dot), with repeated and dropped
// assignments, against double references; the grouped calls against one call per group.
#include <algorithm>
#include <cmath>

#include "kernel_cases.hpp"

namespace piper::test {

// combined(n,C) (+)= Σ_k w[i,k] · e[pos[i,k]] in double, from the tensors pos, w and combined (the prior) and the
// expert rows e given; with "combined.scale", the sum of the terms' magnitudes.
void combine_rows_reference(Tensors& t, const std::vector<float>& e, int n, int K, int C, bool weighted, bool acc) {
  const size_t nc = size_t(n) * C;
  std::vector<double> out(nc, 0.0), mag(nc, 0.0);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < C; ++c) {
      const size_t o = size_t(i) * C + c;
      if (acc) out[o] = t["combined"].f[o], mag[o] = std::fabs(out[o]);
      for (int k = 0; k < K; ++k) {
        const int p = t["pos"].i[size_t(i) * K + k];
        if (p < 0) continue;
        const double term = (weighted ? t["w"].f[size_t(i) * K + k] : 1.0) * e[size_t(p) * C + c];
        out[o] += term;
        mag[o] += std::fabs(term);
      }
    }
  t["combined"] = as_f32(out);
  t["combined.scale"] = f64(mag);
}

// dots(n,K) = x[i] · e[pos[i,k]] in double (0 where dropped), from the tensors x and pos and the expert rows e
// given; "dots.scale": |dot| + 1e-6 of the sum of the terms' magnitudes.
void rows_dot_reference(Tensors& t, const std::vector<float>& e, int n, int K, int C) {
  const size_t nk = size_t(n) * K;
  std::vector<double> dots(nk, 0.0), scale(nk, 0.0);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < K; ++k) {
      const int p = t["pos"].i[size_t(i) * K + k];
      double sum = 0, mag = 0;
      for (int c = 0; p >= 0 && c < C; ++c) {
        const double term = double(t["x"].f[size_t(i) * C + c]) * e[size_t(p) * C + c];
        sum += term;
        mag += std::fabs(term);
      }
      dots[size_t(i) * K + k] = sum;
      scale[size_t(i) * K + k] = std::fabs(sum) + 1e-6 * mag;
    }
  t["dots"] = as_f32(dots);
  t["dots.scale"] = f64(scale);
}

namespace {

// experts of different row counts (one empty, one of a single row), as a mixture of experts' gate/up (C → DE) and
// down (DE → C); w holds the experts' (DE,C) weights one after the other
constexpr int kC = 96, kDE = 40;
const std::vector<int>& expert_rows() {
  static const std::vector<int> counts = {37, 0, 1, 250, 64, 5};
  return counts;
}

enum class GroupedCall { Forward, BackwardInput, BackwardWeightWrite, BackwardWeightAccumulate };

// The groups of one grouped call. Backward input: dx = dy · w per expert, then dy · (the next expert's w) added.
// Backward weight: dw_e (+)= dy_eᵀ · x_e, and expert 3 also gets expert 0's rows.
std::vector<LinearGroup> groups_of(Buffers& b, GroupedCall kind) {
  const auto& counts = expert_rows();
  const int E = int(counts.size());
  const size_t wsz = size_t(kDE) * kC;
  std::vector<LinearGroup> g;
  for (bool second : {false, true})
    for (int e = 0, at = 0; e < E; at += counts[size_t(e)], ++e) {
      const int n = counts[size_t(e)];
      switch (kind) {
        case GroupedCall::Forward:
          if (!second) g.push_back({b.f("y") + size_t(at) * kDE, b.f("x") + size_t(at) * kC, b.f("w") + e * wsz, n, kC, kDE});
          break;
        case GroupedCall::BackwardInput:
          g.push_back({b.f("dx") + size_t(at) * kC, b.f("dy") + size_t(at) * kDE,
                       b.f("w") + (second ? (e + 1) % E : e) * wsz, n, kC, kDE, second});
          break;
        case GroupedCall::BackwardWeightWrite:
        case GroupedCall::BackwardWeightAccumulate:
          if (!second)
            g.push_back({b.f("dw" + std::to_string(e)), b.f("dy") + size_t(at) * kDE, b.f("x") + size_t(at) * kC, n,
                         kC, kDE, kind == GroupedCall::BackwardWeightAccumulate});
          break;
      }
    }
  if (kind == GroupedCall::BackwardWeightWrite || kind == GroupedCall::BackwardWeightAccumulate)
    g.push_back({b.f("dw3"), b.f("dy"), b.f("x"), counts[0], kC, kDE, true});
  return g;
}

// One call per group, in list order: what a grouped call must equal to the bit.
void one_by_one(Kernels& k, const std::vector<LinearGroup>& groups, GroupedCall kind) {
  for (const LinearGroup& g : groups) switch (kind) {
      case GroupedCall::Forward:
        k.linear_forward(g.out, g.a, g.weight(), nullptr, g.N, g.C, g.OC);
        break;
      case GroupedCall::BackwardInput:
        k.linear_backward_input(g.out, g.a, g.weight(), g.N, g.C, g.OC, g.accumulate);
        break;
      default:
        k.linear_backward_weight(g.out, nullptr, g.a, g.b, g.N, g.C, g.OC, g.accumulate);
    }
}

void grouped_call(Kernels& k, std::vector<LinearGroup> g, GroupedCall kind) {
  if (kind == GroupedCall::Forward)
    k.linear_forward_grouped(g.data(), int(g.size()));
  else if (kind == GroupedCall::BackwardInput)
    k.linear_backward_input_grouped(g.data(), int(g.size()));
  else
    k.linear_backward_weight_grouped(g.data(), int(g.size()));
}

// y(r,o) (+)= Σ_c a(r,c) · b(o,c) over rows [0, n) in double: a (n,in), b (out,in) or, transposed, b (in,out)
void product(std::vector<double>& y, const float* a, const float* b, int n, int in, int out, bool b_transposed) {
  for (int r = 0; r < n; ++r)
    for (int o = 0; o < out; ++o) {
      double s = 0;
      for (int c = 0; c < in; ++c) s += double(a[size_t(r) * in + c]) * (b_transposed ? b[size_t(c) * out + o] : b[size_t(o) * in + c]);
      y[size_t(r) * out + o] += s;
    }
}

void grouped_linear_cases(std::vector<KernelCase>& cases) {
  const auto& counts = expert_rows();
  const int E = int(counts.size());
  int rows = 0;
  for (int n : counts) rows += n;
  auto start = [=](std::mt19937& gen) {
    Tensors t;
    t["x"] = f32(uniform(gen, size_t(rows) * kC));
    t["dy"] = f32(uniform(gen, size_t(rows) * kDE));
    t["w"] = f32(uniform(gen, size_t(E) * kDE * kC));
    t["y"] = f32(filled(size_t(rows) * kDE, 123.f));
    t["dx"] = f32(filled(size_t(rows) * kC, 123.f));
    for (int e = 0; e < E; ++e) t["dw" + std::to_string(e)] = f32(uniform(gen, size_t(kDE) * kC));
    return t;
  };
  const size_t wsz = size_t(kDE) * kC;
  auto twin = [](GroupedCall kind) {
    return Twin{.what = "one call per group", .call = [=](Kernels& k, Buffers& b) { one_by_one(k, groups_of(b, kind), kind); }};
  };
  cases.push_back({.name = "linear_forward_grouped",  // y(n,DE) = x(n,C) · wᵀ per expert
                   .make = start,
                   .call = [](Kernels& k, Buffers& b) { grouped_call(k, groups_of(b, GroupedCall::Forward), GroupedCall::Forward); },
                   .outs = {{"y", 1e-4, 1e-4}},
                   .reference =
                       [=](Tensors& t) {
                         std::vector<double> placed(size_t(rows) * kDE, 0.0);
                         for (int e = 0, at = 0; e < E; at += counts[size_t(e)], ++e) {
                           std::vector<double> block(static_cast<size_t>(counts[size_t(e)]) * kDE, 0.0);
                           product(block, t["x"].f.data() + size_t(at) * kC, t["w"].f.data() + e * wsz,
                                   counts[size_t(e)], kC, kDE, false);
                           std::copy(block.begin(), block.end(), placed.begin() + long(at) * kDE);
                         }
                         t["y"] = as_f32(placed);
                       },
                   .gradients = {},
                   .threads_rtol = 1e-4,
                   .cuda_repeatable = false,
                   .twins = {twin(GroupedCall::Forward)}});
  cases.push_back(
      {.name = "linear_backward_input_grouped",  // dx(n,C) = dy · w_e, then dy · w_(e+1) added
       .make = start,
       .call = [](Kernels& k,
                  Buffers& b) { grouped_call(k, groups_of(b, GroupedCall::BackwardInput), GroupedCall::BackwardInput); },
       .outs = {{"dx", 1e-4, 1e-4}},
       .reference =
           [=](Tensors& t) {
             std::vector<double> dx(size_t(rows) * kC, 0.0);
             for (int e = 0, at = 0; e < E; at += counts[size_t(e)], ++e)
               for (int w_of : {e, (e + 1) % E}) {
                 std::vector<double> block(static_cast<size_t>(counts[size_t(e)]) * kC, 0.0);
                 product(block, t["dy"].f.data() + size_t(at) * kDE, t["w"].f.data() + w_of * wsz, counts[size_t(e)],
                         kDE, kC, true);
                 for (size_t k = 0; k < block.size(); ++k) dx[size_t(at) * kC + k] += block[k];
               }
             t["dx"] = as_f32(dx);
           },
       .gradients = {},
       .threads_rtol = 1e-4,
       .cuda_repeatable = false,
       .twins = {twin(GroupedCall::BackwardInput)}});
  // each expert's dw on its own, so that each is judged against its own scale (one has a single row)
  std::vector<Out> dw_outs;
  for (int e = 0; e < E; ++e) dw_outs.push_back({"dw" + std::to_string(e), 1e-4, 1e-4});
  for (bool acc : {false, true}) {
    const GroupedCall kind = acc ? GroupedCall::BackwardWeightAccumulate : GroupedCall::BackwardWeightWrite;
    cases.push_back({.name = std::string("linear_backward_weight_grouped ") + (acc ? "accumulate" : "write"),
                     .make = start,
                     .call = [=](Kernels& k, Buffers& b) { grouped_call(k, groups_of(b, kind), kind); },
                     .outs = dw_outs,
                     .reference =
                         [=](Tensors& t) {  // dw_e(DE,C) (+)= dy_eᵀ · x_e; expert 3 also gets expert 0's rows
                           for (int e = 0, at = 0; e < E; at += counts[size_t(e)], ++e) {
                             std::vector<double> dw(wsz, 0.0);
                             for (int r = 0; r < counts[size_t(e)] + (e == 3 ? counts[0] : 0); ++r) {
                               const size_t row = r < counts[size_t(e)] ? size_t(at + r) : size_t(r - counts[size_t(e)]);
                               for (int o = 0; o < kDE; ++o)
                                 for (int c = 0; c < kC; ++c)
                                   dw[size_t(o) * kC + c] += double(t["dy"].f[row * kDE + o]) * t["x"].f[row * kC + c];
                             }
                             auto& prior = t["dw" + std::to_string(e)].f;
                             t["dw" + std::to_string(e)] = as_f32(add_prior(dw, prior, acc));
                           }
                         },
                     .gradients = {},
                     .threads_rtol = 1e-4,
                     .cuda_repeatable = false,
                     .twins = {twin(kind)},
                     .property =
                         [=](const Tensors&, const Tensors& out) {  // the expert without rows writes zeros
                           if (acc) return;
                           const auto& dw1 = out.at("dw1").f;
                           CHECK(std::all_of(dw1.begin(), dw1.end(), [](float v) { return v == 0.f; }));
                         }});
  }
}

// Token-to-expert assignments as the row kernels see them: token i's slot k is assignment pos[i,k] (−1: dropped);
// rows[a] = i and scale[a] = w[i,k] describe the same assignment from the expert side, numbered grouped by expert as
// a dispatch orders them.
struct Routing {
  std::vector<int32_t> pos, rows;
  std::vector<float> w, scale;
};

Routing route(std::mt19937& gen, int n, int K, int experts, float dropped, std::vector<int> empty) {
  Routing r;
  r.pos.assign(size_t(n) * K, -1);
  r.w = uniform(gen, size_t(n) * K, 0.f, 1.f);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::uniform_int_distribution<int> pick(0, experts - 1);
  struct Slot {
    int expert, i, k;
  };
  std::vector<Slot> slots;
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < K; ++k)
      if (u(gen) >= dropped && std::find(empty.begin(), empty.end(), i) == empty.end())
        slots.push_back({pick(gen), i, k});
  std::stable_sort(slots.begin(), slots.end(), [](const Slot& a, const Slot& b) { return a.expert < b.expert; });
  for (size_t a = 0; a < slots.size(); ++a) {
    r.pos[size_t(slots[a].i) * K + slots[a].k] = int32_t(a);
    r.rows.push_back(slots[a].i);
    r.scale.push_back(r.w[size_t(slots[a].i) * K + slots[a].k]);
  }
  return r;
}

struct RowShape {
  int n, K, m, C;
  int experts = 0;  // 0: independent random rows and pos (with repeats); else pos and rows of one routing
};

// Random rows(m) with repeats; pos(n,K) with repeats, a quarter dropped, tokens 0 and n/2 fully dropped, and token 1
// reading one row twice.
Routing random_rows(std::mt19937& gen, const RowShape& s) {
  Routing r;
  r.pos = tokens(gen, size_t(s.n) * s.K, s.m);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (auto& p : r.pos)
    if (u(gen) < 0.25f) p = -1;
  for (int k = 0; k < s.K; ++k) r.pos[size_t(k)] = r.pos[size_t(s.n / 2) * s.K + k] = -1;
  if (s.K >= 2 && s.n > 2) r.pos[size_t(s.K)] = r.pos[size_t(s.K) + 1] = 2 % s.m;
  r.rows = tokens(gen, size_t(s.m), s.n);
  if (s.m > 40) r.rows[5] = r.rows[6] = r.rows[40] = 3 % s.n;
  r.w = uniform(gen, size_t(s.n) * s.K);
  r.scale = uniform(gen, size_t(s.m));
  return r;
}

void row_cases(std::vector<KernelCase>& cases) {
  // odd width, a power of two, one column, a row wider than a CUDA block (C > 512), many more rows than tokens,
  // and whole routings (pos and rows of the same assignments) large enough to split across threads
  std::vector<RowShape> shapes = {{60, 2, 90, 37},  {3000, 4, 9000, 256}, {40, 3, 50, 1},   {100, 8, 500, 1000},
                                  {40, 2, 30, 37},  {33, 4, 50, 16},      {17, 3, 9, 1},    {12, 8, 100, 600},
                                  {23, 2, 71, 64},  {23, 2, 71, 600},     {50, 2, 0, 37, 4}, {300, 4, 0, 64, 8},
                                  {5000, 2, 0, 24, 16}, {5000, 4, 0, 37, 16}};
  for (RowShape s : shapes) {
    // a routing's m is its number of kept assignments: drawn here, once, from the shape
    Routing fixed;
    if (s.experts) {
      std::mt19937 gen(uint32_t(s.n * 31 + s.K * 7 + s.C));
      fixed = route(gen, s.n, s.K, s.experts, 0.1f, {0, s.n / 2, s.n - 1});
      s.m = int(fixed.rows.size());
    }
    const std::string shape = dims({{"n", s.n}, {"K", s.K}, {"m", s.m}, {"C", s.C}}) + (s.experts ? " routed" : "");
    const size_t nk = size_t(s.n) * s.K, nc = size_t(s.n) * s.C, mc = size_t(s.m) * s.C;
    auto start = [=](std::mt19937& gen) {
      const Routing r = s.experts ? fixed : random_rows(gen, s);
      Tensors t;
      t["rows"] = i32(r.rows);
      t["pos"] = i32(r.pos);
      t["scale"] = f32(r.scale);
      t["w"] = f32(r.w);
      t["x"] = f32(uniform(gen, nc));
      t["e"] = f32(uniform(gen, mc));
      t["gathered"] = f32(filled(mc, std::nanf("")));  // written, never read
      t["combined"] = f32(uniform(gen, nc));           // the prior of an accumulating combine
      t["dots"] = f32(filled(nk, std::nanf("")));
      return t;
    };
    for (bool scaled : {true, false})  // gathered[a] = x[rows[a]] (· scale[a]): one float product, exact
      cases.push_back(
          {.name = std::string("gather_rows ") + (scaled ? "" : "unscaled ") + shape,
           .make = start,
           .call =
               [=](Kernels& k, Buffers& b) {
                 k.gather_rows(b.f("gathered"), b.f("x"), b.i("rows"), scaled ? b.f("scale") : nullptr, s.m, s.C);
               },
           .outs = {{"gathered", 1e-6, 0}},
           .reference =
               [=](Tensors& t) {
                 for (int a = 0; a < s.m; ++a)
                   for (int c = 0; c < s.C; ++c)
                     t["gathered"].f[size_t(a) * s.C + c] =
                         float(double(t["x"].f[size_t(t["rows"].i[size_t(a)]) * s.C + c]) *
                               (scaled ? t["scale"].f[size_t(a)] : 1.f));
               },
           .cuda_repeatable = true});
    // tokens whose every slot is dropped: 0 when overwriting, the prior when accumulating, to the bit
    auto dropped_tokens_kept = [=](bool acc) {
      return [=](const Tensors& st, const Tensors& out) {
        bool ok = true;
        for (int i = 0; i < s.n; ++i) {
          bool any = false;
          for (int k = 0; k < s.K; ++k) any = any || st.at("pos").i[size_t(i) * s.K + k] >= 0;
          for (int c = 0; !any && c < s.C; ++c)
            ok = ok && out.at("combined").f[size_t(i) * s.C + c] ==
                           (acc ? st.at("combined").f[size_t(i) * s.C + c] : 0.f);
        }
        CHECK(ok);
      };
    };
    for (bool weighted : {true, false})
      for (bool acc : {false, true}) {  // combined[i] (+)= Σ_k e[pos[i,k]] (· w[i,k]), in k order, dropped skipped
        KernelCase c{.name = std::string("combine_rows ") + (weighted ? "" : "unweighted ") + (acc ? "accumulate " : "") +
                             shape,
                     .make =
                         [=](std::mt19937& gen) {
                           Tensors t = start(gen);
                           if (!acc) t["combined"] = f32(filled(nc, std::nanf("")));  // overwrite never reads it
                           return t;
                         },
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           k.combine_rows(b.f("combined"), b.f("e"), b.i("pos"), weighted ? b.f("w") : nullptr, s.n,
                                          s.K, s.C, acc);
                         },
                     .outs = {{"combined", 1e-6, 1e-6}},  // of the sum of the terms' magnitudes: float sums of ≤ 8
                     .reference = [=](Tensors& t) { combine_rows_reference(t, t["e"].f, s.n, s.K, s.C, weighted, acc); },
                     .gradients = {},
                     .threads_rtol = 0,
                     .cuda_repeatable = true,
                     .twins = {},
                     .property = dropped_tokens_kept(acc)};
        if (acc)
          c.twins.push_back(overwrite_then_add(
              {{"combined", nc}},
              [=](Kernels& k, Buffers& b, auto tmp) {
                k.combine_rows(tmp[0], b.f("e"), b.i("pos"), weighted ? b.f("w") : nullptr, s.n, s.K, s.C, false);
              },
              0));
        cases.push_back(c);
      }
    cases.push_back(
        {.name = "rows_dot " + shape,  // dots[i,k] = x[i] · e[pos[i,k]], 0 where dropped; summed in double
         .make = start,
         .call = [=](Kernels& k,
                     Buffers& b) { k.rows_dot(b.f("dots"), b.f("x"), b.f("e"), b.i("pos"), s.n, s.K, s.C); },
         .outs = {{"dots", 1e-5, 1.2e-7}},  // one float rounding of the result, plus the double rounding of the terms
         .reference = [=](Tensors& t) { rows_dot_reference(t, t["e"].f, s.n, s.K, s.C); },
         .cuda_repeatable = true,
         .property =
             [=](const Tensors& st, const Tensors& out) {  // exactly 0 where dropped
               bool zeros = true;
               for (size_t a = 0; a < nk; ++a) zeros = zeros && (st.at("pos").i[a] >= 0 || out.at("dots").f[a] == 0.f);
               CHECK(zeros);
             }});
    if (!s.experts) continue;
    // Σ e · gather_rows(x) = Σ x · combine_rows(e) when rows/scale and pos/w hold the same assignments: the identity
    // the backward of each uses
    for (bool weighted : {true, false})
      cases.push_back({.name = std::string("gather_rows and combine_rows are adjoint ") + (weighted ? "" : "unweighted ") +
                               shape,
                       .make = start,
                       .call =
                           [=](Kernels& k, Buffers& b) {
                             k.gather_rows(b.f("gathered"), b.f("x"), b.i("rows"), weighted ? b.f("scale") : nullptr,
                                           s.m, s.C);
                             k.combine_rows(b.f("combined"), b.f("e"), b.i("pos"), weighted ? b.f("w") : nullptr, s.n,
                                            s.K, s.C, false);
                           },
                       .outs = {{"gathered", 1e-6}, {"combined", 1e-6}},
                       .cuda_repeatable = true,
                       .property =
                           [](const Tensors& st, const Tensors& out) {
                             double lhs = 0, rhs = 0;
                             for (size_t a = 0; a < st.at("e").f.size(); ++a)
                               lhs += double(st.at("e").f[a]) * out.at("gathered").f[a];
                             for (size_t a = 0; a < st.at("x").f.size(); ++a)
                               rhs += double(st.at("x").f[a]) * out.at("combined").f[a];
                             INFO("Σ e · gather " << lhs << ", Σ x · combine " << rhs);
                             CHECK(std::fabs(lhs - rhs) <= 1e-4 * std::max(std::fabs(lhs), std::fabs(rhs)));
                           }});
  }
  // nothing to do: no rows gathers nothing; no slots combine to zero (or leave the prior)
  auto empty = [](std::mt19937&) {
    Tensors t;
    t["dst"] = f32({1.f, 2.f, 3.f, 4.f});
    t["src"] = f32({5.f});
    t["idx"] = i32({0});
    return t;
  };
  cases.push_back({.name = "gather_rows m=0",
                   .make = empty,
                   .call = [](Kernels& k, Buffers& b) { k.gather_rows(b.f("dst"), b.f("src"), b.i("idx"), nullptr, 0, 1); },
                   .outs = {{"dst", 0, 0}},
                   .reference = [](Tensors&) {},
                   .cuda_repeatable = true});
  for (bool acc : {false, true})
    cases.push_back({.name = std::string("combine_rows K=0 ") + (acc ? "accumulate" : "write"),
                     .make = empty,
                     .call = [=](Kernels& k,
                                 Buffers& b) { k.combine_rows(b.f("dst"), nullptr, nullptr, nullptr, 2, 0, 2, acc); },
                     .outs = {{"dst", 0, 0}},
                     .reference =
                         [=](Tensors& t) {
                           if (!acc) t["dst"] = f32(filled(4, 0.f));
                         },
                     .cuda_repeatable = true});
}

}  // namespace

void add_moe_cases(std::vector<KernelCase>& cases) {
  grouped_linear_cases(cases);
  row_cases(cases);
}

}  // namespace piper::test
