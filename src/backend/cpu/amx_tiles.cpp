// AMX tile products (see amx_tiles.hpp): the tile state asked of Linux once, eight 16×64-byte tiles configured per
// call (other code on the thread, oneDNN's kernels among them, configures its own), 2×2 C tiles a step where they fit.
#include "backend/cpu/amx_tiles.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_flags.hpp"
#include "util/error.hpp"
#include "util/precision.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 11 || defined(__clang__))
#include <immintrin.h>
#define PIPER_AMX_BUILD 1
#else
#define PIPER_AMX_BUILD 0
#endif

namespace piper {

namespace {

struct Availability {
  bool ok = false;
  std::string why_not;
};

const Availability& availability() {
  static const Availability a = [] {
    Availability r;
    if (!PIPER_AMX_BUILD) {
      r.why_not = "this build cannot emit AMX instructions";
    } else if (!cpu_flags().count("amx_tile") || !cpu_flags().count("amx_bf16")) {
      r.why_not = "the processor has no AMX bf16 tiles";
    } else {
      constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl: ask for an extended state component
      constexpr long kXfeatureXtiledata = 18;     // the tile data state
      if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0)
        r.why_not = "Linux did not grant the tile state (arch_prctl)";
      else
        r.ok = true;
    }
    return r;
  }();
  return a;
}

#if PIPER_AMX_BUILD
// The LDTILECFG operand: palette 1, every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  TileConfig() {
    for (int t = 0; t < 8; ++t) colsb[t] = 64, rows[t] = 16;
  }
};

// The k range of a block of C tiles (rows mt1 and before, columns nt0 and after), in whole 32-k steps.
inline void k_range(const TileProduct& how, int K, int mt1, int nt0, int& k0, int& k1) {
  k0 = 0, k1 = K;
  if (how.sums == TileSums::UpToRow) k1 = std::min(K, (how.row0 + 16 * (mt1 + 1) + 31) / 32 * 32);
  if (how.sums == TileSums::FromColumn) k0 = (16 * nt0) / 32 * 32;
}

// Tiles: C in 0..3, A in 4 and 5, B in 6 and 7. Strides in bytes.
[[gnu::target("amx-tile,amx-bf16")]] void tile_product(int M, int N, int K, const uint16_t* A, int lda,
                                                       const uint16_t* Bv, float* C, int ldc,
                                                       const TileProduct& how) {
  static thread_local TileConfig config;
  _tile_loadconfig(&config);
  const int ldb = how.ldb ? how.ldb : N;
  const long a_stride = long(lda) * 2, b_stride = long(ldb) * 4, c_stride = long(ldc) * 4;
  auto a_at = [&](int m, int k) { return A + int64_t(m) * lda + k; };
  auto b_at = [&](int k, int n) { return Bv + (int64_t(k / 2) * ldb + n) * 2; };
  auto c_at = [&](int m, int n) { return C + int64_t(m) * ldc + n; };
  const int MT = M / 16, NT = N / 16, diagonal = how.row0 / 16;  // C's tile row 0 is the matrix's `diagonal`
  for (int mt = 0; mt < MT; mt += 2) {
    const bool two_m = mt + 1 < MT;
    const int mt_last = mt + (two_m ? 1 : 0);
    for (int nt = 0; nt < NT; nt += 2) {
      if (how.lower_tiles_only && nt > diagonal + mt_last) break;  // this block and the rest lie above the diagonal
      const bool two_n = nt + 1 < NT;
      int k0, k1;
      k_range(how, K, mt_last, nt, k0, k1);
      const int m = 16 * mt, n = 16 * nt;
      if (how.accumulate) {
        _tile_loadd(0, c_at(m, n), c_stride);
        if (two_n) _tile_loadd(1, c_at(m, n + 16), c_stride);
        if (two_m) _tile_loadd(2, c_at(m + 16, n), c_stride);
        if (two_m && two_n) _tile_loadd(3, c_at(m + 16, n + 16), c_stride);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int k = k0; k < k1; k += 32) {
        _tile_loadd(4, a_at(m, k), a_stride);
        _tile_loadd(6, b_at(k, n), b_stride);
        _tile_dpbf16ps(0, 4, 6);
        if (two_n) {
          _tile_loadd(7, b_at(k, n + 16), b_stride);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (two_m) {
          _tile_loadd(5, a_at(m + 16, k), a_stride);
          _tile_dpbf16ps(2, 5, 6);
          if (two_n) _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, c_at(m, n), c_stride);
      if (two_n) _tile_stored(1, c_at(m, n + 16), c_stride);
      if (two_m) _tile_stored(2, c_at(m + 16, n), c_stride);
      if (two_m && two_n) _tile_stored(3, c_at(m + 16, n + 16), c_stride);
    }
  }
  _tile_release();
}
#endif

}  // namespace

bool amx_tiles_available(std::string* why_not) {
  const Availability& a = availability();
  if (why_not) *why_not = a.why_not;
  return a.ok;
}

void amx_product(int M, int N, int K, const uint16_t* A, int lda, const uint16_t* Bv, float* C, int ldc,
                 const TileProduct& how) {
  PIPER_CHECK(M % 16 == 0 && N % 16 == 0 && K % 32 == 0 && K > 0 && how.row0 % 16 == 0 && (!how.ldb || how.ldb >= N),
              cat("amx_product: ", M, "x", N, "x", K, " is not in whole tiles"));
  PIPER_CHECK(amx_tiles_available(), "amx_product: no AMX tiles here");
#if PIPER_AMX_BUILD
  tile_product(M, N, K, A, lda, Bv, C, ldc, how);
#endif
}

// The layouts with AVX-512 where the shapes allow and the processor has tiles (every one with AMX has AVX-512), else
// element by element.
#if PIPER_AMX_BUILD
namespace {

// Rows r0 and r1 (n < N, N a multiple of 32) interleaved into out (2N): 32 columns a step.
[[gnu::target("avx512f,avx512bw")]] void interleave_rows(uint16_t* out, const uint16_t* r0, const uint16_t* r1, int N) {
  alignas(64) static const uint16_t lo_index[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                                    8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i lo = _mm512_load_si512(lo_index);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int n = 0; n < N; n += 32) {
    const __m512i a = _mm512_loadu_si512(r0 + n), b = _mm512_loadu_si512(r1 + n);
    _mm512_storeu_si512(out + 2 * n, _mm512_permutex2var_epi16(a, lo, b));
    _mm512_storeu_si512(out + 2 * n + 32, _mm512_permutex2var_epi16(a, hi, b));
  }
}

// Bv as 32-bit pairs: Bv[kp][n] = b[n][kp] for 16 columns n a gather (ld32: b's leading dimension in pairs).
[[gnu::target("avx512f")]] void gather_pairs(uint32_t* Bv, const uint32_t* b, int ld32, int K2, int N) {
  const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(ld32));
  for (int kp = 0; kp < K2; ++kp)
    for (int n = 0; n < N; n += 16)
      _mm512_storeu_si512(Bv + int64_t(kp) * N + n, _mm512_i32gather_epi32(rows, b + int64_t(n) * ld32 + kp, 4));
}

// transpose_bits: two columns (one 32-bit pair) of 16 rows a gather.
[[gnu::target("avx512f,avx512bw")]] void transpose_bits_avx512(uint16_t* dst, const uint16_t* src, int lds, int rows,
                                                        int cols) {
  const __m512i at = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                        _mm512_set1_epi32(lds / 2));
  for (int c = 0; c < cols; c += 2)
    for (int r = 0; r < rows; r += 16) {
      const __m512i pairs = _mm512_i32gather_epi32(at, src + int64_t(r) * lds + c, 4);  // (src[r+i][c], [c+1])
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + int64_t(c) * rows + r), _mm512_cvtepi32_epi16(pairs));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + int64_t(c + 1) * rows + r),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(pairs, 16)));
    }
}

// store_transposed: 16 columns of a row a gather.
[[gnu::target("avx512f")]] void store_transposed_avx512(float* dst, int ldd, const float* src, int rows, int cols,
                                                 float scale) {
  const __m512i at = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                        _mm512_set1_epi32(rows));
  const __m512 s = _mm512_set1_ps(scale);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; c += 16)
      _mm512_storeu_ps(dst + int64_t(r) * ldd + c,
                       _mm512_mul_ps(s, _mm512_i32gather_ps(at, src + int64_t(c) * rows + r, 4)));
}

}  // namespace
#endif

void vnni_from_rows(uint16_t* Bv, const uint16_t* b, int ldb, int K, int N) {
  for (int kp = 0; kp < K / 2; ++kp) {
    const uint16_t* __restrict r0 = b + int64_t(2 * kp) * ldb;
    const uint16_t* __restrict r1 = r0 + ldb;
    uint16_t* __restrict out = Bv + int64_t(kp) * N * 2;
#if PIPER_AMX_BUILD
    if (N % 32 == 0 && amx_tiles_available()) {
      interleave_rows(out, r0, r1, N);
      continue;
    }
#endif
    for (int n = 0; n < N; ++n) out[2 * n] = r0[n], out[2 * n + 1] = r1[n];
  }
}

void vnni_from_transposed(uint16_t* Bv, const uint16_t* b, int ldb, int K, int N) {
#if PIPER_AMX_BUILD
  if (N % 16 == 0 && ldb % 2 == 0 && reinterpret_cast<uintptr_t>(b) % 4 == 0 && amx_tiles_available()) {
    gather_pairs(reinterpret_cast<uint32_t*>(Bv), reinterpret_cast<const uint32_t*>(b), ldb / 2, K / 2, N);
    return;
  }
#endif
  for (int n = 0; n < N; ++n) {
    const uint16_t* __restrict row = b + int64_t(n) * ldb;  // b's row n: B's column n
    for (int kp = 0; kp < K / 2; ++kp) {
      uint32_t pair;
      std::memcpy(&pair, row + 2 * kp, 4);
      std::memcpy(Bv + (int64_t(kp) * N + n) * 2, &pair, 4);
    }
  }
}

void transpose_bits(uint16_t* dst, const uint16_t* src, int lds, int rows, int cols) {
#if PIPER_AMX_BUILD
  if (rows % 16 == 0 && cols % 2 == 0 && lds % 2 == 0 && reinterpret_cast<uintptr_t>(src) % 4 == 0 &&
      amx_tiles_available()) {
    transpose_bits_avx512(dst, src, lds, rows, cols);
    return;
  }
#endif
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) dst[int64_t(c) * rows + r] = src[int64_t(r) * lds + c];
}

void store_transposed(float* dst, int ldd, const float* src, int rows, int cols, float scale) {
#if PIPER_AMX_BUILD
  if (cols % 16 == 0 && amx_tiles_available()) {
    store_transposed_avx512(dst, ldd, src, rows, cols, scale);
    return;
  }
#endif
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) dst[int64_t(r) * ldd + c] = scale * src[int64_t(c) * rows + r];
}

void round_rows(uint16_t* dst, int ldd, const float* src, int lds, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    const float* __restrict in = src + int64_t(r) * lds;
    uint16_t* __restrict out = dst + int64_t(r) * ldd;
    for (int c = 0; c < cols; ++c) out[c] = bf16_bits(in[c]);
  }
}

void store_scaled(float* dst, int ldd, const float* src, int lds, int rows, int cols, float scale) {
  for (int r = 0; r < rows; ++r) {
    const float* __restrict in = src + int64_t(r) * lds;
    float* __restrict out = dst + int64_t(r) * ldd;
    for (int c = 0; c < cols; ++c) out[c] = in[c] * scale;
  }
}

}  // namespace piper
