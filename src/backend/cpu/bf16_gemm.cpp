// bf16 matmuls on the CPU (see bf16_gemm.hpp): the path chosen once per process, the operands converted into
// per-thread scratch that grows once and is reused, then one library call.
#include "backend/cpu/bf16_gemm.hpp"

#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "backend/cpu/cpu_flags.hpp"
#include "backend/cpu/cpu_kernels.hpp"
#include "backend/cpu/cpu_parallel.hpp"
#include "backend/cpu/onednn_matmul.hpp"
#include "util/error.hpp"
#include "util/precision.hpp"

namespace piper {

namespace {

// oneDNN's row-major C = alpha · op(A) · op(B) + beta · C with bf16 A and B, fp32 C (dnnl_gemm_bf16bf16f32).
using OneDnnBf16Gemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const uint16_t*, int64_t,
                               const uint16_t*, int64_t, float, float*, int64_t);

// The processor's bf16 matmul instructions among /proc/cpuinfo's flags, space-separated ("" when none).
std::string cpu_bf16_flags() {
  std::string out;
  for (const char* w : {"avx512_bf16", "amx_bf16"})
    if (cpu_flags().count(w)) out += (out.empty() ? "" : " ") + std::string(w);
  return out;
}

struct Bf16Choice {
  Bf16GemmPath path = Bf16GemmPath::Rounded;
  OneDnnBf16Gemm onednn = nullptr;
  bool matmul = false;  // oneDNN's matmul primitive can be called
  std::string description;
};

// Whether oneDNN's bf16 gemm runs on this processor: 1 · 1 = 1 (without AVX-512 it reports unimplemented).
bool onednn_runs_bf16(OneDnnBf16Gemm gemm) {
  const uint16_t one = 0x3f80;  // 1.0 in bf16
  float c = 0.f;
  return gemm('N', 'N', 1, 1, 1, 1.f, &one, 1, &one, 1, 0.f, &c, 1) == 0 && c == 1.f;
}

const Bf16Choice& choice() {
  static const Bf16Choice c = [] {
    Bf16Choice r;
    if (void* h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL))
      r.onednn = reinterpret_cast<OneDnnBf16Gemm>(dlsym(h, "dnnl_gemm_bf16bf16f32"));
    const bool loaded = r.onednn != nullptr;  // whether or not its bf16 gemm runs here
    if (r.onednn && !onednn_runs_bf16(r.onednn)) r.onednn = nullptr;
    const std::string flags = cpu_bf16_flags();
    const char* env = std::getenv("PIPER_BF16_GEMM");
    const std::string asked = env ? env : "";
    if (!asked.empty() && asked != "onednn" && asked != "onednn-gemm" && asked != "rounded")
      throw UserError(cat("PIPER_BF16_GEMM = \"", asked, "\": expected \"onednn\", \"onednn-gemm\" or \"rounded\" (or "
                          "unset: by the processor)"));
    const bool asked_onednn = asked == "onednn" || asked == "onednn-gemm";
    if (asked_onednn && !r.onednn)
      throw UserError(cat("PIPER_BF16_GEMM = \"", asked, "\" but ",
                          loaded ? "oneDNN's bf16 gemm does not run on this processor (it needs AVX-512)"
                                 : "libdnnl.so.2 (Debian's libdnnl2) does not load here"));
    std::string no_matmul;
    r.matmul = r.onednn && onednn_matmul_available(&no_matmul);
    const bool use = asked_onednn || (asked.empty() && r.onednn && !flags.empty());
    r.path = !use ? Bf16GemmPath::Rounded
             : r.matmul && asked != "onednn-gemm" ? Bf16GemmPath::OneDnnMatmul
                                                  : Bf16GemmPath::OneDnn;
    const std::string cpu = flags.empty() ? "no bf16 instructions" : flags;
    if (r.path == Bf16GemmPath::OneDnnMatmul)
      r.description = cat("oneDNN bf16 matmul (processor: ", cpu, ")");
    else if (use)
      r.description = cat("oneDNN bf16 gemm (processor: ", cpu, asked.empty() ? cat("; ", no_matmul) : "; PIPER_BF16_GEMM",
                          ")");
    else
      r.description = cat("OpenBLAS sgemm of bf16-rounded operands (processor: ", cpu,
                          r.onednn ? "" : loaded ? "; oneDNN's bf16 gemm does not run here" : "; oneDNN not found",
                          asked.empty() ? "" : "; PIPER_BF16_GEMM", ")");
    return r;
  }();
  return c;
}

// dst(rows, cols) packed = src(rows, cols) with leading dimension ld, each element through `convert`.
template <typename T, typename Src, typename Convert>
const T* packed_copy(std::vector<T>& dst, const Src* src, int rows, int cols, int ld, int threads, Convert convert) {
  const size_t n = size_t(rows) * size_t(cols);
  if (dst.size() < n) dst.resize(n);
  T* out = dst.data();
  cpu::for_range(n, threads, [&](size_t b, size_t e) {
    for (size_t i = b; i < e;) {  // row by row within [b, e)
      const size_t r = i / size_t(cols), c0 = i % size_t(cols);
      const size_t c1 = std::min(size_t(cols), c0 + (e - i));
      const Src* __restrict s = src + r * size_t(ld);
      T* __restrict d = out + r * size_t(cols);
      for (size_t c = c0; c < c1; ++c) d[c] = convert(s[c]);
      i += c1 - c0;
    }
  });
  return out;
}

// An operand (rows, cols) as oneDNN takes it, bf16 bits: its own bits as they are, or its values rounded into
// `scratch` (packed). ld: the leading dimension of what is returned.
const uint16_t* as_bits(const Bf16Input& in, int rows, int cols, std::vector<uint16_t>& scratch, int threads,
                        int& ld) {
  if (in.bits) return ld = in.ld, in.bits;
  ld = cols;
  return packed_copy(scratch, in.values, rows, cols, in.ld, threads, [](float x) { return bf16_bits(x); });
}

// The same as sgemm takes it, fp32 values that are bf16: values already rounded as they are, else rounded (or the
// bits widened) into `scratch`.
const float* as_rounded(const Bf16Input& in, int rows, int cols, std::vector<float>& scratch, int threads, int& ld) {
  if (in.values && in.rounded) return ld = in.ld, in.values;
  ld = cols;
  if (in.bits)
    return packed_copy(scratch, in.bits, rows, cols, in.ld, threads, [](uint16_t b) { return bf16_value(b); });
  return packed_copy(scratch, in.values, rows, cols, in.ld, threads, [](float x) { return round_bf16(x); });
}

// op(A) (M,K) and op(B) (K,N) as oneDNN takes them: bf16 bits with their leading dimensions, their own or rounded
// into this thread's scratch (grown once, shared by every oneDNN product of the thread).
struct OneDnnOperands {
  const uint16_t *a, *b;
  int lda, ldb;
};
OneDnnOperands onednn_operands(bool trans_a, bool trans_b, int M, int N, int K, const Bf16Input& A,
                               const Bf16Input& B, int threads) {
  static thread_local std::vector<uint16_t> a16, b16;
  OneDnnOperands o{};
  // op(A) is M×K: stored (M,K), or (K,M) transposed; op(B) is K×N: stored (K,N), or (N,K) transposed.
  o.a = as_bits(A, trans_a ? K : M, trans_a ? M : K, a16, threads, o.lda);
  o.b = as_bits(B, trans_b ? N : K, trans_b ? K : N, b16, threads, o.ldb);
  return o;
}

// oneDNN's gemm of packed bf16 operands on the rank's threads.
void onednn_gemm(const Bf16Choice& c, bool trans_a, bool trans_b, int M, int N, int K, const uint16_t* a, int lda,
                 const uint16_t* b, int ldb, float beta, float* C, int ldc, int threads) {
  omp_set_num_threads(threads);  // oneDNN's OpenMP regions on this thread use the rank's threads
  const int status =
      c.onednn(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, 1.f, a, lda, b, ldb, beta, C, ldc);
  if (status != 0) throw SystemError(cat("oneDNN bf16 gemm (", M, "x", N, "x", K, ") failed with status ", status));
}

}  // namespace

Bf16GemmPath bf16_gemm_path() { return choice().path; }

Bf16GemmPath bf16_gemm_path_on_one_thread() {
  const Bf16GemmPath p = choice().path;
  return p == Bf16GemmPath::OneDnnMatmul ? Bf16GemmPath::OneDnn : p;
}

std::string bf16_gemm_description() { return choice().description; }

bool bf16_onednn_loaded() { return choice().onednn != nullptr; }

bool bf16_onednn_matmul_loaded() { return choice().matmul; }

void bf16_gemm_parallel(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                        int ldb, float beta, float* C, int ldc, int threads) {
  bf16_gemm_parallel(trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc, threads, choice().path);
}

void bf16_gemm_parallel(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                        int ldb, float beta, float* C, int ldc, int threads, Bf16GemmPath path) {
  bf16_gemm(trans_a, trans_b, M, N, K, Bf16Input{A, nullptr, lda}, Bf16Input{B, nullptr, ldb}, beta, C, ldc, threads,
            path);
}

void bf16_gemm(bool trans_a, bool trans_b, int M, int N, int K, const Bf16Input& A, const Bf16Input& B, float beta,
               float* C, int ldc, int threads, Bf16GemmPath path, const float* bias) {
  if (M <= 0 || N <= 0) return;
  PIPER_CHECK(!bias || bf16_adds_bias(path), "bf16 gemm: a bias on a path that does not add one");
  if (path == Bf16GemmPath::OneDnn || path == Bf16GemmPath::OneDnnMatmul) {
    const Bf16Choice& c = choice();
    if (!c.onednn) throw SystemError("bf16 gemm: oneDNN asked for but libdnnl.so.2 did not load");
    const OneDnnOperands o = onednn_operands(trans_a, trans_b, M, N, K, A, B, threads);
    if (path == Bf16GemmPath::OneDnnMatmul)
      onednn_matmul(trans_a, trans_b, M, N, K, o.a, o.lda, o.b, o.ldb, beta, C, ldc, threads, bias);
    else
      onednn_gemm(c, trans_a, trans_b, M, N, K, o.a, o.lda, o.b, o.ldb, beta, C, ldc, threads);
    return;
  }
  // op(A) is M×K: stored (M,K), or (K,M) transposed; op(B) is K×N: stored (K,N), or (N,K) transposed.
  const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  int lda = 0, ldb = 0;
  static thread_local std::vector<float> a32, b32;
  const float* a = as_rounded(A, a_rows, a_cols, a32, threads, lda);
  const float* b = as_rounded(B, b_rows, b_cols, b32, threads, ldb);
  sgemm_parallel(trans_a, trans_b, M, N, K, 1.f, a, lda, b, ldb, beta, C, ldc, threads);
}

void bf16_gemm_to_bf16(bool trans_a, bool trans_b, int M, int N, int K, const Bf16Input& A, const Bf16Input& B,
                       uint16_t* C, int ldc, int threads, const float* bias) {
  if (M <= 0 || N <= 0) return;
  PIPER_CHECK(choice().matmul, "bf16 gemm: a bf16 output without oneDNN's matmul primitive");
  const OneDnnOperands o = onednn_operands(trans_a, trans_b, M, N, K, A, B, threads);
  onednn_matmul_to_bf16(trans_a, trans_b, M, N, K, o.a, o.lda, o.b, o.ldb, C, ldc, threads, bias);
}

void bf16_prepare(Bf16Operand& out, const float* src, int rows, int cols, int ld, int threads) {
  out.source = src, out.rows = rows, out.cols = cols, out.ld = ld;
  if (choice().path != Bf16GemmPath::Rounded)
    packed_copy(out.bits, src, rows, cols, ld, threads, [](float x) { return bf16_bits(x); });
  else
    packed_copy(out.rounded, src, rows, cols, ld, threads, [](float x) { return round_bf16(x); });
}

void bf16_gemm_parallel(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
                        const Bf16Operand& B, float beta, float* C, int ldc, int threads) {
  bf16_gemm(trans_a, trans_b, M, N, K, Bf16Input{A, nullptr, lda}, B.input(), beta, C, ldc, threads, choice().path);
}

}  // namespace piper
