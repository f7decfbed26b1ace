// bf16 matmuls on the CPU: both operands rounded to bf16 (nearest, ties to even), products accumulated in fp32.
// oneDNN (libdnnl, loaded at run time) where the processor has bf16 instructions — its matmul primitive, or its bf16
// gemm where this build lacks oneDNN's headers — else OpenBLAS sgemm of the rounded values (the products of two
// bf16 values are exact in fp32, so all compute the same sums, in their own orders).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace piper {

// OneDnnMatmul: oneDNN's matmul primitive (onednn_matmul.hpp); OneDnn: its bf16 gemm (dnnl_gemm_bf16bf16f32);
// Rounded: sgemm of rounded operands.
enum class Bf16GemmPath { OneDnnMatmul, OneDnn, Rounded };

// The path this process takes, chosen once: oneDNN where libdnnl.so.2 loads and /proc/cpuinfo lists avx512_bf16 or
// amx_bf16 (its matmul primitive where this build can call it, else its bf16 gemm), else Rounded. PIPER_BF16_GEMM=
// onednn, =onednn-gemm or =rounded chooses (an error when oneDNN is asked for and absent).
Bf16GemmPath bf16_gemm_path();
// The path for a product on one thread inside a parallel region (attention's per-head products): the process's,
// with oneDNN's bf16 gemm in place of its matmul primitive (whose per-shape primitives are made for the rank's
// threads).
Bf16GemmPath bf16_gemm_path_on_one_thread();
// The path in words, with the processor's bf16 instructions: printed at start and in the metrics header.
std::string bf16_gemm_description();

// Whether oneDNN's bf16 gemm loaded and runs on this processor (not without AVX-512), and whether its matmul
// primitive can be called too.
bool bf16_onednn_loaded();
bool bf16_onednn_matmul_loaded();

// C(M,N) = op(A)(M,K) · op(B)(K,N) + beta · C, row-major, with A and B rounded to bf16 and fp32 accumulation, on
// the calling rank's `threads` threads, by bf16_gemm_path() or the path given (OneDnn needs bf16_onednn_loaded(),
// OneDnnMatmul bf16_onednn_matmul_loaded() and beta 0 or 1).
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
// C(M,N) = op(A)(M,K) · op(B)(K,N) + beta · C as bf16_gemm_parallel, each operand as it comes. `bias` (N), OneDnnMatmul
// only: added to every row by the product (bf16_adds_bias(path) says where it can be).
void bf16_gemm(bool trans_a, bool trans_b, int M, int N, int K, const Bf16Input& A, const Bf16Input& B, float beta,
               float* C, int ldc, int threads, Bf16GemmPath path, const float* bias = nullptr);
inline bool bf16_adds_bias(Bf16GemmPath path) { return path == Bf16GemmPath::OneDnnMatmul; }
// C(M,N) = op(A) · op(B) (+ bias) as bf16_gemm with beta 0, C stored as bf16 bits (the fp32 sums rounded to nearest,
// ties to even, as they are stored): OneDnnMatmul only (bf16_writes_bf16(path) says where).
void bf16_gemm_to_bf16(bool trans_a, bool trans_b, int M, int N, int K, const Bf16Input& A, const Bf16Input& B,
                       uint16_t* C, int ldc, int threads, const float* bias = nullptr);
inline bool bf16_writes_bf16(Bf16GemmPath path) { return path == Bf16GemmPath::OneDnnMatmul; }

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
