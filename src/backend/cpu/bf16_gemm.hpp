// bf16 matmuls on the CPU: both operands rounded to bf16 (nearest, ties to even), products accumulated in fp32.
// oneDNN's bf16 gemm (libdnnl, loaded at run time) where the processor has bf16 instructions, else OpenBLAS sgemm
// of the rounded values (the products of two bf16 values are exact in fp32, so both compute the same sums).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace piper {

enum class Bf16GemmPath { OneDnn, Rounded };

// The path this process takes, chosen once: oneDNN where libdnnl.so.2 loads and /proc/cpuinfo lists avx512_bf16 or
// amx_bf16, else Rounded. PIPER_BF16_GEMM=onednn or =rounded chooses (an error when oneDNN is asked for and absent).
Bf16GemmPath bf16_gemm_path();
// The path in words, with the processor's bf16 instructions: printed at start and in the metrics header.
std::string bf16_gemm_description();

// Whether oneDNN's bf16 gemm loaded (whatever the processor).
bool bf16_onednn_loaded();

// C(M,N) = op(A)(M,K) · op(B)(K,N) + beta · C, row-major, with A and B rounded to bf16 and fp32 accumulation, on
// the calling rank's `threads` threads, by bf16_gemm_path() or the path given (OneDnn needs bf16_onednn_loaded()).
// A and B stay as they are (the rounded copies are scratch of this thread).
void bf16_gemm_parallel(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                        int ldb, float beta, float* C, int ldc, int threads);
void bf16_gemm_parallel(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                        int ldb, float beta, float* C, int ldc, int threads, Bf16GemmPath path);

// An operand of a bf16 matmul with its leading dimension: fp32 values (rounded to bf16 in the call; with `rounded`,
// values that are bf16 already) or bf16 bits, taken as they are.
struct Bf16Input {
  const float* values = nullptr;
  const uint16_t* bits = nullptr;
  int ld = 0;
  bool rounded = false;
};
// C(M,N) = op(A)(M,K) · op(B)(K,N) + beta · C as bf16_gemm_parallel, each operand as it comes.
void bf16_gemm(bool trans_a, bool trans_b, int M, int N, int K, const Bf16Input& A, const Bf16Input& B, float beta,
               float* C, int ldc, int threads, Bf16GemmPath path);

// An operand rounded once for several products (a weight that stays as it is while they run): packed (rows, cols),
// as bf16 bits for oneDNN or as rounded floats for sgemm, by the process's path.
struct Bf16Operand {
  const float* source = nullptr;  // what it was made from, with its shape
  int rows = 0, cols = 0, ld = 0;
  std::vector<uint16_t> bits;
  std::vector<float> rounded;
  Bf16Input input() const {  // as the process's path made it
    return bits.empty() ? Bf16Input{rounded.data(), nullptr, cols, true} : Bf16Input{nullptr, bits.data(), cols};
  }
};
void bf16_prepare(Bf16Operand& out, const float* src, int rows, int cols, int ld, int threads);
// bf16_gemm_parallel with B prepared (op(B) of B's packed (rows, cols)).
void bf16_gemm_parallel(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
                        const Bf16Operand& B, float beta, float* C, int ldc, int threads);

}  // namespace piper
