// CPU compute primitives. Matmuls go to OpenBLAS cblas_sgemm (single-threaded per call, blocks of the
// output split across OpenMP threads); elementwise work is fused and written to vectorize (vec_math.hpp).
#include "backend/cpu/cpu_kernels.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/act_store.hpp"
#include "backend/cpu/gqa_attention_tiles.hpp"
#include "backend/cpu/bf16_gemm.hpp"
#include "backend/cpu/cpu_parallel.hpp"
#include "backend/cpu/vec_math.hpp"
#include "util/error.hpp"
#include "util/precision.hpp"

extern "C" void openblas_set_num_threads(int);

namespace piper {

namespace {

using cpu::for_chunks;
using cpu::for_range;

constexpr size_t kReduceChunks = 64;

}  // namespace

GemmSplit choose_gemm_split(int M, int N, int K, int threads) {
  // Measured with bench/matmul_choice (bench/README.md "matmul"): when K is long and C small (a weight
  // gradient, K = tokens), splitting K lets each thread pack only its half of both operands; otherwise the
  // longer side of C is split, so that the operand every thread packs in full is the smaller one.
  if (threads > 1 && int64_t(K) >= 4 * int64_t(std::max(M, N))) return GemmSplit::K;
  return M >= N ? GemmSplit::Rows : GemmSplit::Cols;
}

void sgemm_parallel(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                    const float* B, int ldb, float beta, float* C, int ldc, int threads) {
  auto ta = trans_a ? CblasTrans : CblasNoTrans;
  auto tb = trans_b ? CblasTrans : CblasNoTrans;
  double flops = 2.0 * M * N * K;
  if (threads <= 1 || flops < 4e6) {
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  switch (choose_gemm_split(M, N, K, threads)) {
    case GemmSplit::Rows:  // split rows of C: op(A) rows
#pragma omp parallel for num_threads(threads) schedule(static)
      for (int t = 0; t < threads; ++t) {
        int r0 = int(int64_t(M) * t / threads), r1 = int(int64_t(M) * (t + 1) / threads);
        if (r1 <= r0) continue;
        const float* a = trans_a ? A + r0 : A + int64_t(r0) * lda;
        cblas_sgemm(CblasRowMajor, ta, tb, r1 - r0, N, K, alpha, a, lda, B, ldb, beta, C + int64_t(r0) * ldc, ldc);
      }
      return;
    case GemmSplit::Cols:  // split columns of C: op(B) columns
#pragma omp parallel for num_threads(threads) schedule(static)
      for (int t = 0; t < threads; ++t) {
        int c0 = int(int64_t(N) * t / threads), c1 = int(int64_t(N) * (t + 1) / threads);
        if (c1 <= c0) continue;
        const float* b = trans_b ? B + int64_t(c0) * ldb : B + c0;
        cblas_sgemm(CblasRowMajor, ta, tb, M, c1 - c0, K, alpha, A, lda, b, ldb, beta, C + c0, ldc);
      }
      return;
    case GemmSplit::K: {
      // Thread t multiplies K-slice t: thread 0 into C (with beta), the others into partials P_t(M,N) that are
      // then added to C in thread order, each thread adding one block of C's rows.
      static thread_local std::vector<float> partials;  // grown once, reused by every later call
      const size_t mn = size_t(M) * N;
      if (partials.size() < mn * size_t(threads - 1)) partials.resize(mn * size_t(threads - 1));
      float* P = partials.data();
#pragma omp parallel num_threads(threads)
      {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int k0 = int(int64_t(K) * t / nt), k1 = int(int64_t(K) * (t + 1) / nt);
        const float* a = trans_a ? A + int64_t(k0) * lda : A + k0;
        const float* b = trans_b ? B + k0 : B + int64_t(k0) * ldb;
        if (t == 0)
          cblas_sgemm(CblasRowMajor, ta, tb, M, N, k1 - k0, alpha, a, lda, b, ldb, beta, C, ldc);
        else
          cblas_sgemm(CblasRowMajor, ta, tb, M, N, k1 - k0, alpha, a, lda, b, ldb, 0.f, P + mn * (t - 1), N);
#pragma omp barrier
        const int r0 = int(int64_t(M) * t / nt), r1 = int(int64_t(M) * (t + 1) / nt);
        for (int s = 1; s < nt; ++s)
          for (int r = r0; r < r1; ++r) {
            float* __restrict dst = C + int64_t(r) * ldc;
            const float* __restrict src = P + mn * (s - 1) + size_t(r) * N;
            for (int j = 0; j < N; ++j) dst[j] += src[j];
          }
      }
      return;
    }
  }
}

CpuKernels::CpuKernels(int threads) : threads_(std::max(1, threads)) { openblas_set_num_threads(1); }

std::string CpuKernels::bf16_matmul_path() const {
  return bf16_gemm_description() + (bf16_attention_on_tiles() ? ", attention on AMX tiles" : "");
}

namespace {

// An activation as a bf16 matmul operand with leading dimension ld: its bits, or its fp32 values to round.
Bf16Input bf16_input(ConstAct x, int ld) {
  return x.bf16 ? Bf16Input{nullptr, x.bits(), ld} : Bf16Input{x.f32(), nullptr, ld};
}

}  // namespace

void CpuKernels::gemm(bool trans_a, bool trans_b, int M, int N, int K, ConstAct A, int lda, ConstAct B, int ldb,
                      float beta, float* C, int ldc) {
  if (matmul_ == Precision::Bf16) {
    bf16_gemm(trans_a, trans_b, M, N, K, bf16_input(A, lda), bf16_input(B, ldb), beta, C, ldc, threads_,
              bf16_gemm_path());
    return;
  }
  PIPER_CHECK(!A.bf16 && !B.bf16, "a bf16 activation in an fp32 matmul");
  sgemm_parallel(trans_a, trans_b, M, N, K, 1.f, A.f32(), lda, B.f32(), ldb, beta, C, ldc, threads_);
}

namespace {

// The weights kept on this thread (Kernels::keep_weights): their bf16 operands, made once each while kept; the pool's
// buffers stay for the next time.
struct KeptWeights {
  bool on = false;
  std::vector<Bf16Operand> pool;
  size_t used = 0;
};
thread_local KeptWeights t_kept;

// The bf16 operand of weight w (rows, cols), made now the first time it is asked for while kept.
const Bf16Operand& kept_weight(const float* w, int rows, int cols, int threads) {
  for (size_t i = 0; i < t_kept.used; ++i) {
    const Bf16Operand& o = t_kept.pool[i];
    if (o.source == w && o.rows == rows && o.cols == cols) return o;
  }
  if (t_kept.used == t_kept.pool.size()) t_kept.pool.emplace_back();
  Bf16Operand& o = t_kept.pool[t_kept.used++];
  bf16_prepare(o, w, rows, cols, cols, threads);
  return o;
}

}  // namespace

void CpuKernels::keep_weights(bool on) {
  t_kept.on = on;
  t_kept.used = 0;
}

// C(M,N) = A(M,K) · op(w) + beta C for a weight w stored (rows, cols): op(w) = wᵀ (trans_w; K = cols) or w (K = rows).
// `bias` (N): added by the product (bf16 where the path adds one, bf16_adds_bias).
void CpuKernels::weight_gemm(bool trans_w, int M, int N, int K, ConstAct A, const float* w, int rows, int cols,
                             float beta, float* C, const float* bias) {
  if (matmul_ == Precision::Bf16 && (t_kept.on || bias)) {
    // the kept operand, or w's values rounded in the call
    const Bf16Input wi = t_kept.on ? kept_weight(w, rows, cols, threads_).input() : Bf16Input{w, nullptr, cols};
    bf16_gemm(false, trans_w, M, N, K, bf16_input(A, K), wi, beta, C, N, threads_, bf16_gemm_path(), bias);
  } else {
    PIPER_CHECK(!bias, "a bias added by an fp32 product");
    gemm(false, trans_w, M, N, K, A, K, w, cols, beta, C, N);
  }
}

void CpuKernels::linear_forward(float* y, ConstAct x, const float* w, const float* b, int N, int C, int OC) {
  if (b && matmul_ == Precision::Bf16 && bf16_adds_bias(bf16_gemm_path())) {  // the bias added by the product
    weight_gemm(true, N, OC, C, x, w, OC, C, 0.f, y, b);                       // w (OC,C)
    return;
  }
  if (b) {
    for_range(size_t(N), threads_, [&](size_t r0, size_t r1) {
      for (size_t r = r0; r < r1; ++r) std::memcpy(y + r * OC, b, sizeof(float) * OC);
    });
  }
  weight_gemm(true, N, OC, C, x, w, OC, C, b ? 1.f : 0.f, y);  // w (OC,C)
}

void CpuKernels::linear_forward_to_bf16(uint16_t* y, ConstAct x, const float* w, const float* b, int N, int C, int OC,
                                       float* room) {
  if (matmul_ != Precision::Bf16 || !bf16_writes_bf16(bf16_gemm_path()))
    return Kernels::linear_forward_to_bf16(y, x, w, b, N, C, OC, room);
  const Bf16Input wi = t_kept.on ? kept_weight(w, OC, C, threads_).input() : Bf16Input{w, nullptr, C};  // w (OC,C)
  bf16_gemm_to_bf16(false, true, N, OC, C, bf16_input(x, C), wi, y, OC, threads_, b);  // y (N,OC) written as bf16
}

void CpuKernels::linear_gelu_forward(Act dgelu, Act y, ConstAct x, const float* w, const float* b, int N, int C,
                                     int OC, float* room) {
  if (matmul_ == Precision::Bf16) {  // the bf16 product (where an fp32 output or room is), then gelu and gelu'
    float* pre = !dgelu.bf16 ? dgelu.f32() : !y.bf16 ? y.f32() : room;  // (N,OC)
    PIPER_CHECK(pre, "linear_gelu_forward: bf16 y and dgelu without room for the product");
    linear_forward(pre, x, w, b, N, C, OC);
    for_range(size_t(N) * OC, threads_, [&](size_t i0, size_t i1) {
      float g[256], d[256];  // a block of each, stored at its width (pre may be either output: read first)
      for (size_t i = i0; i < i1; i += 256) {
        const size_t m = std::min<size_t>(256, i1 - i);
        for (size_t j = 0; j < m; ++j) vec::gelu_and_grad(pre[i + j], g[j], d[j]);
        cpu::store(y, i, m, [&](size_t j) { return g[j]; });
        cpu::store(dgelu, i, m, [&](size_t j) { return d[j]; });
      }
    });
    return;
  }
  PIPER_CHECK(!x.bf16 && !y.bf16 && !dgelu.bf16, "a bf16 activation in an fp32 matmul");
  // Each thread multiplies its block of rows into y, then turns it into gelu and gelu' in one pass
  // while the block is still in cache.
  int nt = (double(N) * OC * C < 2e6) ? 1 : threads_;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int t = 0; t < nt; ++t) {
    int r0 = int(int64_t(N) * t / nt), r1 = int(int64_t(N) * (t + 1) / nt);
    if (r1 <= r0) continue;
    float* __restrict out = y.f32() + int64_t(r0) * OC;
    float* __restrict d = dgelu.f32() + int64_t(r0) * OC;
    if (b)
      for (int r = r0; r < r1; ++r) std::memcpy(y.f32() + int64_t(r) * OC, b, sizeof(float) * OC);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, OC, C, 1.f, x.f32() + int64_t(r0) * C, C, w, C,
                b ? 1.f : 0.f, out, OC);
    size_t n = size_t(r1 - r0) * OC;
    for (size_t i = 0; i < n; ++i) vec::gelu_and_grad(out[i], out[i], d[i]);
  }
}

void CpuKernels::linear_backward_input(float* dx, ConstAct dy, const float* w, int N, int C, int OC,
                                       bool accumulate) {
  weight_gemm(false, N, C, OC, dy, w, OC, C, accumulate ? 1.f : 0.f, dx);  // w (OC,C)
}

void CpuKernels::linear_backward_weight(float* dw, float* db, ConstAct dy, ConstAct x, int N, int C, int OC,
                                        bool accumulate) {
  gemm(true, false, OC, C, N, dy, OC, x, C, accumulate ? 1.f : 0.f, dw, C);
  if (!db) return;
  PIPER_CHECK(!dy.bf16, "linear_backward_weight: a bias gradient from a bf16 dy");
  column_sums(db, dy.f32(), N, OC, accumulate, nullptr);
}

namespace {

// sums(C) (+)= Σ_rows x(N,C) ⊙ factor, each column in row order (columns split across threads); rounded(N,C), where
// given, = the same values rounded to bf16 in the same pass. Factor: fp32 or bf16 values (N,C), or none (a null
// `const float*`): x as it is.
template <typename Factor>
void sum_columns(int threads, float* sums, const float* x, const Factor* factor, int N, int C, bool accumulate,
                 uint16_t* rounded) {
  for_chunks(size_t(C), size_t(threads), threads, [&](size_t, size_t c0, size_t c1) {
    float* __restrict out = sums;
    if (!accumulate)
      for (size_t c = c0; c < c1; ++c) out[c] = 0.f;
    for (int r = 0; r < N; ++r) {
      const float* __restrict row = x + int64_t(r) * C;
      const Factor* __restrict f = factor ? factor + int64_t(r) * C : nullptr;
      uint16_t* __restrict bits = rounded ? rounded + int64_t(r) * C : nullptr;
      if (!f) {
        for (size_t c = c0; c < c1; ++c) out[c] += row[c];
        if (bits)
          for (size_t c = c0; c < c1; ++c) bits[c] = bf16_bits(row[c]);
      } else {
        for (size_t c = c0; c < c1; ++c) {
          const float v = row[c] * cpu::value(f, c);
          out[c] += v;
          bits[c] = bf16_bits(v);
        }
      }
    }
  });
}

}  // namespace

void CpuKernels::column_sums(float* sums, const float* x, int N, int C, bool accumulate, uint16_t* rounded) {
  sum_columns(threads_, sums, x, static_cast<const float*>(nullptr), N, C, accumulate, rounded);
}

void CpuKernels::to_bf16_with_column_sums(uint16_t* dst, float* sums, const float* src, int N, int C) {
  column_sums(sums, src, N, C, false, dst);
}

void CpuKernels::gelu_backward_to_bf16(uint16_t* dpre, float* sums, const float* dy, ConstAct dgelu, int N, int C) {
  cpu::with_storage(dgelu, [&](const auto* d) { sum_columns(threads_, sums, dy, d, N, C, false, dpre); });
}

void CpuKernels::gelu_backward(float* dpre, const float* dy, ConstAct dgelu, size_t n) {
  for_range(n, threads_, [&](size_t b, size_t e) {
    float* out = dpre;  // may alias dy: each element is read before it is written
    const float* g = dy;
    cpu::with_storage(dgelu, [&](const auto* __restrict d) {
      for (size_t i = b; i < e; ++i) out[i] = g[i] * cpu::value(d, i);
    });
  });
}

void CpuKernels::layernorm_forward(Act y, float* mean, float* rstd, const float* x, const float* w,
                                   const float* b, int N, int C) {
  for_range(size_t(N) * C, threads_, [&](size_t e0, size_t e1) {
    for (size_t r = e0 / C; r < e1 / C; ++r) {
      const float* __restrict xr = x + r * C;
      const float m = vec::lane_sum(C, [&](int i) { return xr[i]; }) / C;
      const float v = vec::lane_sum(C, [&](int i) {
        const float d = xr[i] - m;
        return d * d;
      });
      float rs = 1.0f / std::sqrt(v / C + 1e-5f);
      cpu::store(y, r * C, size_t(C), [&](size_t i) { return (xr[i] - m) * rs * w[i] + b[i]; });  // (C)
      mean[r] = m;
      rstd[r] = rs;
    }
  });
}

void CpuKernels::layernorm_backward_input(float* dx, const float* dy, const float* x, const float* mean,
                                          const float* rstd, const float* w, int N, int C, bool accumulate) {
  for_range(size_t(N) * C, threads_, [&](size_t e0, size_t e1) {
    for (size_t r = e0 / C; r < e1 / C; ++r) {
      const float* __restrict xr = x + r * C;
      const float* __restrict gr = dy + r * C;
      float* __restrict dr = dx + r * C;
      const float m = mean[r], rs = rstd[r];
      const float sum_g = vec::lane_sum(C, [&](int i) { return gr[i] * w[i]; }) / C;
      const float sum_gx = vec::lane_sum(C, [&](int i) { return gr[i] * w[i] * (xr[i] - m) * rs; }) / C;
      if (accumulate)
        for (int i = 0; i < C; ++i) dr[i] += (gr[i] * w[i] - sum_g - (xr[i] - m) * rs * sum_gx) * rs;
      else
        for (int i = 0; i < C; ++i) dr[i] = (gr[i] * w[i] - sum_g - (xr[i] - m) * rs * sum_gx) * rs;
    }
  });
}

void CpuKernels::layernorm_backward_weight(float* dw, float* db, const float* dy, const float* x, const float* mean,
                                           const float* rstd, int N, int C, bool accumulate) {
  for_chunks(size_t(C), size_t(threads_), threads_, [&](size_t, size_t c0, size_t c1) {
    float* __restrict gw = dw;
    float* __restrict gb = db;
    if (!accumulate)
      for (size_t c = c0; c < c1; ++c) gw[c] = gb[c] = 0.f;
    for (int r = 0; r < N; ++r) {
      const float* __restrict xr = x + int64_t(r) * C;
      const float* __restrict gr = dy + int64_t(r) * C;
      const float m = mean[r], rs = rstd[r];
      for (size_t c = c0; c < c1; ++c) {
        gw[c] += gr[c] * (xr[c] - m) * rs;
        gb[c] += gr[c];
      }
    }
  });
}

void CpuKernels::embedding_forward(float* x, const int32_t* tok, const float* wte, const float* wpe, int B, int T,
                                   int C) {
  for_range(size_t(B) * T * C, threads_, [&](size_t e0, size_t e1) {
    for (size_t r = e0 / C; r < e1 / C; ++r) {
      const float* __restrict te = wte + int64_t(tok[r]) * C;
      const float* __restrict pe = wpe + int64_t(r % T) * C;
      float* __restrict out = x + r * C;
      for (int i = 0; i < C; ++i) out[i] = te[i] + pe[i];
    }
  });
}

void CpuKernels::embedding_backward(float* dwte, float* dwpe, const float* dx, const int32_t* tok, int B, int T,
                                    int C, int V, bool accumulate_wte, bool accumulate_wpe) {
  // Columns are split across threads, so repeated tokens never race; row order is fixed.
  for_chunks(size_t(C), size_t(threads_), threads_, [&](size_t, size_t c0, size_t c1) {
    if (!accumulate_wpe)
      for (int t = 0; t < T; ++t)
        for (size_t c = c0; c < c1; ++c) dwpe[int64_t(t) * C + c] = 0.f;
    if (!accumulate_wte)
      for (int t = 0; t < V; ++t)
        for (size_t c = c0; c < c1; ++c) dwte[int64_t(t) * C + c] = 0.f;
    for (int64_t r = 0; r < int64_t(B) * T; ++r) {
      const float* __restrict g = dx + r * C;
      float* __restrict te = dwte + int64_t(tok[r]) * C;
      float* __restrict pe = dwpe + (r % T) * C;
      for (size_t c = c0; c < c1; ++c) {
        te[c] += g[c];
        pe[c] += g[c];
      }
    }
  });
}

void CpuKernels::softmax_xent_forward(float* probs, double* loss_sum, const float* logits, const int32_t* targets,
                                      int N, int V, float scale) {
  double partial[kReduceChunks] = {0};
  for_chunks(size_t(N), kReduceChunks, threads_, [&](size_t chunk, size_t r0, size_t r1) {
    double acc = 0;
    for (size_t r = r0; r < r1; ++r) {
      const float* lr = logits + r * V;  // may alias probs
      float* pr = probs + r * V;
      const float mx = vec::lane_max(lr, V);
      const float target_logit = lr[targets[r]];
      for (int i = 0; i < V; ++i) pr[i] = vec::exp_approx(lr[i] - mx);
      const float sum = vec::lane_sum(V, [&](int i) { return pr[i]; });
      float inv = 1.0f / sum;
      for (int i = 0; i < V; ++i) pr[i] *= inv;
      acc += double(std::log(sum)) - double(target_logit - mx);
    }
    partial[chunk] = acc;
  });
  double total = 0;
  for (double p : partial) total += p;
  *loss_sum += double(scale) * total;
}

void CpuKernels::softmax_xent_backward(float* dlogits, const float* probs, const int32_t* targets, int N, int V,
                                       float scale) {
  vocab_xent_backward(dlogits, probs, targets, N, V, 0, scale);  // the one shard that is the whole vocabulary
}

void CpuKernels::add(float* y, const float* a, const float* b, size_t n) {
  for_range(n, threads_, [&](size_t e0, size_t e1) {
    float* __restrict out = y;
    const float* __restrict x0 = a;
    const float* __restrict x1 = b;
    for (size_t i = e0; i < e1; ++i) out[i] = x0[i] + x1[i];
  });
}

void CpuKernels::accumulate(float* y, const float* x, size_t n) {
  for_range(n, threads_, [&](size_t e0, size_t e1) {
    float* __restrict out = y;
    const float* __restrict in = x;
    for (size_t i = e0; i < e1; ++i) out[i] += in[i];
  });
}

void CpuKernels::fill(float* y, float value, size_t n) {
  for_range(n, threads_, [&](size_t e0, size_t e1) { std::fill(y + e0, y + e1, value); });
}

void CpuKernels::to_bf16(uint16_t* dst, const float* src, size_t n) {
  for_range(n, threads_, [&](size_t e0, size_t e1) {
    for (size_t i = e0; i < e1; ++i) dst[i] = bf16_bits(src[i]);
  });
}

void CpuKernels::from_bf16(float* dst, const uint16_t* src, size_t n) {
  for_range(n, threads_, [&](size_t e0, size_t e1) {
    for (size_t i = e0; i < e1; ++i) dst[i] = bf16_value(src[i]);
  });
}

void CpuKernels::copy(void* dst, const void* src, size_t bytes) {
  if (dst != src) std::memcpy(dst, src, bytes);
}

void CpuKernels::sum_squares(double* acc, const float* x, size_t n) {
  double partial[kReduceChunks] = {0};
  for_chunks(n, kReduceChunks, threads_, [&](size_t chunk, size_t b, size_t e) {
    const float* __restrict in = x;
    double s = 0;
    // float partials over 1024 elements keep it vectorized; doubles across blocks keep it accurate
    for (size_t i = b; i < e; i += 1024) {
      size_t end = std::min(e, i + 1024);
      const float* blk = in + i;
      s += vec::lane_sum(int(end - i), [&](int j) { return blk[j] * blk[j]; });
    }
    partial[chunk] = s;
  });
  double total = 0;
  for (double p : partial) total += p;
  *acc += total;
}

void CpuKernels::adamw(float* param, const float* grad, float* m, float* v, size_t n, const AdamWArgs& a) {
  // Same arithmetic as torch.optim.AdamW (non-fused): decay, moments, bias-corrected step.
  const float bc1 = 1.0f - float(std::pow(double(a.beta1), double(a.step)));
  const float bc2_sqrt = float(std::sqrt(1.0 - std::pow(double(a.beta2), double(a.step))));
  const float step_size = a.lr / bc1;
  const float decay = 1.0f - a.lr * a.weight_decay;
  for_range(n, threads_, [&](size_t e0, size_t e1) {
    float* __restrict p = param;
    const float* __restrict g = grad;
    float* __restrict mm = m;
    float* __restrict vv = v;
    for (size_t i = e0; i < e1; ++i) {
      float gi = g[i] * a.grad_scale;
      mm[i] = a.beta1 * mm[i] + (1.0f - a.beta1) * gi;
      vv[i] = a.beta2 * vv[i] + (1.0f - a.beta2) * gi * gi;
      float denom = std::sqrt(vv[i]) / bc2_sqrt + a.eps;
      p[i] = p[i] * decay - step_size * mm[i] / denom;
    }
  });
}

void CpuKernels::upload(void* dst, const void* host_src, size_t bytes) { std::memcpy(dst, host_src, bytes); }
void CpuKernels::download(void* host_dst, const void* src, size_t bytes) { std::memcpy(host_dst, src, bytes); }

}  // namespace piper
