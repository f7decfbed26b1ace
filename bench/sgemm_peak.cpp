// sgemm_peak: measures this machine's fp32 matmul FLOP/s the way piper runs matmuls (OpenBLAS
// cblas_sgemm single-threaded per call, the output split across OpenMP threads by piper::sgemm_parallel).
// Prints one machine-readable line: RESULT sgemm threads=T m=M n=N k=K gflops=G ...
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_kernels.hpp"

extern "C" void openblas_set_num_threads(int);

namespace {

void usage() {
  std::fprintf(stderr,
               "usage: sgemm_peak [--threads T] [--size N | --shape M,N,K] [--reps R] [--warmup W] [--trans-b]\n"
               "  --threads T   OpenMP threads that split each matmul (default: all cores)\n"
               "  --size N      square M = N = K (default 2048)\n"
               "  --shape M,N,K a rectangular C(M,N) = A(M,K) B(K,N)\n"
               "  --reps R      timed repetitions; the best is reported (default 10)\n"
               "  --warmup W    untimed repetitions first (default 2)\n"
               "  --trans-b     multiply by B transposed (as piper's linear forward does)\n");
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  int threads = omp_get_num_procs();
  int M = 2048, N = 2048, K = 2048, reps = 10, warmup = 2;
  bool trans_b = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        usage();
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--threads") threads = std::atoi(next());
    else if (a == "--size") M = N = K = std::atoi(next());
    else if (a == "--shape") {
      if (std::sscanf(next(), "%d,%d,%d", &M, &N, &K) != 3) { usage(); return 2; }
    } else if (a == "--reps") reps = std::atoi(next());
    else if (a == "--warmup") warmup = std::atoi(next());
    else if (a == "--trans-b") trans_b = true;
    else if (a == "-h" || a == "--help") { usage(); return 0; }
    else { usage(); return 2; }
  }
  if (threads < 1 || M < 1 || N < 1 || K < 1 || reps < 1 || warmup < 0) { usage(); return 2; }

  // piper keeps OpenBLAS itself single-threaded and parallelizes around it.
  openblas_set_num_threads(1);

  std::vector<float> A(size_t(M) * K), B(size_t(K) * N), C(size_t(M) * N, 0.f);
  // Deterministic, well-scaled inputs (denormals or NaNs would distort the timing).
  uint32_t s = 12345;
  auto rnd = [&] { s = s * 1664525u + 1013904223u; return float(s >> 8) / float(1u << 24) - 0.5f; };
  for (auto& x : A) x = rnd();
  for (auto& x : B) x = rnd();
  const int lda = K, ldb = trans_b ? K : N, ldc = N;

  const double flops = 2.0 * M * N * K;
  std::vector<double> times;
  for (int r = 0; r < warmup + reps; ++r) {
    double t0 = now_seconds();
    piper::sgemm_parallel(false, trans_b, M, N, K, 1.f, A.data(), lda, B.data(), ldb, 0.f, C.data(), ldc, threads);
    double dt = now_seconds() - t0;
    if (r >= warmup) times.push_back(dt);
  }
  std::sort(times.begin(), times.end());
  const double best = times.front(), median = times[times.size() / 2];
  double checksum = 0;
  for (size_t i = 0; i < C.size(); i += 4099) checksum += C[i];
  std::printf("sgemm %dx%dx%d%s, %d thread%s: best %.2f ms = %.1f GFLOP/s, median %.2f ms = %.1f GFLOP/s\n", M, N, K,
              trans_b ? " (B^T)" : "", threads, threads == 1 ? "" : "s", best * 1e3, flops / best / 1e9, median * 1e3,
              flops / median / 1e9);
  std::printf("RESULT sgemm threads=%d m=%d n=%d k=%d gflops=%.3f median_gflops=%.3f checksum=%.6g\n", threads, M, N,
              K, flops / best / 1e9, flops / median / 1e9, checksum);
  return 0;
}
