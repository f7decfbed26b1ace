// Tests of the mixture-of-experts row kernels on the CPU: gather_rows, combine_rows and rows_dot against
// double-precision references (duplicated and dropped indices, null scales and weights, accumulate or overwrite,
// odd widths), bit-identical results on 1 and 2 threads, and the adjoint relation between gather and combine.
#include <catch2/catch.hpp>
#include <limits>
#include <numeric>

#include "backend/cpu/cpu_kernels.hpp"
#include "test_util.hpp"

using namespace piper;
using namespace piper::test;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Token-to-expert assignments as the three kernels see them. Token t's slot k is assignment i = pos[t,k]
// (or dropped: -1); assignments are numbered grouped by a random expert, as a dispatch would order them.
// rows[i] = t and scale[i] = w[t,k] describe the same assignment from the expert side.
struct Routing {
  int n = 0, K = 0, m = 0;
  std::vector<int32_t> pos;   // (n,K)
  std::vector<float> w;       // (n,K)
  std::vector<int32_t> rows;  // (m)
  std::vector<float> scale;   // (m)
};

// `dropped` of the slots are -1; tokens listed in `empty` have every slot dropped.
Routing make_routing(Rand& rng, int n, int K, int experts, double dropped, const std::vector<int>& empty) {
  Routing r;
  r.n = n;
  r.K = K;
  r.pos.assign(size_t(n) * K, -1);
  r.w = rng.normal(size_t(n) * K, 0.5, 0.5);
  std::uniform_real_distribution<double> u(0, 1);
  std::uniform_int_distribution<int> e(0, experts - 1);
  struct Slot {
    int expert, t, k;
  };
  std::vector<Slot> slots;
  for (int t = 0; t < n; ++t)
    for (int k = 0; k < K; ++k)
      if (u(rng.gen) >= dropped && std::find(empty.begin(), empty.end(), t) == empty.end())
        slots.push_back({e(rng.gen), t, k});
  std::stable_sort(slots.begin(), slots.end(), [](const Slot& a, const Slot& b) { return a.expert < b.expert; });
  r.m = int(slots.size());
  for (int i = 0; i < r.m; ++i) {
    const Slot& s = slots[size_t(i)];
    r.pos[size_t(s.t) * K + s.k] = i;
    r.rows.push_back(s.t);
    r.scale.push_back(r.w[size_t(s.t) * K + s.k]);
  }
  return r;
}

// Indices in [0, m) with repeats, and a share of -1 (dropped) entries.
std::vector<int32_t> random_pos(Rand& rng, size_t count, int m, double dropped) {
  auto pos = rng.ints(count, 0, m);
  std::uniform_real_distribution<double> u(0, 1);
  for (auto& p : pos)
    if (u(rng.gen) < dropped) p = -1;
  return pos;
}

// |got − ref| ≤ rtol · mag + atol elementwise, where mag bounds the rounding (Σ |terms|); worst ratio reported.
double worst_ratio(const std::vector<float>& got, const std::vector<double>& ref, const std::vector<double>& mag,
                   double rtol, double atol, size_t* at = nullptr) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double r = std::fabs(double(got[i]) - ref[i]) / (rtol * mag[i] + atol);
    if (!(r <= worst)) {
      worst = std::isnan(r) ? 1e30 : r;
      if (at) *at = i;
    }
  }
  return worst;
}

// ---- double references ----

// dst(m,C) = scale[i] · src[rows[i]]
std::vector<double> gather_ref(const std::vector<float>& src, const std::vector<int32_t>& rows, const float* scale,
                               int C) {
  std::vector<double> d(rows.size() * size_t(C));
  for (size_t i = 0; i < rows.size(); ++i)
    for (int c = 0; c < C; ++c)
      d[i * C + c] = (scale ? double(scale[i]) : 1.0) * double(src[size_t(rows[i]) * C + c]);
  return d;
}

// dst(n,C) = prev (when given) + Σ_k w[t,k] · src[pos[t,k]] over pos >= 0; mag(n,C) = |prev| + Σ_k |terms|.
std::vector<double> combine_ref(const std::vector<float>& src, const std::vector<int32_t>& pos, const float* w, int n,
                                int K, int C, const std::vector<float>* prev, std::vector<double>* mag) {
  std::vector<double> d(size_t(n) * C, 0.0);
  mag->assign(d.size(), 0.0);
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < C; ++c) {
      const size_t o = size_t(t) * C + c;
      if (prev) {
        d[o] = (*prev)[o];
        (*mag)[o] = std::fabs(d[o]);
      }
      for (int k = 0; k < K; ++k) {
        const int32_t p = pos[size_t(t) * K + k];
        if (p < 0) continue;
        const double term = (w ? double(w[size_t(t) * K + k]) : 1.0) * double(src[size_t(p) * C + c]);
        d[o] += term;
        (*mag)[o] += std::fabs(term);
      }
    }
  return d;
}

// out(n,K) = a[t] · b[pos[t,k]], 0 where pos < 0; mag(n,K) = Σ_c |a·b|.
std::vector<double> rows_dot_ref(const std::vector<float>& a, const std::vector<float>& b,
                                 const std::vector<int32_t>& pos, int n, int K, int C, std::vector<double>* mag) {
  std::vector<double> out(size_t(n) * K, 0.0);
  mag->assign(out.size(), 0.0);
  for (int t = 0; t < n; ++t)
    for (int k = 0; k < K; ++k) {
      const int32_t p = pos[size_t(t) * K + k];
      if (p < 0) continue;
      for (int c = 0; c < C; ++c) {
        const double term = double(a[size_t(t) * C + c]) * double(b[size_t(p) * C + c]);
        out[size_t(t) * K + k] += term;
        (*mag)[size_t(t) * K + k] += std::fabs(term);
      }
    }
  return out;
}

std::vector<float> guarded_result(const Guarded& g) { return std::vector<float>(g.data(), g.data() + g.size()); }

}  // namespace

TEST_CASE("gather_rows copies scaled rows exactly with repeated indices, null scale and odd widths", "[kernels]") {
  for (int C : {1, 37, 64, 600}) {
    for (bool with_scale : {true, false}) {
      INFO("C " << C << ", scale " << (with_scale ? "given" : "null"));
      Rand rng(301 + uint64_t(C));
      const int S = 23, m = 71;
      auto src = rng.normal(size_t(S) * C);
      auto rows = rng.ints(size_t(m), 0, S);
      rows[5] = rows[6] = rows[40] = 3;  // repeats
      auto scale = rng.normal(size_t(m));
      const float* sc = with_scale ? scale.data() : nullptr;
      const auto ref = gather_ref(src, rows, sc, C);
      std::vector<std::vector<float>> got;
      for (int threads : {1, 2}) {
        CpuKernels k(threads);
        Guarded dst(sizeof(float) * size_t(m) * C);
        std::fill(dst.data(), dst.data() + dst.size(), kNaN);
        k.gather_rows(dst.data(), src.data(), rows.data(), sc, m, C);
        CHECK(dst.intact());
        got.push_back(guarded_result(dst));
      }
      // One product of two floats per element: the float result is the double reference rounded once.
      bool exact = true;
      for (size_t i = 0; i < ref.size(); ++i) exact = exact && got[0][i] == float(ref[i]);
      CHECK(exact);
      CHECK(bitwise_equal(got[0], got[1]));
    }
  }
  // m = 0 touches nothing
  CpuKernels k(2);
  float untouched = 7.f;
  const float src1 = 1.f;
  const int32_t row0 = 0;
  k.gather_rows(&untouched, &src1, &row0, nullptr, 0, 1);
  CHECK(untouched == 7.f);
}

TEST_CASE("combine_rows sums weighted rows in k order with dropped and repeated pos, accumulate or overwrite",
          "[kernels]") {
  struct Shape {
    int n, K, m, C;
  };
  for (Shape s : {Shape{40, 2, 30, 37}, Shape{33, 4, 50, 16}, Shape{17, 3, 9, 1}, Shape{12, 8, 100, 600}}) {
    for (bool with_w : {true, false}) {
      INFO("n " << s.n << " K " << s.K << " m " << s.m << " C " << s.C << ", w " << (with_w ? "given" : "null"));
      Rand rng(311 + uint64_t(s.n * 7 + s.C));
      auto src = rng.normal(size_t(s.m) * s.C);
      auto pos = random_pos(rng, size_t(s.n) * s.K, s.m, 0.25);
      for (int k = 0; k < s.K; ++k) {
        pos[size_t(0) * s.K + k] = -1;  // token 0 and token n/2: every slot dropped
        pos[size_t(s.n / 2) * s.K + k] = -1;
      }
      pos[size_t(1) * s.K] = pos[size_t(1) * s.K + 1] = 2;  // one token reads the same row twice
      auto w = rng.normal(size_t(s.n) * s.K);
      const float* wp = with_w ? w.data() : nullptr;
      auto prev = rng.normal(size_t(s.n) * s.C);
      std::vector<double> mag_over, mag_acc;
      const auto ref_over = combine_ref(src, pos, wp, s.n, s.K, s.C, nullptr, &mag_over);
      const auto ref_acc = combine_ref(src, pos, wp, s.n, s.K, s.C, &prev, &mag_acc);
      std::vector<std::vector<float>> over, acc;
      for (int threads : {1, 2}) {
        CpuKernels k(threads);
        Guarded dst(sizeof(float) * size_t(s.n) * s.C);
        std::fill(dst.data(), dst.data() + dst.size(), kNaN);  // overwrite never reads dst
        k.combine_rows(dst.data(), src.data(), pos.data(), wp, s.n, s.K, s.C, false);
        CHECK(dst.intact());
        over.push_back(guarded_result(dst));
        std::copy(prev.begin(), prev.end(), dst.data());
        k.combine_rows(dst.data(), src.data(), pos.data(), wp, s.n, s.K, s.C, true);
        CHECK(dst.intact());
        acc.push_back(guarded_result(dst));
      }
      // float sums of at most 8 terms: seen within 2.1e-7 of Σ |terms|
      size_t at = 0;
      double r = worst_ratio(over[0], ref_over, mag_over, 1e-6, 1e-30, &at);
      INFO("overwrite: worst " << r << " of tolerance at " << at);
      CHECK(r <= 1.0);
      r = worst_ratio(acc[0], ref_acc, mag_acc, 1e-6, 1e-30, &at);
      INFO("accumulate: worst " << r << " of tolerance at " << at);
      CHECK(r <= 1.0);
      // accumulate adds the overwrite result once: previous + overwrite, bit for bit
      bool sum = true;
      for (size_t i = 0; i < prev.size(); ++i) sum = sum && acc[0][i] == prev[i] + over[0][i];
      CHECK(sum);
      // tokens with no valid pos: 0 when overwriting, unchanged when accumulating
      for (int t : {0, s.n / 2})
        for (int c = 0; c < s.C; ++c) {
          const size_t o = size_t(t) * s.C + c;
          CHECK(over[0][o] == 0.f);
          CHECK(acc[0][o] == prev[o]);
        }
      CHECK(bitwise_equal(over[0], over[1]));
      CHECK(bitwise_equal(acc[0], acc[1]));
    }
  }
  // K = 0: every row is empty
  CpuKernels k(2);
  std::vector<float> dst = {1.f, 2.f, 3.f, 4.f};
  k.combine_rows(dst.data(), nullptr, nullptr, nullptr, 2, 0, 2, true);
  CHECK(dst == std::vector<float>{1.f, 2.f, 3.f, 4.f});
  k.combine_rows(dst.data(), nullptr, nullptr, nullptr, 2, 0, 2, false);
  CHECK(dst == std::vector<float>{0.f, 0.f, 0.f, 0.f});
}

TEST_CASE("rows_dot matches a double reference with dropped and repeated pos and odd widths", "[kernels]") {
  struct Shape {
    int n, K, m, C;
  };
  for (Shape s : {Shape{40, 2, 30, 37}, Shape{33, 4, 50, 16}, Shape{17, 3, 9, 1}, Shape{12, 8, 100, 600}}) {
    INFO("n " << s.n << " K " << s.K << " m " << s.m << " C " << s.C);
    Rand rng(321 + uint64_t(s.n * 7 + s.C));
    auto a = rng.normal(size_t(s.n) * s.C), b = rng.normal(size_t(s.m) * s.C);
    auto pos = random_pos(rng, size_t(s.n) * s.K, s.m, 0.25);
    for (int k = 0; k < s.K; ++k) pos[size_t(s.n - 1) * s.K + k] = -1;  // last token: every slot dropped
    pos[0] = pos[1] = 4;                                               // one token meets the same row twice
    std::vector<double> mag;
    const auto ref = rows_dot_ref(a, b, pos, s.n, s.K, s.C, &mag);
    std::vector<std::vector<float>> got;
    for (int threads : {1, 2}) {
      CpuKernels k(threads);
      Guarded out(sizeof(float) * size_t(s.n) * s.K);
      std::fill(out.data(), out.data() + out.size(), kNaN);
      k.rows_dot(out.data(), a.data(), b.data(), pos.data(), s.n, s.K, s.C);
      CHECK(out.intact());
      got.push_back(guarded_result(out));
    }
    // Sums in double, rounded to float once: within one float ulp of the result (half an ulp is the rounding;
    // 0.95 of half an ulp was seen) plus the double rounding of the terms.
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double r = std::fabs(double(got[0][i]) - ref[i]) / (1.2e-7 * std::fabs(ref[i]) + 1e-13 * mag[i] + 1e-30);
      if (!(r <= worst)) {
        worst = std::isnan(r) ? 1e30 : r;
        at = i;
      }
    }
    INFO("worst " << worst << " of tolerance at " << at << ": got " << got[0][at] << " expected " << ref[at]);
    CHECK(worst <= 1.0);
    bool zeros = true;
    for (size_t i = 0; i < pos.size(); ++i) zeros = zeros && (pos[i] >= 0 || got[0][i] == 0.f);
    CHECK(zeros);
    CHECK(bitwise_equal(got[0], got[1]));
  }
}

TEST_CASE("mixture-of-experts row kernels split across threads give the same bits and match the references",
          "[kernels]") {
  const int n = 5000, K = 4, C = 37, experts = 16;
  Rand rng(331);
  Routing r = make_routing(rng, n, K, experts, 0.1, {0, 2500, n - 1});
  REQUIRE(size_t(r.m) * C > 32768);  // every kernel splits its rows across 2 threads
  auto x = rng.normal(size_t(n) * C), e = rng.normal(size_t(r.m) * C), prev = rng.normal(size_t(n) * C);
  std::vector<double> mag_c, mag_a, mag_d;
  const auto ref_g = gather_ref(x, r.rows, r.scale.data(), C);
  const auto ref_c = combine_ref(e, r.pos, r.w.data(), n, K, C, nullptr, &mag_c);
  const auto ref_a = combine_ref(e, r.pos, r.w.data(), n, K, C, &prev, &mag_a);
  const auto ref_d = rows_dot_ref(x, e, r.pos, n, K, C, &mag_d);
  std::vector<std::vector<float>> g, c, a, d;
  for (int threads : {1, 2}) {
    CpuKernels k(threads);
    std::vector<float> out(size_t(r.m) * C, kNaN);
    k.gather_rows(out.data(), x.data(), r.rows.data(), r.scale.data(), r.m, C);
    g.push_back(out);
    out.assign(size_t(n) * C, kNaN);
    k.combine_rows(out.data(), e.data(), r.pos.data(), r.w.data(), n, K, C, false);
    c.push_back(out);
    out = prev;
    k.combine_rows(out.data(), e.data(), r.pos.data(), r.w.data(), n, K, C, true);
    a.push_back(out);
    out.assign(size_t(n) * K, kNaN);
    k.rows_dot(out.data(), x.data(), e.data(), r.pos.data(), n, K, C);
    d.push_back(out);
  }
  CHECK(bitwise_equal(g[0], g[1]));
  CHECK(bitwise_equal(c[0], c[1]));
  CHECK(bitwise_equal(a[0], a[1]));
  CHECK(bitwise_equal(d[0], d[1]));
  bool exact = true;
  for (size_t i = 0; i < ref_g.size(); ++i) exact = exact && g[1][i] == float(ref_g[i]);
  CHECK(exact);
  CHECK(worst_ratio(c[1], ref_c, mag_c, 1e-6, 1e-30) <= 1.0);
  CHECK(worst_ratio(a[1], ref_a, mag_a, 1e-6, 1e-30) <= 1.0);
  CHECK(worst_ratio(d[1], ref_d, mag_d, 1e-6, 1e-30) <= 1.0);
  for (int t : {0, 2500, n - 1})
    for (int col = 0; col < C; ++col) {
      CHECK(c[1][size_t(t) * C + col] == 0.f);
      CHECK(a[1][size_t(t) * C + col] == prev[size_t(t) * C + col]);
    }
}

TEST_CASE("combine_rows is the adjoint of gather_rows on the same assignments", "[kernels]") {
  // Σ g · gather_rows(x, rows, scale) = Σ x · combine_rows(g, pos, w) when rows/scale and pos/w encode the
  // same assignments: the identity the backward of each uses.
  struct Shape {
    int n, K, C, experts;
  };
  for (Shape s : {Shape{50, 2, 37, 4}, Shape{300, 4, 64, 8}, Shape{5000, 2, 24, 16}}) {
    for (bool weighted : {true, false}) {
      INFO("n " << s.n << " K " << s.K << " C " << s.C << (weighted ? ", weighted" : ", unweighted"));
      Rand rng(341 + uint64_t(s.n + s.C));
      Routing r = make_routing(rng, s.n, s.K, s.experts, 0.2, {1});
      auto x = rng.normal(size_t(s.n) * s.C), g = rng.normal(size_t(r.m) * s.C);
      for (int threads : {1, 2}) {
        CpuKernels k(threads);
        std::vector<float> gathered(size_t(r.m) * s.C), combined(size_t(s.n) * s.C);
        k.gather_rows(gathered.data(), x.data(), r.rows.data(), weighted ? r.scale.data() : nullptr, r.m, s.C);
        k.combine_rows(combined.data(), g.data(), r.pos.data(), weighted ? r.w.data() : nullptr, s.n, s.K, s.C,
                       false);
        const double lhs = dot(g, gathered.data(), gathered.size());
        const double rhs = dot(x, combined.data(), combined.size());
        const double rel = std::fabs(lhs - rhs) / std::max(std::fabs(lhs), std::fabs(rhs));
        INFO("threads " << threads << ": Σ g·gather " << lhs << ", Σ x·combine " << rhs << ", relative " << rel);
        CHECK(rel <= 1e-4);  // seen: 2.4e-7 at worst
      }
    }
  }
}
