// The products inside the CPU attention kernels in either matmul precision: fp32 through cblas_sgemm (alpha inside
// the product, as it always was), or bf16 operands (fp32 values rounded, or bf16 activations as they are) through
// bf16_gemm (alpha on the fp32 sums).
#pragma once
#include <cblas.h>

#include <cstdint>

#include "backend/cpu/bf16_gemm.hpp"
#include "backend/kernels.hpp"

namespace piper {

// An attention operand for bf16_gemm: fp32 values (rounded there) or bf16 bits, with its leading dimension.
inline Bf16Input attention_operand(ConstAct a, int ld) {
  return a.bf16 ? Bf16Input{nullptr, a.bits(), ld} : Bf16Input{a.f32(), nullptr, ld};
}

// C(M,N) = alpha · op(A)(M,K) · op(B)(K,N) + beta · C on the calling thread. kBf16: A and B as bf16 (rounded where
// they are fp32) multiplied with fp32 sums, then alpha applied to C, so there alpha must be 1 where beta is not 0.
// fp32: A and B are fp32 (the kernels check their inputs).
template <bool kBf16>
inline void attention_product(bool ta, bool tb, int M, int N, int K, float alpha, ConstAct A, int lda, ConstAct B,
                              int ldb, float beta, float* C, int ldc) {
  if constexpr (kBf16) {
    bf16_gemm(ta, tb, M, N, K, attention_operand(A, lda), attention_operand(B, ldb), beta, C, ldc, 1,
              bf16_gemm_path_on_one_thread());
    if (alpha != 1.f)
      for (int r = 0; r < M; ++r)
        for (int c = 0; c < N; ++c) C[int64_t(r) * ldc + c] *= alpha;
  } else {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha,
                A.f32(), lda, B.f32(), ldb, beta, C, ldc);
  }
}

}  // namespace piper
