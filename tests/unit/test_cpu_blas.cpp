// Tests of the CPU backend's BLAS layer below the Kernels interface: sgemm_parallel's splits of a product across
// threads, and the check that names the OpenBLAS core when OpenBLAS runs generic kernels on a vector processor.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "backend/cpu/blas_core.hpp"
#include "backend/cpu/cpu_kernels.hpp"
#include "test_util.hpp"

using namespace piper;
using namespace piper::test;

extern "C" char* openblas_get_corename(void);

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
