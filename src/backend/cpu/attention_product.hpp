// The products inside the CPU attention kernels in either matmul precision: fp32 through cblas_sgemm (alpha inside
// the product, as it always was), or bf16-rounded operands through bf16_gemm_parallel (alpha on the fp32 sums).
#pragma once
#include <cblas.h>

#include <cstdint>

#include "backend/cpu/bf16_gemm.hpp"

namespace piper {

// C(M,N) = alpha · op(A)(M,K) · op(B)(K,N) + beta · C on the calling thread. kBf16: A and B rounded to bf16 and
// multiplied with fp32 sums, then alpha applied to C, so there alpha must be 1 where beta is not 0.
template <bool kBf16>
inline void attention_product(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                              const float* B, int ldb, float beta, float* C, int ldc) {
  if constexpr (kBf16) {
    bf16_gemm_parallel(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, 1);
    if (alpha != 1.f)
      for (int r = 0; r < M; ++r)
        for (int c = 0; c < N; ++c) C[int64_t(r) * ldc + c] *= alpha;
  } else {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda,
                B, ldb, beta, C, ldc);
  }
}

}  // namespace piper
