// fma_peak: this processor's instruction-rate ceiling for fp32 and bf16 matmuls: 512-bit fp32 FMA
// (vfmadd) against the AVX512-BF16 dot product (vdpbf16ps) and AMX's bf16 tile product (tdpbf16ps), on T threads,
// every register (or tile) busy, no memory. Prints: RESULT fma_peak threads=T fp32_gflops=F bf16_gflops=B ratio=R
// amx_gflops=A amx_ratio=X ("none" without the instruction, or where Linux refuses AMX's tile state).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

volatile float g_sink;  // keeps the sums alive

// Seconds for `threads` threads each running body(iterations).
template <typename Body>
double seconds(Body body, long iterations, int threads) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back([&] { body(iterations); });
  for (auto& t : pool) t.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

#if defined(__x86_64__)
// Twelve independent accumulators (more than latency × ports), pinned to registers by the empty asm.
#define PIPER_EACH12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define PIPER_DECLARE(i) __m512 a##i = _mm512_set1_ps(float(i));
#define PIPER_PIN                                                                                           \
  __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7), \
                   "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
#define PIPER_ADD(i) s = _mm512_add_ps(s, a##i);

__attribute__((target("avx512f"))) float lane_sum(__m512 s) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  float sum = 0;
  for (float x : lanes) sum += x;
  return sum;
}

// 12 × 16 lanes × 2 FLOP an iteration.
__attribute__((target("avx512f"))) void fp32_fma(long n) {
  const __m512 x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.9999f);
  PIPER_EACH12(PIPER_DECLARE)
  for (long k = 0; k < n; ++k) {
#define PIPER_FMA(i) a##i = _mm512_fmadd_ps(x, y, a##i);
    PIPER_EACH12(PIPER_FMA)
    PIPER_PIN
  }
  __m512 s = _mm512_setzero_ps();
  PIPER_EACH12(PIPER_ADD)
  g_sink = lane_sum(s);
}

// 12 × 16 lanes × 2 products × 2 FLOP an iteration.
__attribute__((target("avx512f,avx512bf16"))) void bf16_dot(long n) {
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3f80);  // 1.0
  PIPER_EACH12(PIPER_DECLARE)
  for (long k = 0; k < n; ++k) {
#define PIPER_DOT(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
    PIPER_EACH12(PIPER_DOT)
    PIPER_PIN
  }
  __m512 s = _mm512_setzero_ps();
  PIPER_EACH12(PIPER_ADD)
  g_sink = lane_sum(s);
}

// AMX: 64-byte tile configuration (palette 1), every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Linux hands a process AMX's tile data state only on request (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA).
bool amx_permitted() {
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

// Four independent fp32 accumulator tiles C(16,16) += A(16,32) · B(32,16) in bf16: 4 × 16·16·32 × 2 FLOP an
// iteration.
__attribute__((target("amx-tile,amx-bf16"))) void amx_dot(long n) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  alignas(64) uint16_t ab[16 * 32];
  alignas(64) float c[16 * 16] = {};
  for (uint16_t& x : ab) x = 0x3a83;  // 1e-3
  _tile_loadconfig(&cfg);
  _tile_loadd(0, c, 64);
  _tile_loadd(1, c, 64);
  _tile_loadd(2, c, 64);
  _tile_loadd(3, c, 64);
  _tile_loadd(4, ab, 64);
  _tile_loadd(5, ab, 64);
  _tile_loadd(6, ab, 64);
  _tile_loadd(7, ab, 64);
  for (long k = 0; k < n; ++k) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  _tile_release();
  g_sink = c[0];
}
#endif

void usage() {
  std::fprintf(stderr,
               "usage: fma_peak [--threads T] [--iterations N] [--reps R]\n"
               "  --threads T     threads, each on its own loop (default: all cores)\n"
               "  --iterations N  loop iterations per thread (default 50000000)\n"
               "  --reps R        timed repetitions of each; the best is reported (default 3)\n");
}

}  // namespace

int main(int argc, char** argv) {
  int threads = int(std::thread::hardware_concurrency());
  long iterations = 50000000;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--threads" && has_value) threads = std::atoi(argv[++i]);
    else if (a == "--iterations" && has_value) iterations = std::atol(argv[++i]);
    else if (a == "--reps" && has_value) reps = std::atoi(argv[++i]);
    else {
      usage();
      return a == "--help" ? 0 : 2;
    }
  }
  if (threads < 1 || iterations < 1 || reps < 1) {
    usage();
    return 2;
  }
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f")) {
    std::printf("RESULT fma_peak threads=%d fp32_gflops=none bf16_gflops=none ratio=none amx_gflops=none "
                "amx_ratio=none (no AVX-512)\n",
                threads);
    return 0;
  }
  const bool bf16 = __builtin_cpu_supports("avx512bf16");
  double fp32_best = 0, bf16_best = 0;
  for (int r = 0; r < reps; ++r) {  // interleaved, best of reps
    fp32_best = std::max(fp32_best, 12.0 * 32 * double(iterations) * threads / seconds(fp32_fma, iterations, threads));
    if (bf16)
      bf16_best =
          std::max(bf16_best, 12.0 * 64 * double(iterations) * threads / seconds(bf16_dot, iterations, threads));
  }
  const bool amx = __builtin_cpu_supports("amx-bf16") && amx_permitted();
  double amx_best = 0;
  for (int r = 0; amx && r < reps; ++r) {
    const long n = std::max(1L, iterations / 8);  // a tile product does 32× the work of a vector one
    amx_best = std::max(amx_best, 65536.0 * double(n) * threads / seconds(amx_dot, n, threads));
  }
  char bf16_text[64] = "bf16_gflops=none ratio=none", amx_text[64] = "amx_gflops=none amx_ratio=none";
  if (bf16)
    std::snprintf(bf16_text, sizeof bf16_text, "bf16_gflops=%.1f ratio=%.2f", bf16_best / 1e9, bf16_best / fp32_best);
  if (amx)
    std::snprintf(amx_text, sizeof amx_text, "amx_gflops=%.1f amx_ratio=%.2f", amx_best / 1e9, amx_best / fp32_best);
  std::printf("RESULT fma_peak threads=%d fp32_gflops=%.1f %s %s\n", threads, fp32_best / 1e9, bf16_text, amx_text);
#else
  std::printf("RESULT fma_peak threads=%d fp32_gflops=none bf16_gflops=none ratio=none amx_gflops=none "
              "amx_ratio=none (not x86-64)\n",
              threads);
#endif
  return 0;
}
