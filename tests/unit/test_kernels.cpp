// Tests of the CPU compute primitives (CpuKernels): every forward against a double-precision reference,
// every backward against central finite differences of L = Σ w_out·y, accumulate/overwrite semantics,
// the AdamW update against torch.optim.AdamW's formula, each with 1 and with 2 threads.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "backend/cpu/blas_core.hpp"
#include "backend/cpu/cpu_kernels.hpp"
#include "test_util.hpp"

using namespace piper;
using namespace piper::test;

extern "C" char* openblas_get_corename(void);

namespace {

// Finite differences: inputs have scale ~1 and the objective is summed in double from the fp32 forward.
// A step of 1e-2 keeps the fp32 rounding noise over 2·eps near 1e-5 and the truncation error
// (~eps²·f'''/6) near 1e-4 relative, up to ~2e-3 on the curved linear+GELU chain.
constexpr double kEps = 1e-2;
// Gradient error = max_i |analytic − numeric| / max(|numeric|, 1e-2), required below 1e-2: five times
// the worst seen, while a wrong term, index or sign gives errors of order 1.
constexpr double kFloor = 1e-2;
constexpr double kGradTol = 1e-2;
// Forward results against double references: fp32 sums of ~10 terms of scale 1.
constexpr double kAtol = 2e-5, kRtol = 2e-5;

}  // namespace

TEST_CASE("linear_forward and linear_gelu_forward match a double reference", "[kernels]") {
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    CpuKernels k(threads);
    Rand rng(11);
    const int N = 5, C = 12, OC = 7;
    auto x = rng.normal(N * C), w = rng.normal(OC * C, 0.5), b = rng.normal(OC);
    const float* no_bias = nullptr;

    std::vector<float> y(N * OC, 123.f);
    k.linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
    CHECK_CLOSE(y, linear_ref(x, w, b.data(), N, C, OC), kAtol, kRtol, "linear, bias");
    std::fill(y.begin(), y.end(), 123.f);  // without bias the output must be overwritten, not added to
    k.linear_forward(y.data(), x.data(), w.data(), nullptr, N, C, OC);
    CHECK_CLOSE(y, linear_ref(x, w, no_bias, N, C, OC), kAtol, kRtol, "linear, no bias");

    for (bool bias : {true, false}) {
      INFO("bias " << bias);
      std::vector<float> dg(N * OC, 9.f), g(N * OC, 9.f);
      k.linear_gelu_forward(dg.data(), g.data(), x.data(), w.data(), bias ? b.data() : nullptr, N, C, OC);
      auto ref = linear_ref(x, w, bias ? b.data() : no_bias, N, C, OC);
      std::vector<double> ref_g(ref.size()), ref_dg(ref.size());
      for (size_t i = 0; i < ref.size(); ++i) {
        ref_g[i] = gelu_ref(ref[i]);
        ref_dg[i] = gelu_grad_ref(ref[i]);
      }
      CHECK_CLOSE(g, ref_g, kAtol, kRtol, "linear_gelu out");
      CHECK_CLOSE(dg, ref_dg, 4e-6, kRtol, "linear_gelu derivative");
    }
  }
}

TEST_CASE("linear kernels on shapes that are split across threads match a double reference", "[kernels]") {
  // All products are above the threading thresholds. y and dx split rows on the first shape and columns
  // on the second; dw = dy^T x (transposed A) splits columns on the first shape and rows on the second.
  struct Shape { int N, C, OC; };
  for (Shape s : {Shape{256, 128, 96}, Shape{48, 128, 512}}) {
    const int N = s.N, C = s.C, OC = s.OC;
    Rand rng(uint64_t(N * 7 + OC));
    auto x = rng.normal(size_t(N) * C), w = rng.normal(size_t(OC) * C, 0.1), b = rng.normal(size_t(OC));
    auto dy = rng.normal(size_t(N) * OC), prev_dx = rng.normal(size_t(N) * C), prev_dw = rng.normal(size_t(OC) * C),
         prev_db = rng.normal(size_t(OC));
    auto y_ref = linear_ref(x, w, b.data(), N, C, OC);
    std::vector<double> dx_ref(size_t(N) * C, 0.0), dw_ref(size_t(OC) * C, 0.0), db_ref(size_t(OC), 0.0);
    for (int r = 0; r < N; ++r)
      for (int o = 0; o < OC; ++o) {
        double g = dy[size_t(r) * OC + o];
        db_ref[size_t(o)] += g;
        for (int c = 0; c < C; ++c) {
          dx_ref[size_t(r) * C + c] += g * w[size_t(o) * C + c];
          dw_ref[size_t(o) * C + c] += g * x[size_t(r) * C + c];
        }
      }
    for (int threads : {1, 2}) {
      INFO("N " << N << " C " << C << " OC " << OC << " threads " << threads);
      CpuKernels k(threads);
      std::vector<float> y(size_t(N) * OC), dg(size_t(N) * OC), g(size_t(N) * OC);
      k.linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
      CHECK_CLOSE(y, y_ref, 1e-4, 1e-4, "linear_forward");
      k.linear_gelu_forward(dg.data(), g.data(), x.data(), w.data(), b.data(), N, C, OC);
      std::vector<double> g_ref(y_ref.size()), dg_ref(y_ref.size());
      for (size_t i = 0; i < g_ref.size(); ++i) {
        g_ref[i] = gelu_ref(y_ref[i]);
        dg_ref[i] = gelu_grad_ref(y_ref[i]);
      }
      CHECK_CLOSE(g, g_ref, 1e-4, 1e-4, "linear_gelu out");
      CHECK_CLOSE(dg, dg_ref, 1e-4, 1e-4, "linear_gelu derivative");

      std::vector<float> dx = prev_dx, dw = prev_dw, db = prev_db;
      k.linear_backward_input(dx.data(), dy.data(), w.data(), N, C, OC, false);
      k.linear_backward_weight(dw.data(), db.data(), dy.data(), x.data(), N, C, OC, false);
      CHECK_CLOSE(dx, dx_ref, 1e-4, 1e-4, "dx");
      CHECK_CLOSE(dw, dw_ref, 1e-4, 1e-4, "dw");
      CHECK_CLOSE(db, db_ref, 1e-4, 1e-4, "db");
      dx = prev_dx, dw = prev_dw, db = prev_db;
      k.linear_backward_input(dx.data(), dy.data(), w.data(), N, C, OC, true);
      k.linear_backward_weight(dw.data(), db.data(), dy.data(), x.data(), N, C, OC, true);
      CHECK_CLOSE(dx, plus(prev_dx, dx_ref), 1e-4, 1e-4, "dx accumulated");
      CHECK_CLOSE(dw, plus(prev_dw, dw_ref), 1e-4, 1e-4, "dw accumulated");
      CHECK_CLOSE(db, plus(prev_db, db_ref), 1e-4, 1e-4, "db accumulated");
    }
  }
}

TEST_CASE("linear backward matches finite differences, accumulate adds and overwrite replaces", "[kernels]") {
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    CpuKernels k(threads);
    Rand rng(21);
    const int N = 4, C = 9, OC = 6;
    auto x = rng.normal(N * C), w = rng.normal(OC * C, 0.5), b = rng.normal(OC), wout = rng.normal(N * OC);
    auto L = [&] {
      std::vector<float> y(N * OC);
      k.linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
      return dot(wout, y.data(), y.size());
    };
    auto num_x = numeric_grad(x, kEps, L), num_w = numeric_grad(w, kEps, L), num_b = numeric_grad(b, kEps, L);

    std::vector<float> dx(N * C, 1e3f), dw(OC * C, -7.f), db(OC, 5.f);
    k.linear_backward_input(dx.data(), wout.data(), w.data(), N, C, OC, false);
    k.linear_backward_weight(dw.data(), db.data(), wout.data(), x.data(), N, C, OC, false);
    CHECK(grad_error(dx, num_x, kFloor) < kGradTol);
    CHECK(grad_error(dw, num_w, kFloor) < kGradTol);
    CHECK(grad_error(db, num_b, kFloor) < kGradTol);

    std::vector<float> dw_nobias(OC * C, 3.f);  // db may be null
    k.linear_backward_weight(dw_nobias.data(), nullptr, wout.data(), x.data(), N, C, OC, false);
    CHECK(bitwise_equal(dw_nobias, dw));

    auto prev_x = rng.normal(N * C), prev_w = rng.normal(OC * C), prev_b = rng.normal(OC);
    std::vector<float> ax = prev_x, aw = prev_w, ab = prev_b;
    k.linear_backward_input(ax.data(), wout.data(), w.data(), N, C, OC, true);
    k.linear_backward_weight(aw.data(), ab.data(), wout.data(), x.data(), N, C, OC, true);
    CHECK(grad_error(minus(ax, prev_x), num_x, kFloor) < kGradTol);
    CHECK(grad_error(minus(aw, prev_w), num_w, kFloor) < kGradTol);
    CHECK(grad_error(minus(ab, prev_b), num_b, kFloor) < kGradTol);
    CHECK_CLOSE(ax, plus(prev_x, dx), 1e-6, 1e-6, "dx accumulated = previous + overwritten");
    CHECK_CLOSE(aw, plus(prev_w, dw), 1e-6, 1e-6, "dw accumulated = previous + overwritten");
    CHECK_CLOSE(ab, plus(prev_b, db), 1e-6, 1e-6, "db accumulated = previous + overwritten");
  }
}

TEST_CASE("grouped linear calls give the bits of their groups' calls one by one, in list order", "[kernels]") {
  CpuKernels k(2);
  Rand rng(22);
  const int C = 9, OC = 6;
  const int rows[] = {4, 0, 7};  // one group without rows
  auto x = rng.normal(11 * C), dy = rng.normal(11 * OC);
  std::vector<std::vector<float>> w = {rng.normal(OC * C), rng.normal(OC * C), rng.normal(OC * C)};

  std::vector<float> y(11 * OC, 5.f), want_y(11 * OC, 5.f);
  std::vector<LinearGroup> fwd;
  for (int g = 0, at = 0; g < 3; at += rows[g], ++g) {
    fwd.push_back({y.data() + at * OC, x.data() + at * C, w[size_t(g)].data(), rows[g], C, OC});
    k.linear_forward(want_y.data() + at * OC, x.data() + at * C, w[size_t(g)].data(), nullptr, rows[g], C, OC);
  }
  k.linear_forward_grouped(fwd.data(), int(fwd.size()));
  CHECK(bitwise_equal(y, want_y));

  // dx: each group's product, then a second product added into the same output
  std::vector<float> dx(11 * C, 3.f), want_dx(11 * C, 3.f);
  std::vector<LinearGroup> bwd;
  for (bool add : {false, true})
    for (int g = 0, at = 0; g < 3; at += rows[g], ++g) {
      const float* wg = w[size_t(add ? (g + 1) % 3 : g)].data();
      bwd.push_back({dx.data() + at * C, dy.data() + at * OC, wg, rows[g], C, OC, add});
      k.linear_backward_input(want_dx.data() + at * C, dy.data() + at * OC, wg, rows[g], C, OC, add);
    }
  k.linear_backward_input_grouped(bwd.data(), int(bwd.size()));
  CHECK(bitwise_equal(dx, want_dx));

  // dw: written by the first group into it, added by the second; the group without rows zeroes its dw
  std::vector<std::vector<float>> dw(3, std::vector<float>(OC * C, 2.f)), want_dw = dw;
  std::vector<LinearGroup> wgt;
  for (int g = 0, at = 0; g < 3; at += rows[g], ++g) {
    wgt.push_back({dw[size_t(g)].data(), dy.data() + at * OC, x.data() + at * C, rows[g], C, OC, false});
    k.linear_backward_weight(want_dw[size_t(g)].data(), nullptr, dy.data() + at * OC, x.data() + at * C, rows[g], C,
                             OC, false);
  }
  wgt.push_back({dw[2].data(), dy.data(), x.data(), rows[0], C, OC, true});
  k.linear_backward_weight(want_dw[2].data(), nullptr, dy.data(), x.data(), rows[0], C, OC, true);
  k.linear_backward_weight_grouped(wgt.data(), int(wgt.size()));
  for (int g = 0; g < 3; ++g) CHECK(bitwise_equal(dw[size_t(g)], want_dw[size_t(g)]));
  CHECK(std::all_of(dw[1].begin(), dw[1].end(), [](float v) { return v == 0.f; }));
}

TEST_CASE("the saved GELU derivative matches the analytic one and finite differences, and gelu_backward applies it",
          "[kernels]") {
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    CpuKernels k(threads);
    Rand rng(31);
    // Direct check of gelu and gelu' on a grid over [-12, 12]: a 1x1 "linear" with weight 1 passes x
    // through. Within |x| <= 3 the fp32 tanh-GELU derivative is good to ~5e-7; in the tails 1 - tanh^2
    // cancels in fp32 (as in any fp32 implementation of this formula) and the error grows to ~2.5e-6.
    for (size_t n : {size_t(241), size_t(40000)}) {
      INFO("n " << n);
      std::vector<float> grid(n), one(1, 1.f);
      for (size_t i = 0; i < n; ++i) grid[i] = float(-12.0 + 24.0 * double(i) / double(n - 1));
      std::vector<float> out(n, 5.f), deriv(n, 5.f);
      k.linear_gelu_forward(deriv.data(), out.data(), grid.data(), one.data(), nullptr, int(n), 1, 1);
      std::vector<double> ref_center, ref_tail, ref_out;
      std::vector<float> got_center, got_tail;
      for (size_t i = 0; i < n; ++i) {
        bool center = std::fabs(grid[i]) <= 3.f;
        (center ? ref_center : ref_tail).push_back(gelu_grad_ref(grid[i]));
        (center ? got_center : got_tail).push_back(deriv[i]);
        ref_out.push_back(gelu_ref(grid[i]));
      }
      CHECK_CLOSE(got_center, ref_center, 1e-6, 0.0, "gelu'(x), |x| <= 3");
      CHECK_CLOSE(got_tail, ref_tail, 4e-6, 0.0, "gelu'(x), |x| > 3");
      CHECK_CLOSE(out, ref_out, 2e-6, 1e-6, "gelu(x)");
      // gelu_backward multiplies dy by the saved derivative; dpre may alias dy.
      auto dy = rng.normal(n);
      std::vector<float> scaled(n);
      k.gelu_backward(scaled.data(), dy.data(), deriv.data(), n);
      std::vector<double> expected(n);
      for (size_t i = 0; i < n; ++i) expected[i] = double(dy[i]) * double(deriv[i]);
      CHECK_CLOSE(scaled, expected, 1e-12, 1e-6, "dy * gelu'(x)");
      std::vector<float> inplace = dy;
      k.gelu_backward(inplace.data(), inplace.data(), deriv.data(), n);
      CHECK(bitwise_equal(inplace, scaled));
    }
    // Chain rule through the fused linear+GELU forward: L = Σ w_out·gelu(x wᵀ + b).
    const int N = 4, C = 8, OC = 10;
    auto x = rng.normal(N * C), w = rng.normal(OC * C, 0.5), b = rng.normal(OC, 0.5), wout = rng.normal(N * OC);
    std::vector<float> dg(N * OC), y(N * OC);
    auto L = [&] {
      k.linear_gelu_forward(dg.data(), y.data(), x.data(), w.data(), b.data(), N, C, OC);
      return dot(wout, y.data(), y.size());
    };
    auto num_x = numeric_grad(x, kEps, L), num_w = numeric_grad(w, kEps, L), num_b = numeric_grad(b, kEps, L);
    L();
    std::vector<float> dpre(N * OC), dx(N * C), dw(OC * C), db(OC);
    k.gelu_backward(dpre.data(), wout.data(), dg.data(), dpre.size());
    k.linear_backward_input(dx.data(), dpre.data(), w.data(), N, C, OC, false);
    k.linear_backward_weight(dw.data(), db.data(), dpre.data(), x.data(), N, C, OC, false);
    CHECK(grad_error(dx, num_x, kFloor) < kGradTol);
    CHECK(grad_error(dw, num_w, kFloor) < kGradTol);
    CHECK(grad_error(db, num_b, kFloor) < kGradTol);
  }
}

TEST_CASE("layernorm_forward matches a double reference, mean and rstd included", "[kernels]") {
  struct Shape { int N, C; };
  for (Shape s : {Shape{5, 16}, Shape{701, 48}}) {  // the second is split across threads (N·C ≥ 32768)
    for (int threads : {1, 2}) {
      INFO("N " << s.N << " C " << s.C << " threads " << threads);
      CpuKernels k(threads);
      Rand rng(41);
      const int N = s.N, C = s.C;
      auto x = rng.normal(size_t(N) * C, 2.0, 0.5), w = rng.normal(size_t(C), 0.3, 1.0), b = rng.normal(size_t(C), 0.5);
      std::vector<double> mean_ref, rstd_ref;
      auto y_ref = layernorm_ref(x, w, b, N, C, &mean_ref, &rstd_ref);
      std::vector<float> y(size_t(N) * C, 3.f), mean(size_t(N), 3.f), rstd(size_t(N), 3.f);
      k.layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
      CHECK_CLOSE(y, y_ref, kAtol, kRtol, "layernorm y");
      CHECK_CLOSE(mean, mean_ref, kAtol, kRtol, "layernorm mean");
      CHECK_CLOSE(rstd, rstd_ref, kAtol, kRtol, "layernorm rstd");
    }
  }
}

TEST_CASE("layernorm backward matches finite differences, accumulate adds and overwrite replaces", "[kernels]") {
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    CpuKernels k(threads);
    Rand rng(51);
    const int N = 4, C = 12;
    auto x = rng.normal(N * C, 1.0, 0.3), w = rng.normal(C, 0.3, 1.0), b = rng.normal(C, 0.5),
         wout = rng.normal(N * C);
    std::vector<float> y(N * C), mean(N), rstd(N);
    auto L = [&] {
      k.layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
      return dot(wout, y.data(), y.size());
    };
    auto num_x = numeric_grad(x, kEps, L), num_w = numeric_grad(w, kEps, L), num_b = numeric_grad(b, kEps, L);
    L();  // mean and rstd of the unperturbed input

    std::vector<float> dx(N * C, 1e3f), dw(C, -4.f), db(C, 8.f);
    k.layernorm_backward_input(dx.data(), wout.data(), x.data(), mean.data(), rstd.data(), w.data(), N, C, false);
    k.layernorm_backward_weight(dw.data(), db.data(), wout.data(), x.data(), mean.data(), rstd.data(), N, C, false);
    CHECK(grad_error(dx, num_x, kFloor) < kGradTol);
    CHECK(grad_error(dw, num_w, kFloor) < kGradTol);
    CHECK(grad_error(db, num_b, kFloor) < kGradTol);

    auto prev_x = rng.normal(N * C), prev_w = rng.normal(C), prev_b = rng.normal(C);
    std::vector<float> ax = prev_x, aw = prev_w, ab = prev_b;
    k.layernorm_backward_input(ax.data(), wout.data(), x.data(), mean.data(), rstd.data(), w.data(), N, C, true);
    k.layernorm_backward_weight(aw.data(), ab.data(), wout.data(), x.data(), mean.data(), rstd.data(), N, C, true);
    CHECK(grad_error(minus(ax, prev_x), num_x, kFloor) < kGradTol);
    CHECK(grad_error(minus(aw, prev_w), num_w, kFloor) < kGradTol);
    CHECK(grad_error(minus(ab, prev_b), num_b, kFloor) < kGradTol);
    CHECK_CLOSE(ax, plus(prev_x, dx), 1e-5, 1e-6, "dx accumulated = previous + overwritten");
    CHECK_CLOSE(aw, plus(prev_w, dw), 1e-5, 1e-6, "dw accumulated = previous + overwritten");
    CHECK_CLOSE(ab, plus(prev_b, db), 1e-5, 1e-6, "db accumulated = previous + overwritten");
  }
}

TEST_CASE("attention_forward matches a double reference of causal multi-head attention", "[kernels]") {
  const int B = 2, T = 6, C = 8, NH = 2;
  Rand rng(61);
  auto qkv = rng.normal(size_t(B) * T * 3 * C);
  std::vector<double> att_ref;
  auto y_ref = attention_ref(qkv, B, T, C, NH, &att_ref);
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    CpuKernels k(threads);
    std::vector<float> y(size_t(B) * T * C, 5.f), att(size_t(B) * NH * T * T, 5.f);  // junk must be replaced
    k.attention_forward(y.data(), att.data(), qkv.data(), B, T, C, NH);
    CHECK_CLOSE(y, y_ref, kAtol, kRtol, "attention y");
    CHECK_CLOSE(att, att_ref, 1e-6, 1e-5, "attention probabilities (zeros above the diagonal)");
  }
}

TEST_CASE("attention_backward matches finite differences and overwrites dqkv", "[kernels]") {
  const int B = 2, T = 5, C = 8, NH = 2;
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    CpuKernels k(threads);
    Rand rng(71);
    auto qkv = rng.normal(size_t(B) * T * 3 * C), wout = rng.normal(size_t(B) * T * C);
    std::vector<float> y(size_t(B) * T * C), att(size_t(B) * NH * T * T);
    auto L = [&] {
      k.attention_forward(y.data(), att.data(), qkv.data(), B, T, C, NH);
      return dot(wout, y.data(), y.size());
    };
    auto num = numeric_grad(qkv, kEps, L);
    L();
    Guarded scratch(k.attention_scratch_floats(B, T, C, NH) * sizeof(float));
    std::vector<float> dqkv(qkv.size(), 1e3f);
    k.attention_backward(dqkv.data(), wout.data(), qkv.data(), att.data(), scratch.data(), B, T, C, NH);
    size_t worst = 0;
    double err = grad_error(dqkv, num, kFloor, {}, &worst);
    INFO("worst element " << worst << ": analytic " << dqkv[worst] << " numeric " << num[worst]);
    CHECK(err < kGradTol);
    CHECK(scratch.intact());
  }
}

TEST_CASE("embedding forward matches a reference and backward matches finite differences with repeated tokens",
          "[kernels]") {
  const int B = 2, T = 6, C = 8, V = 5;
  // Repeats within and across sequences; token 4 never occurs, so its gradient row is zero.
  const std::vector<int32_t> tok = {0, 1, 1, 3, 0, 2, 3, 3, 1, 0, 2, 1};
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    CpuKernels k(threads);
    Rand rng(81);
    auto wte = rng.normal(size_t(V) * C), wpe = rng.normal(size_t(T) * C), wout = rng.normal(size_t(B) * T * C);
    std::vector<float> x(size_t(B) * T * C, 9.f);
    k.embedding_forward(x.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    CHECK_CLOSE(x, embedding_ref(tok, wte, wpe, B, T, C), 1e-6, 1e-6, "embedding");

    auto L = [&] {
      k.embedding_forward(x.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
      return dot(wout, x.data(), x.size());
    };
    auto num_te = numeric_grad(wte, kEps, L), num_pe = numeric_grad(wpe, kEps, L);
    auto prev_te = rng.normal(wte.size()), prev_pe = rng.normal(wpe.size());
    for (bool acc_te : {false, true})
      for (bool acc_pe : {false, true}) {
        INFO("accumulate_wte " << acc_te << " accumulate_wpe " << acc_pe);
        std::vector<float> dte = prev_te, dpe = prev_pe;
        k.embedding_backward(dte.data(), dpe.data(), wout.data(), tok.data(), B, T, C, V, acc_te, acc_pe);
        std::vector<double> gte(dte.begin(), dte.end()), gpe(dpe.begin(), dpe.end());
        if (acc_te)
          for (size_t i = 0; i < gte.size(); ++i) gte[i] -= prev_te[i];
        if (acc_pe)
          for (size_t i = 0; i < gpe.size(); ++i) gpe[i] -= prev_pe[i];
        CHECK(grad_error(gte, num_te, kFloor) < kGradTol);
        CHECK(grad_error(gpe, num_pe, kFloor) < kGradTol);
        for (int c = 0; c < C; ++c) CHECK(gte[size_t(4) * C + c] == 0.0);  // unused token
      }
  }
  // A size that is split across threads (B·T·C ≥ 32768).
  const int B2 = 16, T2 = 64, C2 = 40, V2 = 50;
  Rand rng(82);
  auto tok2 = rng.ints(size_t(B2) * T2, 0, V2);
  auto wte2 = rng.normal(size_t(V2) * C2), wpe2 = rng.normal(size_t(T2) * C2);
  auto ref2 = embedding_ref(tok2, wte2, wpe2, B2, T2, C2);
  for (int threads : {1, 2}) {
    CpuKernels k(threads);
    std::vector<float> x(ref2.size());
    k.embedding_forward(x.data(), tok2.data(), wte2.data(), wpe2.data(), B2, T2, C2);
    CHECK_CLOSE(x, ref2, 1e-6, 1e-6, "embedding, large");
  }
}

TEST_CASE("softmax_xent forward matches a reference and backward matches finite differences, also in place",
          "[kernels]") {
  const int N = 7, V = 11;
  const float scale = 0.37f;
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    CpuKernels k(threads);
    Rand rng(91);
    auto logits = rng.normal(size_t(N) * V, 2.0);
    auto targets = rng.ints(size_t(N), 0, V);
    std::vector<double> probs_ref;
    const double loss_ref = xent_ref(logits, targets, N, V, &probs_ref);

    std::vector<float> probs(logits.size(), 4.f);
    double loss_sum = 1.5;  // the kernel adds to it
    k.softmax_xent_forward(probs.data(), &loss_sum, logits.data(), targets.data(), N, V, scale);
    CHECK_CLOSE(probs, probs_ref, 1e-6, 1e-5, "probs");
    CHECK(loss_sum - 1.5 == Approx(double(scale) * loss_ref).epsilon(1e-5));

    std::vector<float> inplace = logits;  // probs alias logits
    double loss_inplace = 0;
    k.softmax_xent_forward(inplace.data(), &loss_inplace, inplace.data(), targets.data(), N, V, scale);
    CHECK(bitwise_equal(inplace, probs));
    CHECK(loss_inplace == Approx(double(scale) * loss_ref).epsilon(1e-5));

    auto L = [&] {
      std::vector<float> p(logits.size());
      double l = 0;
      k.softmax_xent_forward(p.data(), &l, logits.data(), targets.data(), N, V, scale);
      return l;
    };
    auto num = numeric_grad(logits, kEps, L);
    std::vector<float> dlogits(logits.size(), 7.f);
    k.softmax_xent_backward(dlogits.data(), probs.data(), targets.data(), N, V, scale);
    size_t worst = 0;
    double err = grad_error(dlogits, num, kFloor * scale, {}, &worst);
    INFO("worst element " << worst << ": analytic " << dlogits[worst] << " numeric " << num[worst]);
    CHECK(err < kGradTol);
    std::vector<float> d_inplace = probs;  // dlogits alias probs
    k.softmax_xent_backward(d_inplace.data(), d_inplace.data(), targets.data(), N, V, scale);
    CHECK(bitwise_equal(d_inplace, dlogits));
  }
  // Sizes split across threads: 600 rows over the fixed reduction chunks, N·V ≥ 32768 for the backward.
  // Rows are shifted by up to 400, where exp overflows fp32 unless the row maximum is subtracted first.
  const int N2 = 600, V2 = 64;
  Rand rng(92);
  auto logits2 = rng.normal(size_t(N2) * V2, 3.0);
  for (int r = 0; r < N2; ++r)
    for (int i = 0; i < V2; ++i) logits2[size_t(r) * V2 + i] += float(200 * (r % 3));
  auto targets2 = rng.ints(size_t(N2), 0, V2);
  std::vector<double> probs_ref2;
  const double loss_ref2 = xent_ref(logits2, targets2, N2, V2, &probs_ref2);
  std::vector<double> dref2(probs_ref2);
  for (int r = 0; r < N2; ++r) dref2[size_t(r) * V2 + size_t(targets2[size_t(r)])] -= 1.0;
  for (int threads : {1, 2}) {
    INFO("large, threads " << threads);
    CpuKernels k(threads);
    std::vector<float> p = logits2;
    double l = 0;
    k.softmax_xent_forward(p.data(), &l, p.data(), targets2.data(), N2, V2, 1.f);
    CHECK_CLOSE(p, probs_ref2, 1e-6, 1e-5, "probs, large");
    CHECK(l == Approx(loss_ref2).epsilon(1e-5));
    k.softmax_xent_backward(p.data(), p.data(), targets2.data(), N2, V2, 1.f);
    CHECK_CLOSE(p, dref2, 1e-6, 1e-5, "dlogits, large");
  }
}

TEST_CASE("add, accumulate, fill, copy, upload and download", "[kernels]") {
  for (size_t n : {size_t(37), size_t(50001)}) {  // the second is split across threads
    for (int threads : {1, 2}) {
      INFO("n " << n << " threads " << threads);
      CpuKernels k(threads);
      Rand rng(101);
      auto a = rng.normal(n), b = rng.normal(n);
      std::vector<float> y(n, 8.f);
      k.add(y.data(), a.data(), b.data(), n);
      bool ok = true;
      for (size_t i = 0; i < n; ++i) ok = ok && y[i] == a[i] + b[i];
      CHECK(ok);
      std::vector<float> acc = a;
      k.accumulate(acc.data(), b.data(), n);
      CHECK(bitwise_equal(acc, y));
      k.accumulate(acc.data(), b.data(), n);
      ok = true;
      for (size_t i = 0; i < n; ++i) ok = ok && acc[i] == (a[i] + b[i]) + b[i];
      CHECK(ok);

      std::vector<float> f(n + 2, 1.f);
      k.fill(f.data() + 1, -2.5f, n);
      ok = f.front() == 1.f && f.back() == 1.f;  // neighbours untouched
      for (size_t i = 1; i <= n; ++i) ok = ok && f[i] == -2.5f;
      CHECK(ok);

      std::vector<float> dst(n + 1, 0.f);
      k.copy(dst.data(), a.data(), n * sizeof(float));
      CHECK(std::memcmp(dst.data(), a.data(), n * sizeof(float)) == 0);
      CHECK(dst[n] == 0.f);
      std::vector<int32_t> ids = {3, -1, 7}, ids_dst(3, 0);  // copy is untyped
      k.copy(ids_dst.data(), ids.data(), sizeof(int32_t) * 3);
      CHECK(ids_dst == ids);
      const std::vector<float> before = a;
      k.copy(a.data(), a.data(), n * sizeof(float));  // self copy leaves the data as it was
      CHECK(bitwise_equal(a, before));
      std::vector<float> up(n, 0.f), down(n, 0.f);  // host <-> device copies (plain memory on CPU)
      k.upload(up.data(), a.data(), n * sizeof(float));
      k.download(down.data(), up.data(), n * sizeof(float));
      CHECK(bitwise_equal(down, a));
    }
  }
}

TEST_CASE("sum_squares adds the sum of squares in double, the same to the bit on 1 and 2 threads", "[kernels]") {
  for (size_t n : {size_t(1), size_t(1000), size_t(200003)}) {
    Rand rng(111);
    auto x = rng.normal(n, 3.0);
    double ref = 0;
    for (float v : x) ref += double(v) * double(v);
    double acc1 = 0;
    for (int threads : {1, 2}) {
      INFO("n " << n << " threads " << threads);
      CpuKernels k(threads);
      double acc = 2.25;  // adds to what is there
      k.sum_squares(&acc, x.data(), n);
      CHECK(acc - 2.25 == Approx(ref).epsilon(1e-6));
      if (threads == 1) acc1 = acc;
      else CHECK(acc == acc1);
    }
  }
}

TEST_CASE("adamw matches torch.optim.AdamW (decoupled decay, bias correction, grad_scale) over steps",
          "[kernels]") {
  for (size_t n : {size_t(53), size_t(40000)}) {  // the second is split across threads
    for (int threads : {1, 2}) {
      INFO("n " << n << " threads " << threads);
      CpuKernels k(threads);
      Rand rng(121);
      auto p = rng.normal(n);
      std::vector<float> m(n, 0.f), v(n, 0.f);
      std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0);
      AdamWArgs a;
      a.lr = 1e-2f;
      a.beta1 = 0.9f;
      a.beta2 = 0.95f;
      a.eps = 1e-8f;
      a.weight_decay = 0.1f;
      for (int64_t step = 1; step <= 5; ++step) {
        INFO("step " << step);
        auto g = rng.normal(n, 0.3);
        for (size_t i = 0; i < n; i += 7) g[i] = 0.f;  // zero gradients: decay only
        a.step = step;
        a.grad_scale = step == 3 ? 0.25f : 1.0f;
        // torch.optim.AdamW (foreach=False): p *= 1 - lr·wd; m = β1 m + (1-β1) g; v = β2 v + (1-β2) g²;
        // p -= lr / (1-β1^t) · m / (sqrt(v) / sqrt(1-β2^t) + eps), with g the clipped gradient.
        const double lr = a.lr, b1 = a.beta1, b2 = a.beta2, eps = a.eps, wd = a.weight_decay;
        const double bc1 = 1 - std::pow(b1, double(step)), bc2 = 1 - std::pow(b2, double(step));
        for (size_t i = 0; i < n; ++i) {
          double gi = double(g[i]) * double(a.grad_scale);
          rp[i] *= 1 - lr * wd;
          rm[i] = b1 * rm[i] + (1 - b1) * gi;
          rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
          rp[i] -= lr / bc1 * rm[i] / (std::sqrt(rv[i]) / std::sqrt(bc2) + eps);
        }
        k.adamw(p.data(), g.data(), m.data(), v.data(), n, a);
        CHECK_CLOSE(m, rm, 1e-8, 1e-5, "first moment");
        CHECK_CLOSE(v, rv, 1e-10, 1e-5, "second moment");
        CHECK_CLOSE(p, rp, 2e-6, 1e-6, "parameters");
      }
    }
  }
}

TEST_CASE("kernels give bit-identical results with 1 and 2 threads", "[kernels]") {
  // Reductions use fixed chunks and per-column row order, attention works per (batch, head):
  // none of them may depend on the number of threads.
  // N·C = 32768 reaches the threshold where row-wise kernels split their rows across threads.
  const int B = 8, T = 32, C = 128, NH = 4, N = B * T, V = 96;
  Rand rng(131);
  auto x = rng.normal(size_t(N) * C), dy = rng.normal(size_t(N) * C), w = rng.normal(size_t(C), 0.2, 1.0),
       b = rng.normal(size_t(C)), qkv = rng.normal(size_t(N) * 3 * C), datty = rng.normal(size_t(N) * C),
       wte = rng.normal(size_t(V) * C), wpe = rng.normal(size_t(T) * C), logits = rng.normal(size_t(N) * V, 2.0);
  auto tok = rng.ints(size_t(N), 0, V);
  struct Out {
    std::vector<float> ln_y, mean, rstd, ln_dx, ln_dw, ln_db, lin_dw, lin_db, att_y, att, dqkv, dwte, dwpe, probs;
    double loss = 0, ss = 0;
  };
  auto run = [&](int threads) {
    CpuKernels k(threads);
    Out o;
    o.ln_y.resize(x.size()), o.mean.resize(size_t(N)), o.rstd.resize(size_t(N));
    k.layernorm_forward(o.ln_y.data(), o.mean.data(), o.rstd.data(), x.data(), w.data(), b.data(), N, C);
    o.ln_dx.resize(x.size()), o.ln_dw.resize(size_t(C)), o.ln_db.resize(size_t(C));
    k.layernorm_backward_input(o.ln_dx.data(), dy.data(), x.data(), o.mean.data(), o.rstd.data(), w.data(), N, C,
                               false);
    k.layernorm_backward_weight(o.ln_dw.data(), o.ln_db.data(), dy.data(), x.data(), o.mean.data(), o.rstd.data(), N,
                                C, false);
    o.lin_dw.resize(size_t(C) * C), o.lin_db.resize(size_t(C));
    k.linear_backward_weight(o.lin_dw.data(), o.lin_db.data(), dy.data(), x.data(), N, C, C, false);
    o.att_y.resize(size_t(N) * C), o.att.resize(size_t(B) * NH * T * T), o.dqkv.resize(qkv.size());
    k.attention_forward(o.att_y.data(), o.att.data(), qkv.data(), B, T, C, NH);
    std::vector<float> scratch(k.attention_scratch_floats(B, T, C, NH));
    k.attention_backward(o.dqkv.data(), datty.data(), qkv.data(), o.att.data(), scratch.data(), B, T, C, NH);
    o.dwte.resize(wte.size()), o.dwpe.resize(wpe.size());
    k.embedding_backward(o.dwte.data(), o.dwpe.data(), dy.data(), tok.data(), B, T, C, V, false, false);
    o.probs.resize(logits.size());
    k.softmax_xent_forward(o.probs.data(), &o.loss, logits.data(), tok.data(), N, V, 1.f);
    k.sum_squares(&o.ss, logits.data(), logits.size());
    return o;
  };
  Out one = run(1), two = run(2);
  CHECK(bitwise_equal(one.ln_y, two.ln_y));
  CHECK(bitwise_equal(one.mean, two.mean));
  CHECK(bitwise_equal(one.rstd, two.rstd));
  CHECK(bitwise_equal(one.ln_dx, two.ln_dx));
  CHECK(bitwise_equal(one.ln_dw, two.ln_dw));
  CHECK(bitwise_equal(one.ln_db, two.ln_db));
  CHECK(bitwise_equal(one.lin_db, two.lin_db));
  CHECK_CLOSE(two.lin_dw, one.lin_dw, 1e-5, 1e-5, "linear dw");  // BLAS blocking may differ
  CHECK(bitwise_equal(one.att_y, two.att_y));
  CHECK(bitwise_equal(one.att, two.att));
  CHECK(bitwise_equal(one.dqkv, two.dqkv));
  CHECK(bitwise_equal(one.dwte, two.dwte));
  CHECK(bitwise_equal(one.dwpe, two.dwpe));
  CHECK(bitwise_equal(one.probs, two.probs));
  CHECK(one.loss == two.loss);
  CHECK(one.ss == two.ss);
}

TEST_CASE("sgemm_parallel gives the product whichever way it splits the work", "[kernels]") {
  // Each split (rows, columns, K) on shapes that choose it, all four transpositions, beta 0 and 1, against
  // one double-precision reference; K ≫ M, N (a weight gradient) must choose the K split.
  CHECK(choose_gemm_split(64, 64, 2048, 2) == GemmSplit::K);
  CHECK(choose_gemm_split(2048, 256, 256, 2) == GemmSplit::Rows);
  CHECK(choose_gemm_split(256, 2048, 256, 2) == GemmSplit::Cols);
  CHECK(choose_gemm_split(64, 64, 2048, 1) != GemmSplit::K);
  struct Shape {
    int M, N, K;
  };
  Rand rng(29);
  for (Shape s : {Shape{48, 40, 1500}, Shape{300, 40, 200}, Shape{40, 300, 200}})
    for (int threads : {1, 2, 3})
      for (int ta : {0, 1})
        for (int tb : {0, 1})
          for (float beta : {0.f, 1.f}) {
            INFO("M " << s.M << " N " << s.N << " K " << s.K << " threads " << threads << " ta " << ta << " tb "
                      << tb << " beta " << beta);
            auto A = rng.normal(size_t(s.M) * s.K), B = rng.normal(size_t(s.K) * s.N);
            auto C = rng.normal(size_t(s.M) * s.N);
            const int lda = ta ? s.M : s.K, ldb = tb ? s.K : s.N;
            std::vector<double> ref(C.size());
            for (int i = 0; i < s.M; ++i)
              for (int j = 0; j < s.N; ++j) {
                double acc = beta * double(C[size_t(i) * s.N + j]);
                for (int p = 0; p < s.K; ++p) {
                  double a = ta ? A[size_t(p) * lda + i] : A[size_t(i) * lda + p];
                  double b = tb ? B[size_t(j) * ldb + p] : B[size_t(p) * ldb + j];
                  acc += 0.5 * a * b;
                }
                ref[size_t(i) * s.N + j] = acc;
              }
            sgemm_parallel(ta, tb, s.M, s.N, s.K, 0.5f, A.data(), lda, B.data(), ldb, beta, C.data(), s.N, threads);
            std::vector<float> reff(ref.begin(), ref.end());
            CHECK_CLOSE(C, reff, 2e-4, 2e-5, "sgemm_parallel");
          }
}

TEST_CASE("the OpenBLAS core check names the core OpenBLAS picked, and is quiet once OPENBLAS_CORETYPE is set",
          "[kernels]") {
  const char* preset = std::getenv("OPENBLAS_CORETYPE");
  const std::string kept = preset ? preset : "";
  ::setenv("OPENBLAS_CORETYPE", "HASWELL", 1);
  CHECK(blas_core_warning().empty());
  ::unsetenv("OPENBLAS_CORETYPE");
  const std::string warning = blas_core_warning();
  if (preset) ::setenv("OPENBLAS_CORETYPE", kept.c_str(), 1);
  // On this processor OpenBLAS either runs vector kernels (no warning) or not: then the warning names its core
  // and the OPENBLAS_CORETYPE to set.
  if (!warning.empty()) {
    CHECK(warning.find(std::string("'") + openblas_get_corename() + "'") != std::string::npos);
    CHECK(warning.find("OPENBLAS_CORETYPE=") != std::string::npos);
  }
}
