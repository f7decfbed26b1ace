// oneDNN's matmul primitive for bf16 products on the CPU (AMX tiles through its brgemm kernels), through oneDNN's C
// API in libdnnl.so.2 loaded at run time: one primitive made per shape and kept, bf16 operands, fp32 sums and output.
#pragma once
#include <cstdint>
#include <string>

namespace piper {

// Whether the primitive can be used here: this build saw oneDNN's headers (Debian's libdnnl-dev) and libdnnl.so.2
// has the C API's functions. Asked once; `why_not` says what is missing when it cannot.
bool onednn_matmul_available(std::string* why_not = nullptr);

// C(M,N) = op(A)(M,K) · op(B)(K,N) (+ bias(N) on every row, fp32, where given) + beta · C, row-major, A and B bf16
// bits with leading dimensions lda and ldb, C fp32 with ldc; beta 0 or 1. On `threads` OpenMP threads of the calling
// thread; primitives are kept per thread and shape.
void onednn_matmul(bool trans_a, bool trans_b, int M, int N, int K, const uint16_t* A, int lda, const uint16_t* B,
                   int ldb, float beta, float* C, int ldc, int threads, const float* bias = nullptr);
// The same with beta 0 and C(M,N) written as bf16 bits: the fp32 sums (and bias) rounded to nearest, ties to even,
// by the primitive as it stores them.
void onednn_matmul_to_bf16(bool trans_a, bool trans_b, int M, int N, int K, const uint16_t* A, int lda,
                           const uint16_t* B, int ldb, uint16_t* C, int ldc, int threads, const float* bias = nullptr);

}  // namespace piper
