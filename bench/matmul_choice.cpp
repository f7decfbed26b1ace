// matmul_choice: times the matmuls of a training step (linear forward, backward input, backward weight) on
// each way of running them — piper's split of one OpenBLAS call per thread by rows, columns or K, OpenBLAS's
// own threads, BLIS, oneDNN, and bf16 inputs (fp32 accumulation and output) through oneDNN's bf16 gemm, its matmul
// primitive or OpenBLAS's sbgemm where the installed builds have them — interleaved, so the backend's choice rests
// on this machine's numbers.
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <cblas.h>

#include "backend/cpu/cpu_kernels.hpp"
#include "backend/cpu/onednn_matmul.hpp"

extern "C" void openblas_set_num_threads(int);

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A row-major C(M,N) = op(A)(M,K) · op(B)(K,N) + beta·C, as the linear kernels call it.
struct Gemm {
  std::string name;
  bool ta, tb;
  int M, N, K;
  int lda, ldb, ldc;
};

// The three matmuls of a linear layer x(N,C) -> y(N,OC) with weight w(OC,C).
std::vector<Gemm> linear_gemms(int N, int C, int OC) {
  auto tag = [&](const char* kind) {
    char b[96];
    std::snprintf(b, sizeof b, "%-8s N=%-5d C=%-5d OC=%-5d", kind, N, C, OC);
    return std::string(b);
  };
  return {{tag("forward"), false, true, N, OC, C, C, C, OC},          // y = x · w^T
          {tag("bwd_in"), false, false, N, C, OC, OC, C, C},          // dx = dy · w
          {tag("bwd_w"), true, false, OC, C, N, OC, C, C}};           // dw = dy^T · x
}

// BLIS's typed API, loaded at run time so that its CBLAS symbols never meet OpenBLAS's.
struct Blis {
  using sgemm_t = void (*)(int, int, int64_t, int64_t, int64_t, const float*, const float*, int64_t, int64_t,
                           const float*, int64_t, int64_t, const float*, float*, int64_t, int64_t);
  sgemm_t sgemm = nullptr;
  void (*set_threads)(int64_t) = nullptr;
  bool load() {
    void* h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!h) return false;
    sgemm = reinterpret_cast<sgemm_t>(dlsym(h, "bli_sgemm"));
    set_threads = reinterpret_cast<void (*)(int64_t)>(dlsym(h, "bli_thread_set_num_threads"));
    return sgemm && set_threads;
  }
  // Row-major operands: row stride ld, column stride 1; BLIS_TRANSPOSE is 0x08.
  void run(const Gemm& g, const float* A, const float* B, float beta, float* C) const {
    float one = 1.f;
    sgemm(g.ta ? 8 : 0, g.tb ? 8 : 0, g.M, g.N, g.K, &one, A, g.lda, 1, B, g.ldb, 1, &beta, C, g.ldc, 1);
  }
};

// oneDNN's row-major sgemm and bf16 gemm (bf16 inputs, fp32 output), also loaded at run time (optional package).
struct OneDnn {
  using sgemm_t = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t);
  using bf16gemm_t = int (*)(char, char, int64_t, int64_t, int64_t, float, const uint16_t*, int64_t, const uint16_t*,
                             int64_t, float, float*, int64_t);
  sgemm_t sgemm = nullptr;
  bf16gemm_t bf16gemm = nullptr;
  bool load() {
    void* h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) return false;
    sgemm = reinterpret_cast<sgemm_t>(dlsym(h, "dnnl_sgemm"));
    bf16gemm = reinterpret_cast<bf16gemm_t>(dlsym(h, "dnnl_gemm_bf16bf16f32"));
    return sgemm != nullptr;
  }
  void run(const Gemm& g, const float* A, const float* B, float beta, float* C) const {
    sgemm(g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', g.M, g.N, g.K, 1.f, A, g.lda, B, g.ldb, beta, C, g.ldc);
  }
  void run_bf16(const Gemm& g, const uint16_t* A, const uint16_t* B, float* C) const {
    bf16gemm(g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', g.M, g.N, g.K, 1.f, A, g.lda, B, g.ldb, 0.f, C, g.ldc);
  }
};

// OpenBLAS's cblas_sbgemm, where the loaded OpenBLAS was built with bfloat16 (Debian 12's is not).
using sbgemm_t = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, float,
                          const uint16_t*, blasint, const uint16_t*, blasint, float, float*, blasint);

void cblas(const Gemm& g, int M, int N, int K, const float* A, const float* B, float beta, float* C) {
  cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, M, N, K, 1.f, A,
              g.lda, B, g.ldb, beta, C, g.ldc);
}

// Each thread one block of C's rows (op(A)'s rows), one single-threaded OpenBLAS call each.
void split_rows(const Gemm& g, const float* A, const float* B, float* C, int T) {
#pragma omp parallel for num_threads(T) schedule(static)
  for (int t = 0; t < T; ++t) {
    int r0 = int(int64_t(g.M) * t / T), r1 = int(int64_t(g.M) * (t + 1) / T);
    cblas(g, r1 - r0, g.N, g.K, g.ta ? A + r0 : A + int64_t(r0) * g.lda, B, 0.f, C + int64_t(r0) * g.ldc);
  }
}

void split_cols(const Gemm& g, const float* A, const float* B, float* C, int T) {
#pragma omp parallel for num_threads(T) schedule(static)
  for (int t = 0; t < T; ++t) {
    int c0 = int(int64_t(g.N) * t / T), c1 = int(int64_t(g.N) * (t + 1) / T);
    cblas(g, g.M, c1 - c0, g.K, A, g.tb ? B + int64_t(c0) * g.ldb : B + c0, 0.f, C + c0);
  }
}

// Each thread a slice of K into its own partial C(M,N); then the partials are added, split by rows.
void split_k(const Gemm& g, const float* A, const float* B, float* C, std::vector<float>& partial, int T) {
  size_t mn = size_t(g.M) * g.N;
  partial.resize(mn * (T - 1));
#pragma omp parallel num_threads(T)
  {
    int t = omp_get_thread_num();
    int k0 = int(int64_t(g.K) * t / T), k1 = int(int64_t(g.K) * (t + 1) / T);
    const float* a = g.ta ? A + int64_t(k0) * g.lda : A + k0;
    const float* b = g.tb ? B + k0 : B + int64_t(k0) * g.ldb;
    float* c = t == 0 ? C : partial.data() + mn * (t - 1);
    Gemm p = g;
    p.ldc = t == 0 ? g.ldc : g.N;
    cblas(p, g.M, g.N, k1 - k0, a, b, 0.f, c);
#pragma omp barrier
    size_t r0 = size_t(g.M) * t / T, r1 = size_t(g.M) * (t + 1) / T;
    for (int s = 1; s < T; ++s)
      for (size_t r = r0; r < r1; ++r) {
        float* __restrict dst = C + r * g.ldc;
        const float* __restrict src = partial.data() + mn * (s - 1) + r * g.N;
        for (int j = 0; j < g.N; ++j) dst[j] += src[j];
      }
  }
}

// bf16 (the top half of an fp32, rounded to nearest even), as oneDNN and OpenBLAS take it.
uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

// The CPU's bf16 matmul instructions, from /proc/cpuinfo's flags ("none" when it has neither).
std::string bf16_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, out;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    for (std::string w; words >> w;)
      if (w == "avx512_bf16" || w == "amx_bf16" || w == "amx_tile") out += (out.empty() ? "" : " ") + w;
    break;
  }
  return out.empty() ? "none" : out;
}

struct Way {
  std::string name;
  std::function<void(const Gemm&, const float*, const float*, float*)> run;
};

}  // namespace

int main(int argc, char** argv) {
  int threads = omp_get_num_procs(), reps = 15, tokens = 2048;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "matmul_choice: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--threads") threads = std::atoi(next());
    else if (a == "--reps") reps = std::atoi(next());
    else if (a == "--tokens") tokens = std::atoi(next());
    else {
      std::fprintf(stderr,
                   "usage: matmul_choice [--threads T] [--reps R] [--tokens N]\n"
                   "  times the quickstart's linear-layer matmuls (N tokens; C, OC in {256, 768, 1024})\n");
      return 2;
    }
  }
  if (threads < 1 || reps < 1 || tokens < 1) {
    std::fprintf(stderr, "matmul_choice: --threads, --reps and --tokens must be positive\n");
    return 2;
  }
  std::vector<Gemm> gemms;
  for (auto [c, oc] : {std::pair{256, 768}, {256, 256}, {256, 1024}, {1024, 256}})
    for (auto& g : linear_gemms(tokens, c, oc)) gemms.push_back(g);
  gemms.push_back({"square   2048^3                    ", false, false, 2048, 2048, 2048, 2048, 2048, 2048});

  Blis blis;
  OneDnn dnnl;
  bool have_blis = blis.load(), have_dnnl = dnnl.load();
  std::vector<float> partial;
  std::vector<Way> ways = {
      {"piper", [&](const Gemm& g, const float* A, const float* B, float* C) {
         piper::sgemm_parallel(g.ta, g.tb, g.M, g.N, g.K, 1.f, A, g.lda, B, g.ldb, 0.f, C, g.ldc, threads);
       }},
      {"rows", [&](const Gemm& g, const float* A, const float* B, float* C) { split_rows(g, A, B, C, threads); }},
      {"cols", [&](const Gemm& g, const float* A, const float* B, float* C) { split_cols(g, A, B, C, threads); }},
      {"splitK", [&](const Gemm& g, const float* A, const float* B, float* C) { split_k(g, A, B, C, partial, threads); }},
      {"openblas-thr", [&](const Gemm& g, const float* A, const float* B, float* C) {
         openblas_set_num_threads(threads);
         cblas(g, g.M, g.N, g.K, A, B, 0.f, C);
         openblas_set_num_threads(1);
       }},
  };
  if (have_blis)
    ways.push_back({"blis", [&](const Gemm& g, const float* A, const float* B, float* C) {
                      blis.set_threads(threads);
                      blis.run(g, A, B, 0.f, C);
                    }});
  if (have_dnnl)
    ways.push_back({"onednn", [&](const Gemm& g, const float* A, const float* B, float* C) {
                      omp_set_num_threads(threads);
                      dnnl.run(g, A, B, 0.f, C);
                    }});
  openblas_set_num_threads(1);
  if (threads == 1) ways.erase(ways.begin() + 1, ways.begin() + 5);  // one thread: the splits are all one call

  size_t most = 0;
  for (auto& g : gemms) most = std::max({most, size_t(g.M) * g.K, size_t(g.K) * g.N, size_t(g.M) * g.N});
  std::vector<float> A(most), B(most), C(most);
  for (size_t i = 0; i < most; ++i) A[i] = float((i * 7919) % 1000) * 1e-3f - 0.5f, B[i] = float((i * 104729) % 997) * 1e-3f - 0.5f;
  // the same operands in bf16, made once (a bf16 run keeps its weights and activations so)
  std::vector<uint16_t> Ab(most), Bb(most);
  for (size_t i = 0; i < most; ++i) Ab[i] = to_bf16(A[i]), Bb[i] = to_bf16(B[i]);
  if (have_dnnl && dnnl.bf16gemm)
    ways.push_back({"bf16-onednn", [&](const Gemm& g, const float*, const float*, float* C) {
                      omp_set_num_threads(threads);
                      dnnl.run_bf16(g, Ab.data(), Bb.data(), C);
                    }});
  if (piper::onednn_matmul_available())  // oneDNN's matmul primitive, as piper's bf16 linear layers call it
    ways.push_back({"bf16-onednn-matmul", [&](const Gemm& g, const float*, const float*, float* C) {
                      piper::onednn_matmul(g.ta, g.tb, g.M, g.N, g.K, Ab.data(), g.lda, Bb.data(), g.ldb, 0.f, C, g.ldc,
                                    threads);
                    }});
  const auto sbgemm = reinterpret_cast<sbgemm_t>(dlsym(RTLD_DEFAULT, "cblas_sbgemm"));
  if (sbgemm)
    ways.push_back({"bf16-openblas", [&](const Gemm& g, const float*, const float*, float* C) {
                      openblas_set_num_threads(threads);
                      sbgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, g.M,
                             g.N, g.K, 1.f, Ab.data(), g.lda, Bb.data(), g.ldb, 0.f, C, g.ldc);
                      openblas_set_num_threads(1);
                    }});

  std::printf("matmul_choice: threads=%d tokens=%d reps=%d (median GFLOP/s of interleaved calls)%s%s%s%s; CPU bf16 "
              "instructions: %s\n",
              threads, tokens, reps, have_blis ? "" : " [BLIS not found]", have_dnnl ? "" : " [oneDNN not found]",
              have_dnnl && !dnnl.bf16gemm ? " [oneDNN without bf16 gemm]" : "",
              sbgemm ? "" : " [OpenBLAS built without bf16]", bf16_flags().c_str());
  std::printf("%-36s", "matmul");
  for (auto& w : ways) std::printf(" %12s", w.name.c_str());
  std::printf("\n");
  for (auto& g : gemms) {
    std::vector<std::vector<double>> secs(ways.size());
    for (int r = 0; r < reps + 2; ++r)
      for (size_t w = 0; w < ways.size(); ++w) {
        double t0 = now_seconds();
        ways[w].run(g, A.data(), B.data(), C.data());
        double dt = now_seconds() - t0;
        if (r >= 2) secs[w].push_back(dt);  // the first two warm packing buffers and thread pools
      }
    std::printf("%-36s", g.name.c_str());
    for (auto& s : secs) {
      std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
      std::printf(" %12.1f", 2.0 * g.M * g.N * g.K / s[s.size() / 2] / 1e9);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}
