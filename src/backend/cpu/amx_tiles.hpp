// bf16 products on AMX tiles (Intel's tile registers, TDPBF16PS) for the small per-head products of attention: the
// tiles configured on the calling thread, with no library call around each product; fp32 sums, as every bf16 path.
#pragma once
#include <cstdint>
#include <string>

namespace piper {

// Whether this process can run tile products: the processor lists amx_tile and amx_bf16, this build can emit them,
// and Linux granted the tile state (arch_prctl). Asked once; `why_not` says what is missing when it cannot.
bool amx_tiles_available(std::string* why_not = nullptr);

// Which k a C tile (rows 16·mt.., columns 16·nt..) sums over, where the other terms are zeros the caller knows of:
// All: 0 ≤ k < K. UpToRow: k < row0 + 16·(mt+1) (A is zero right of its diagonal: causal probabilities or their
// gradient). FromColumn: k ≥ 16·nt (B is zero left of its diagonal: the transposed case). Skipping zeros leaves the
// sums' bits as they are.
enum class TileSums { All, UpToRow, FromColumn };

// How amx_product runs beyond its operands.
struct TileProduct {
  TileSums sums = TileSums::All;
  // blocks of C tiles wholly right of the diagonal (columns past row0 + their last row) are not computed, their
  // values unspecified: a causal score matrix whose upper triangle is never read
  bool lower_tiles_only = false;
  int row0 = 0;             // C's first row in the causal matrix (UpToRow, lower_tiles_only), a multiple of 16
  int ldb = 0;              // Bv's columns (pairs) per pair row, where B is the first N of them (0: N)
  bool accumulate = false;  // C += the product
};

// C(M,N) = A(M,K) · B(K,N) on the calling thread, fp32 sums: A bf16 row-major with leading dimension lda; B in the
// pair-interleaved layout TDPBF16PS reads, Bv[(k/2)·ldb + n][k%2] (vnni_*); C fp32 with leading dimension ldc.
// M and N multiples of 16, K a multiple of 32.
void amx_product(int M, int N, int K, const uint16_t* A, int lda, const uint16_t* Bv, float* C, int ldc,
                 const TileProduct& how = {});

// Bv for B(K,N) = rows of `b` (K rows of N, leading dimension ldb): pairs of rows interleaved.
void vnni_from_rows(uint16_t* Bv, const uint16_t* b, int ldb, int K, int N);
// Bv for B(K,N) = bᵀ, b (N rows of K, leading dimension ldb): pairs of b's columns, 32 bits at a time.
void vnni_from_transposed(uint16_t* Bv, const uint16_t* b, int ldb, int K, int N);

// The transposes around tile products whose operand or result is transposed (AVX-512 where the shapes allow):
// dst(cols,rows) = src(rows,cols)ᵀ, bf16 bits, src's leading dimension lds; and dst(rows,cols) (leading dimension
// ldd) = scale · src(cols,rows)ᵀ, fp32.
void transpose_bits(uint16_t* dst, const uint16_t* src, int lds, int rows, int cols);
void store_transposed(float* dst, int ldd, const float* src, int rows, int cols, float scale);
// Rows as they are: dst(rows,cols) (leading dimension ldd) = src rounded to bf16 (util/precision.hpp's bits), and
// dst = scale · src in fp32 (leading dimensions ldd and lds).
void round_rows(uint16_t* dst, int ldd, const float* src, int lds, int rows, int cols);
void store_scaled(float* dst, int ldd, const float* src, int lds, int rows, int cols, float scale);

}  // namespace piper
