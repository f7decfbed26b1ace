// bf16 rounding (util/precision.hpp) and the CPU's bf16 matmul paths: oneDNN's bf16 gemm and sgemm of rounded
// operands compute the same sums of exact products, on every transpose, with a prior (beta) and without; weights
// kept for the pieces of a pass give the same bits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cpu/amx_tiles.hpp"
#include "backend/cpu/bf16_gemm.hpp"
#include "util/precision.hpp"

using namespace piper;

namespace {

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace

TEST_CASE("bf16 rounding: nearest, ties to even, exact values kept, inf and NaN", "[bf16]") {
  CHECK(round_bf16(1.f) == 1.f);
  CHECK(round_bf16(-0.f) == 0.f);
  CHECK(std::signbit(round_bf16(-0.f)));
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1)
  CHECK(round_bf16(1.f + std::ldexp(1.f, -8)) == 1.f);
  // 1 + 3·2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: to the even one, 1 + 2^-6
  CHECK(round_bf16(1.f + 3 * std::ldexp(1.f, -8)) == 1.f + std::ldexp(1.f, -6));
  // just above a tie rounds up
  CHECK(round_bf16(from_bits(0x3f808001u)) == from_bits(0x3f810000u));
  CHECK(round_bf16(from_bits(0x3f807fffu)) == 1.f);
  CHECK(std::isinf(round_bf16(std::numeric_limits<float>::infinity())));
  CHECK(std::isinf(round_bf16(3.4e38f)));  // past bf16's largest finite value: rounds to inf, as RNE does
  CHECK(std::isnan(round_bf16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isnan(round_bf16(from_bits(0x7f800001u))));  // a NaN whose payload would round to inf stays NaN
  CHECK(bf16_bits(1.f) == 0x3f80);
  CHECK(bf16_value(0x3f80) == 1.f);
  // the error of a rounding is at most half a unit in the last of its 8 significant bits: 2^-8 of the value
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> u(-100.f, 100.f);
  for (int i = 0; i < 10000; ++i) {
    const float x = u(gen);
    CHECK(std::abs(round_bf16(x) - x) <= std::ldexp(std::abs(x), -8));
  }
}

TEST_CASE("bf16 gemm: oneDNN's gemm and matmul and sgemm of rounded operands agree on every transpose", "[bf16]") {
  if (!bf16_onednn_loaded()) {
    WARN("libdnnl.so.2 does not load here: only the rounded path is checked (by the kernel cases)");
    return;
  }
  std::vector<Bf16GemmPath> paths = {Bf16GemmPath::OneDnn};
  if (bf16_onednn_matmul_loaded()) paths.push_back(Bf16GemmPath::OneDnnMatmul);
  else WARN("oneDNN's matmul primitive cannot be called here: its gemm alone is checked");
  const int M = 70, N = 45, K = 131;
  std::mt19937 gen(9);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> A(size_t(M) * K), B(size_t(K) * N), prior(size_t(M) * N);
  for (float& x : A) x = u(gen);
  for (float& x : B) x = u(gen);
  for (float& x : prior) x = u(gen);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.f, 1.f}) {
        const int lda = ta ? M : K, ldb = tb ? K : N;
        std::vector<float> want = prior;
        bf16_gemm_parallel(ta, tb, M, N, K, A.data(), lda, B.data(), ldb, beta, want.data(), N, 2,
                           Bf16GemmPath::Rounded);
        for (Bf16GemmPath path : paths)
          for (int threads : {1, 2}) {
            std::vector<float> c = prior;
            bf16_gemm_parallel(ta, tb, M, N, K, A.data(), lda, B.data(), ldb, beta, c.data(), N, threads, path);
            double worst = 0;
            for (size_t i = 0; i < c.size(); ++i) worst = std::max(worst, double(std::abs(c[i] - want[i])));
            INFO((path == Bf16GemmPath::OneDnn ? "gemm" : "matmul") << " threads " << threads << " ta " << ta
                                                                     << " tb " << tb << " beta " << beta
                                                                     << ": largest difference " << worst);
            CHECK(worst < 1e-4);  // sums of 131 products of size < 1 in fp32, in two orders
          }
      }
}

TEST_CASE("bf16 gemm: oneDNN's matmul reads and writes inside wider rows, and a shape made before serves new buffers",
          "[bf16]") {
  if (!bf16_onednn_matmul_loaded()) {
    WARN("oneDNN's matmul primitive cannot be called here");
    return;
  }
  const int M = 21, N = 17, K = 40, pad = 5;  // every matrix inside rows `pad` wider than it
  std::mt19937 gen(12);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int round = 0; round < 2; ++round) {  // the second time: the shape's primitive again, other buffers
        const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
        std::vector<float> A(size_t(ta ? K : M) * lda), B(size_t(tb ? N : K) * ldb), C(size_t(M) * ldc);
        for (auto* v : {&A, &B, &C})
          for (float& x : *v) x = u(gen);
        std::vector<float> got = C, want = C;
        bf16_gemm_parallel(ta, tb, M, N, K, A.data(), lda, B.data(), ldb, 1.f, want.data(), ldc, 2,
                           Bf16GemmPath::Rounded);
        bf16_gemm_parallel(ta, tb, M, N, K, A.data(), lda, B.data(), ldb, 1.f, got.data(), ldc, 2,
                           Bf16GemmPath::OneDnnMatmul);
        INFO("ta " << ta << " tb " << tb << " round " << round);
        for (int r = 0; r < M; ++r)
          for (int c = 0; c < ldc; ++c) {
            const size_t i = size_t(r) * ldc + c;
            if (c < N) CHECK(got[i] == Approx(want[i]).margin(1e-4));
            else CHECK(got[i] == C[i]);  // the padding is left as it was
          }
      }
  // a bias added by the product, to every row (and nothing to the padding), after a beta of 0 or 1
  for (float beta : {0.f, 1.f}) {
    const int lda = K, ldb = N, ldc = N + pad;
    std::vector<float> A(size_t(M) * lda), B(size_t(K) * ldb), C(size_t(M) * ldc), bias(static_cast<size_t>(N));
    for (auto* v : {&A, &B, &C, &bias})
      for (float& x : *v) x = u(gen);
    std::vector<float> got = C, want = C;
    bf16_gemm(false, false, M, N, K, {A.data(), nullptr, lda}, {B.data(), nullptr, ldb}, beta, want.data(), ldc, 2,
              Bf16GemmPath::Rounded);
    bf16_gemm(false, false, M, N, K, {A.data(), nullptr, lda}, {B.data(), nullptr, ldb}, beta, got.data(), ldc, 2,
              Bf16GemmPath::OneDnnMatmul, bias.data());
    INFO("bias, beta " << beta);
    for (int r = 0; r < M; ++r)
      for (int c = 0; c < ldc; ++c) {
        const size_t i = size_t(r) * ldc + c;
        if (c < N) CHECK(got[i] == Approx(want[i] + bias[size_t(c)]).margin(1e-4));
        else CHECK(got[i] == C[i]);
      }
  }
  CHECK_THROWS(bf16_gemm(false, false, 1, 1, 1, {nullptr, nullptr, 1}, {nullptr, nullptr, 1}, 0.f, nullptr, 1, 1,
                         Bf16GemmPath::Rounded, std::vector<float>(1).data()));  // only the matmul adds a bias
  std::vector<float> C(6, 3.f);
  bf16_gemm_parallel(false, false, 2, 3, 0, nullptr, 1, nullptr, 3, 1.f, C.data(), 3, 2, Bf16GemmPath::OneDnnMatmul);
  CHECK(C == std::vector<float>(6, 3.f));  // an empty sum added
  bf16_gemm_parallel(false, false, 2, 3, 0, nullptr, 1, nullptr, 3, 0.f, C.data(), 3, 2, Bf16GemmPath::OneDnnMatmul);
  CHECK(C == std::vector<float>(6, 0.f));
}

TEST_CASE("AMX tile products: the sums of exact bf16 products, B from rows or transposed, causal ranges and blocks, "
          "a block of rows added to C",
          "[bf16]") {
  std::string why;
  if (!amx_tiles_available(&why)) {
    WARN("no AMX tile products here: " << why);
    return;
  }
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  // odd tile counts (48 = 3 tiles) exercise the single-tile edges of the 2×2 blocks; a padded lda and ldc
  for (auto [M, N, K] : {std::tuple{48, 80, 64}, std::tuple{128, 32, 128}, std::tuple{128, 128, 32}}) {
    const int lda = K + 8, ldc = N + 4;
    std::vector<uint16_t> A(size_t(M) * lda), B(size_t(K) * N), Bt(size_t(N) * K), Bv(size_t(K) * N), Bv2(Bv.size());
    for (auto& x : A) x = bf16_bits(u(gen));
    for (int k = 0; k < K; ++k)
      for (int n = 0; n < N; ++n) Bt[size_t(n) * K + k] = B[size_t(k) * N + n] = bf16_bits(u(gen));
    vnni_from_rows(Bv.data(), B.data(), N, K, N);
    vnni_from_transposed(Bv2.data(), Bt.data(), K, K, N);
    CHECK(Bv == Bv2);  // both layouts of the same B
    auto want = [&](int m, int n, int k0, int k1) {
      double s = 0;
      for (int k = k0; k < k1; ++k) s += double(bf16_value(A[size_t(m) * lda + k])) * bf16_value(B[size_t(k) * N + n]);
      return s;
    };
    std::vector<float> C(size_t(M) * ldc, 7.f);
    amx_product(M, N, K, A.data(), lda, Bv.data(), C.data(), ldc);
    INFO(M << "x" << N << "x" << K);
    for (int m = 0; m < M; ++m)
      for (int c = 0; c < ldc; ++c) {
        if (c < N) CHECK(C[size_t(m) * ldc + c] == Approx(want(m, c, 0, K)).margin(1e-4));
        else CHECK(C[size_t(m) * ldc + c] == 7.f);  // the padding is left as it was
      }
    if (M != K) continue;
    // causal: A zero right of its diagonal sums only k ≤ its row's tile; B zero left of its diagonal only k ≥ n's tile
    std::vector<uint16_t> lower = A, upper = B;
    for (int m = 0; m < M; ++m)
      for (int k = m + 1; k < K; ++k) lower[size_t(m) * lda + k] = 0;
    for (int k = 0; k < K; ++k)
      for (int n = 0; n < std::min(k, N); ++n) upper[size_t(k) * N + n] = 0;
    std::vector<float> full(size_t(M) * ldc), part(size_t(M) * ldc);
    amx_product(M, N, K, lower.data(), lda, Bv.data(), full.data(), ldc);
    amx_product(M, N, K, lower.data(), lda, Bv.data(), part.data(), ldc, {.sums = TileSums::UpToRow});
    CHECK(part == full);
    vnni_from_rows(Bv2.data(), upper.data(), N, K, N);
    amx_product(M, N, K, A.data(), lda, Bv2.data(), full.data(), ldc);
    amx_product(M, N, K, A.data(), lda, Bv2.data(), part.data(), ldc, {.sums = TileSums::FromColumn});
    CHECK(part == full);
    // the lower blocks only: every tile on or left of the diagonal as in the full product
    std::fill(part.begin(), part.end(), 0.f);
    amx_product(M, N, K, A.data(), lda, Bv.data(), full.data(), ldc);
    amx_product(M, N, K, A.data(), lda, Bv.data(), part.data(), ldc, {.lower_tiles_only = true});
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N && n / 16 <= m / 16; ++n) CHECK(part[size_t(m) * ldc + n] == full[size_t(m) * ldc + n]);
    // a block of rows of the causal matrix (row0), against the first 32 columns of a wider Bv (ldb), added to C
    const int row0 = 32, rows = 32, cols = 32;
    std::vector<float> block(size_t(rows) * ldc, 0.5f), prior = block;
    amx_product(M, N, K, lower.data(), lda, Bv.data(), full.data(), ldc);
    amx_product(rows, cols, K, lower.data() + size_t(row0) * lda, lda, Bv.data(), block.data(), ldc,
                {.sums = TileSums::UpToRow, .lower_tiles_only = true, .row0 = row0, .ldb = N, .accumulate = true});
    for (int r = 0; r < rows; ++r)
      for (int n = 0; n < cols && n <= row0 + r; ++n)
        CHECK(block[size_t(r) * ldc + n] == Approx(prior[size_t(r) * ldc + n] + full[size_t(row0 + r) * ldc + n])
                                                .margin(1e-5));
  }
  CHECK_THROWS(amx_product(16, 16, 16, nullptr, 16, nullptr, nullptr, 16));  // K not in whole tiles
}

TEST_CASE("bf16 linear layers with kept weights: the same bits, and a weight changed after the scope is read again",
          "[bf16]") {
  auto be = make_backend("cpu", 2, 0);
  Kernels& k = be->kernels();
  k.set_matmul_precision(Precision::Bf16);
  const int N = 37, C = 24, OC = 19;
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x(size_t(N) * C), w(size_t(OC) * C), dy(size_t(N) * OC), b(static_cast<size_t>(OC));
  for (auto* v : {&x, &w, &dy, &b})
    for (float& e : *v) e = u(gen);
  std::vector<float> y0(size_t(N) * OC), dx0(size_t(N) * C, 0.5f), y1 = y0, dx1 = dx0;
  k.linear_forward(y0.data(), x.data(), w.data(), b.data(), N, C, OC);
  k.linear_backward_input(dx0.data(), dy.data(), w.data(), N, C, OC, true);
  k.keep_weights(true);
  for (int piece = 0; piece < 2; ++piece) {  // the second time from the kept operand
    std::vector<float> dx = dx1;
    k.linear_forward(y1.data(), x.data(), w.data(), b.data(), N, C, OC);
    k.linear_backward_input(dx.data(), dy.data(), w.data(), N, C, OC, true);
    CHECK(y1 == y0);
    CHECK(dx == dx0);
  }
  k.keep_weights(false);
  for (float& e : w) e = -e;  // a new weight at the same address: the next scope rounds it anew
  k.keep_weights(true);
  k.linear_forward(y1.data(), x.data(), w.data(), b.data(), N, C, OC);
  k.keep_weights(false);
  for (size_t i = 0; i < y1.size(); ++i) CHECK(y1[i] == Approx(2 * b[i % OC] - y0[i]).margin(1e-5));
}

TEST_CASE("bf16 gemm: bf16 operands give the bits of the fp32 values they round, on both paths and every transpose",
          "[bf16]") {
  const int M = 33, N = 40, K = 57;
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> A(size_t(M) * K), B(size_t(K) * N), prior(size_t(M) * N);
  for (auto* v : {&A, &B, &prior})
    for (float& x : *v) x = u(gen);
  std::vector<uint16_t> a16(A.size()), b16(B.size());
  for (size_t i = 0; i < A.size(); ++i) a16[i] = bf16_bits(A[i]);
  for (size_t i = 0; i < B.size(); ++i) b16[i] = bf16_bits(B[i]);
  std::vector<Bf16GemmPath> paths = {Bf16GemmPath::Rounded};
  if (bf16_onednn_loaded()) paths.push_back(Bf16GemmPath::OneDnn);
  if (bf16_onednn_matmul_loaded()) paths.push_back(Bf16GemmPath::OneDnnMatmul);
  for (Bf16GemmPath path : paths)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int lda = ta ? M : K, ldb = tb ? K : N;
        std::vector<float> want = prior, a_bits = prior, both_bits = prior;
        bf16_gemm(ta, tb, M, N, K, {A.data(), nullptr, lda}, {B.data(), nullptr, ldb}, 1.f, want.data(), N, 2, path);
        bf16_gemm(ta, tb, M, N, K, {nullptr, a16.data(), lda}, {B.data(), nullptr, ldb}, 1.f, a_bits.data(), N, 2,
                  path);
        bf16_gemm(ta, tb, M, N, K, {nullptr, a16.data(), lda}, {nullptr, b16.data(), ldb}, 1.f, both_bits.data(), N,
                  2, path);
        INFO("path " << int(path) << " ta " << ta << " tb " << tb);
        CHECK(a_bits == want);
        CHECK(both_bits == want);
      }
}

TEST_CASE("bf16 activations: linear calls with kept weights read them as the fp32 values they round, and an fp32 "
          "matmul refuses them",
          "[bf16]") {
  auto be = make_backend("cpu", 2, 0);
  Kernels& k = be->kernels();
  const int N = 29, C = 24, OC = 19;
  std::mt19937 gen(6);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x(size_t(N) * C), w(size_t(OC) * C), dy(size_t(N) * OC);
  for (auto* v : {&x, &w, &dy})
    for (float& e : *v) e = u(gen);
  std::vector<uint16_t> x16(x.size());
  for (size_t i = 0; i < x.size(); ++i) x16[i] = bf16_bits(x[i]);
  std::vector<float> y(size_t(N) * OC), y16 = y, dw(size_t(OC) * C), dw16 = dw;
  CHECK_THROWS(k.linear_forward(y16.data(), ConstAct(x16.data(), true), w.data(), nullptr, N, C, OC));
  k.set_matmul_precision(Precision::Bf16);
  k.keep_weights(true);
  k.linear_forward(y.data(), x.data(), w.data(), nullptr, N, C, OC);
  k.linear_forward(y16.data(), ConstAct(x16.data(), true), w.data(), nullptr, N, C, OC);
  k.keep_weights(false);
  k.linear_backward_weight(dw.data(), nullptr, dy.data(), x.data(), N, C, OC, false);
  k.linear_backward_weight(dw16.data(), nullptr, dy.data(), ConstAct(x16.data(), true), N, C, OC, false);
  CHECK(y16 == y);
  CHECK(dw16 == dw);
}
