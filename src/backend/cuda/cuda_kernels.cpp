// CudaKernels: the host side of every primitive. Matmuls are cuBLAS gemms in row-major form (operands swapped for
// cuBLAS's column-major view, CUBLAS_COMPUTE_32F so no TF32; bf16 operands in a bf16 run); the rest launches
// cuda_launch.hpp.
#ifdef PIPER_HAVE_CUDA
#include "backend/cuda/cuda_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <vector>

#include "backend/cuda/cuda_launch.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

// C(M,N) = alpha · op(A)(M,K) · op(B)(K,N) + beta · C, all row-major. Row-major C is column-major C^T,
// so cuBLAS computes C^T(N,M) = op(B)^T · op(A)^T with the operands swapped.
void gemm(cublasHandle_t h, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  CUBLAS_CHECK(cublasGemmEx(h, op(trans_b), op(trans_a), N, M, K, &alpha, B, CUDA_R_32F, ldb, A, CUDA_R_32F, lda,
                            &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The same product with A and B rounded to bf16 (packed copies in the stream's workspace; a bf16 activation is taken
// as it is) and fp32 accumulation into the fp32 C: the linear layers' matmuls of a bf16 run, on tensor cores.
void gemm_bf16(CudaStream& stream, bool trans_a, bool trans_b, int M, int N, int K, ConstAct A, int lda, ConstAct B,
               int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // no operands: C = beta · C, which only beta = 0 (C = 0) or 1 (nothing) ask for
    if (beta == 0.f)
      CUDA_CHECK(cudaMemset2DAsync(C, sizeof(float) * size_t(ldc), 0, sizeof(float) * size_t(N), size_t(M),
                                   stream.stream()));
    return;
  }
  // op(A) is M×K: stored (M,K), or (K,M) transposed; op(B) is K×N: stored (K,N), or (N,K) transposed.
  const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  const size_t a_elems = size_t(a_rows) * a_cols, b_elems = size_t(b_rows) * b_cols;
  auto* a16 = static_cast<uint16_t*>(stream.workspace(sizeof(uint16_t) * (a_elems + b_elems + 64)));
  uint16_t* b16 = a16 + (a_elems + 63) / 64 * 64;  // 128-byte aligned
  int a_ld = a_cols, b_ld = b_cols;
  if (A.bf16)
    a16 = const_cast<uint16_t*>(A.bits()), a_ld = lda;
  else
    cuda::to_bf16(a16, A.f32(), a_rows, a_cols, lda, stream.stream());
  if (B.bf16)
    b16 = const_cast<uint16_t*>(B.bits()), b_ld = ldb;
  else
    cuda::to_bf16(b16, B.f32(), b_rows, b_cols, ldb, stream.stream());
  const float alpha = 1.f;
  CUBLAS_CHECK(cublasGemmEx(stream.blas(), op(trans_b), op(trans_a), N, M, K, &alpha, b16, CUDA_R_16BF, b_ld, a16,
                            CUDA_R_16BF, a_ld, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// fp32 copies of q, k, v (or dy) as bf16 values: fp32 rounded, bf16 widened (exact).
void rounded_f32(float* dst, ConstAct a, size_t n, cudaStream_t s) {
  if (a.bf16) cuda::from_bf16(dst, a.bits(), n, s);
  else cuda::round_bf16(dst, a.f32(), n, s);
}


// One row-major product C(M,N) = op(A)(M,K) · op(B)(K,N) + beta · C of a grouped gemm; K = 0 is C = beta · C,
// which only beta = 0 (C = 0, contiguous) or 1 (nothing) may ask for. A and B may be bf16 activations in bf16
// matmul precision.
struct GemmProblem {
  bool trans_a, trans_b;
  int M, N, K;
  ConstAct A, B;
  int lda, ldb;
  float* C;
  int ldc;
  float beta;
};

// The problems as few cublasGemmGroupedBatchedEx calls as list order allows: a problem whose output an earlier
// problem writes goes to a later call (round r holds the r-th product into each output), so products into one
// output run in list order and each call's outputs are distinct. fp32 with CUBLAS_COMPUTE_32F (no TF32).
void gemm_grouped(CudaStream& stream, const std::vector<GemmProblem>& problems) {
  const size_t count = problems.size();
  const int n = int(count);
  if (n == 0) return;
  std::vector<int> round(count);
  std::map<const float*, int> products;  // output → products seen so far
  int rounds = 0;
  for (int i = 0; i < n; ++i) {
    round[size_t(i)] = products[problems[size_t(i)].C]++;
    rounds = std::max(rounds, round[size_t(i)] + 1);
  }
  // Problems by round, and their device pointer arrays: A, B, C of every problem, in that order.
  std::vector<int> order(count);
  for (int i = 0; i < n; ++i) order[size_t(i)] = i;
  // by round; in a round (distinct outputs, any order) the empty products (K = 0) last
  auto key = [&](int i) { return std::pair<int, bool>(round[size_t(i)], problems[size_t(i)].K <= 0); };
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return key(x) < key(y); });
  std::vector<void*> pointers(3 * count);  // (3,n): A, B, C; cuBLAS's view swaps A and B
  for (int j = 0; j < n; ++j) {
    const GemmProblem& p = problems[size_t(order[size_t(j)])];
    PIPER_CHECK(!p.A.bf16 && !p.B.bf16, "a bf16 activation in an fp32 grouped matmul");
    pointers[size_t(j)] = const_cast<float*>(p.B.f32());
    pointers[size_t(n + j)] = const_cast<float*>(p.A.f32());
    pointers[size_t(2 * n + j)] = p.C;
  }
  // The copy from pageable memory is staged before it returns, so `pointers` may go out of scope.
  auto** device_pointers = static_cast<void**>(stream.workspace(sizeof(void*) * pointers.size()));
  CUDA_CHECK(cudaMemcpyAsync(device_pointers, pointers.data(), sizeof(void*) * pointers.size(),
                             cudaMemcpyHostToDevice, stream.stream()));
  std::vector<cublasOperation_t> op_a(count), op_b(count);
  std::vector<int> m(count), nn(count), k(count), lda(count), ldb(count), ldc(count), size(count, 1);
  std::vector<float> alpha(count, 1.f), beta(count);
  for (int j = 0; j < n; ++j) {  // row-major C is column-major C^T = op(B)^T · op(A)^T (as in gemm)
    const GemmProblem& p = problems[size_t(order[size_t(j)])];
    op_a[size_t(j)] = op(p.trans_b);
    op_b[size_t(j)] = op(p.trans_a);
    m[size_t(j)] = p.N;
    nn[size_t(j)] = p.M;
    k[size_t(j)] = p.K;
    lda[size_t(j)] = p.ldb;
    ldb[size_t(j)] = p.lda;
    ldc[size_t(j)] = p.ldc;
    beta[size_t(j)] = p.beta;
  }
  for (int r = 0, first = 0; r < rounds; ++r) {
    int last = first, empty = first;  // round r: [first, empty) products, [empty, last) empty ones
    while (last < n && round[size_t(order[size_t(last)])] == r) ++last;
    while (empty < last && problems[size_t(order[size_t(empty)])].K > 0) ++empty;
    for (int j = empty; j < last; ++j) {
      const GemmProblem& p = problems[size_t(order[size_t(j)])];
      if (p.beta == 0.f) CUDA_CHECK(cudaMemsetAsync(p.C, 0, sizeof(float) * size_t(p.M) * p.N, stream.stream()));
    }
    if (empty > first)
      CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
          stream.blas(), op_a.data() + first, op_b.data() + first, m.data() + first, nn.data() + first,
          k.data() + first, alpha.data() + first, device_pointers + first, CUDA_R_32F, lda.data() + first,
          device_pointers + n + first, CUDA_R_32F, ldb.data() + first, beta.data() + first,
          device_pointers + 2 * n + first, CUDA_R_32F, ldc.data() + first, empty - first, size.data() + first,
          CUBLAS_COMPUTE_32F));
    first = last;
  }
}

}  // namespace

CudaKernels::Target CudaKernels::target() {
  if (CudaStream* s = bound_cuda_stream()) return {*s, {}};
  std::unique_lock<std::mutex> lock(fallback_mu_);
  CUDA_CHECK(cudaSetDevice(fallback_->device()));
  return {*fallback_, std::move(lock)};
}

void CudaKernels::linear_gemm(CudaStream& stream, bool trans_a, bool trans_b, int M, int N, int K, ConstAct A,
                              int lda, ConstAct B, int ldb, float beta, float* C, int ldc) {
  if (matmul_ == Precision::Bf16) return gemm_bf16(stream, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc);
  PIPER_CHECK(!A.bf16 && !B.bf16, "a bf16 activation in an fp32 matmul");
  gemm(stream.blas(), trans_a, trans_b, M, N, K, 1.f, A.f32(), lda, B.f32(), ldb, beta, C, ldc);
}

void CudaKernels::linear_forward(float* y, ConstAct x, const float* w, const float* b, int N, int C, int OC) {
  Target t = target();
  if (b) cuda::bias_fill(y, b, N, OC, t.stream.stream());  // y(N,OC) = b
  linear_gemm(t.stream, false, true, N, OC, C, x, C, w, C, b ? 1.f : 0.f, y, OC);  // y += x · w^T
}

void CudaKernels::linear_gelu_forward(Act dgelu, Act y, ConstAct x, const float* w, const float* b, int N, int C,
                                      int OC, float* room) {
  Target t = target();
  float* pre = !dgelu.bf16 ? dgelu.f32() : !y.bf16 ? y.f32() : room;         // (N,OC), fp32
  PIPER_CHECK(pre, "linear_gelu_forward: bf16 y and dgelu without room for the product");
  linear_gemm(t.stream, false, true, N, OC, C, x, C, w, C, 0.f, pre, OC);     // pre = x · w^T
  cuda::bias_gelu(dgelu, y, pre, b, N, OC, t.stream.stream());                // y = gelu(pre + b), dgelu = gelu'
}

void CudaKernels::linear_backward_input(float* dx, ConstAct dy, const float* w, int N, int C, int OC,
                                        bool accumulate) {
  Target t = target();
  // dx(N,C) (+)= dy(N,OC) · w(OC,C)
  linear_gemm(t.stream, false, false, N, C, OC, dy, OC, w, C, accumulate ? 1.f : 0.f, dx, C);
}

void CudaKernels::linear_backward_weight(float* dw, float* db, ConstAct dy, ConstAct x, int N, int C, int OC,
                                         bool accumulate) {
  Target t = target();
  // dw(OC,C) (+)= dy(N,OC)^T · x(N,C)
  linear_gemm(t.stream, true, false, OC, C, N, dy, OC, x, C, accumulate ? 1.f : 0.f, dw, C);
  if (!db) return;
  PIPER_CHECK(!dy.bf16, "linear_backward_weight: a bias gradient from a bf16 dy");
  auto* partial = static_cast<float*>(t.stream.workspace(sizeof(float) * size_t(cuda::column_chunks(N)) * OC));
  cuda::column_sums(db, dy.f32(), N, OC, accumulate, partial, t.stream.stream());  // db(OC) (+)= Σ_rows dy
}

namespace {

// One GEMM per group of `groups` that has work, as `problem(g)` writes it, launched together.
template <typename Problem>
void run_grouped(CudaStream& stream, Precision precision, const LinearGroup* groups, int count, Problem&& problem) {
  std::vector<GemmProblem> problems;
  for (int i = 0; i < count; ++i)
    if (std::optional<GemmProblem> p = problem(groups[i])) problems.push_back(*p);
  if (precision == Precision::Bf16) {  // one bf16 gemm after another, in list order
    for (const GemmProblem& p : problems)
      gemm_bf16(stream, p.trans_a, p.trans_b, p.M, p.N, p.K, p.A, p.lda, p.B, p.ldb, p.beta, p.C, p.ldc);
    return;
  }
  gemm_grouped(stream, problems);
}

}  // namespace

void CudaKernels::linear_forward_grouped(const LinearGroup* groups, int count) {
  Target t = target();
  run_grouped(t.stream, matmul_, groups, count, [](const LinearGroup& g) -> std::optional<GemmProblem> {
    if (g.N <= 0 || g.OC <= 0) return std::nullopt;
    // y(N,OC) = x(N,C) · w(OC,C)^T
    return GemmProblem{false, true, g.N, g.OC, g.C, g.a, g.b, g.C, g.C, g.out, g.OC, 0.f};
  });
}

void CudaKernels::linear_backward_input_grouped(const LinearGroup* groups, int count) {
  Target t = target();
  run_grouped(t.stream, matmul_, groups, count, [](const LinearGroup& g) -> std::optional<GemmProblem> {
    if (g.N <= 0 || g.C <= 0) return std::nullopt;
    // dx(N,C) (+)= dy(N,OC) · w(OC,C)
    return GemmProblem{false, false, g.N, g.C, g.OC, g.a, g.b, g.OC, g.C, g.out, g.C, g.accumulate ? 1.f : 0.f};
  });
}

void CudaKernels::linear_backward_weight_grouped(const LinearGroup* groups, int count) {
  Target t = target();
  run_grouped(t.stream, matmul_, groups, count, [](const LinearGroup& g) -> std::optional<GemmProblem> {
    if (g.OC <= 0 || g.C <= 0) return std::nullopt;
    // dw(OC,C) (+)= dy(N,OC)^T · x(N,C)
    return GemmProblem{true, false, g.OC, g.C, g.N, g.a, g.b, g.OC, g.C, g.out, g.C, g.accumulate ? 1.f : 0.f};
  });
}

void CudaKernels::gelu_backward(float* dpre, const float* dy, ConstAct dgelu, size_t n) {
  Target t = target();
  cuda::gelu_backward(dpre, dy, dgelu, n, t.stream.stream());
}

void CudaKernels::layernorm_forward(Act y, float* mean, float* rstd, const float* x, const float* w,
                                    const float* b, int N, int C) {
  Target t = target();
  cuda::layernorm_forward(y, mean, rstd, x, w, b, N, C, t.stream.stream());
}

void CudaKernels::layernorm_backward_input(float* dx, const float* dy, const float* x, const float* mean,
                                           const float* rstd, const float* w, int N, int C, bool accumulate) {
  Target t = target();
  cuda::layernorm_backward_input(dx, dy, x, mean, rstd, w, N, C, accumulate, t.stream.stream());
}

void CudaKernels::layernorm_backward_weight(float* dw, float* db, const float* dy, const float* x, const float* mean,
                                            const float* rstd, int N, int C, bool accumulate) {
  Target t = target();
  auto* partial = static_cast<float*>(t.stream.workspace(sizeof(float) * 2 * size_t(cuda::column_chunks(N)) * C));
  cuda::layernorm_backward_weight(dw, db, dy, x, mean, rstd, N, C, accumulate, partial, t.stream.stream());
}

void CudaKernels::embedding_forward(float* x, const int32_t* tok, const float* wte, const float* wpe, int B, int T,
                                    int C) {
  Target t = target();
  cuda::embedding_forward(x, tok, wte, wpe, B, T, C, t.stream.stream());
}

void CudaKernels::embedding_backward(float* dwte, float* dwpe, const float* dx, const int32_t* tok, int B, int T,
                                     int C, int V, bool accumulate_wte, bool accumulate_wpe) {
  Target t = target();
  void* sort = t.stream.workspace(std::max<size_t>(1, cuda::token_embedding_backward_workspace_bytes(B * T)));
  cuda::embedding_backward(dwte, dwpe, dx, tok, B, T, C, V, accumulate_wte, accumulate_wpe, sort, t.stream.stream());
}

void CudaKernels::rmsnorm_forward(Act y, float* rstd, ConstAct x, const float* w, int N, int C, float eps) {
  Target t = target();
  cuda::rmsnorm_forward(y, rstd, x, w, N, C, eps, t.stream.stream());
}

void CudaKernels::rmsnorm_backward_input(Act dx, const float* dy, ConstAct x, const float* rstd, const float* w,
                                         int N, int C, bool accumulate) {
  PIPER_CHECK(!(dx.bf16 && accumulate), "rmsnorm_backward_input: a bf16 dx added to");
  Target t = target();
  cuda::rmsnorm_backward_input(dx, dy, x, rstd, w, N, C, accumulate, t.stream.stream());
}

void CudaKernels::rmsnorm_backward_weight(float* dw, const float* dy, ConstAct x, const float* rstd, int N, int C,
                                          bool accumulate) {
  Target t = target();
  auto* partial = static_cast<float*>(t.stream.workspace(sizeof(float) * size_t(cuda::column_chunks(N)) * C));
  cuda::rmsnorm_backward_weight(dw, dy, x, rstd, N, C, accumulate, partial, t.stream.stream());
}

void CudaKernels::rope(float* x, int B, int T, int H, int D, float theta, bool inverse) {
  Target t = target();
  const size_t table_floats = std::max<size_t>(1, cuda::rope_table_floats(T, D));  // cos, sin (T,D/2) each
  auto* table = static_cast<float*>(t.stream.workspace(sizeof(float) * table_floats));
  cuda::rope(x, B, T, H, D, theta, inverse, table, t.stream.stream());
}

namespace {

// The elements a view of `rows` rows `stride` apart, each `width` wide, spans from its first.
size_t view_span(int64_t rows, int64_t stride, int64_t width) {
  return rows > 0 ? size_t((rows - 1) * stride + width) : 0;
}

}  // namespace

void CudaKernels::gqa_attention_forward(float* y, float* lse, ConstAct q, ConstAct k, ConstAct v, int B, int T,
                                        int H, int KV, int D, HeadRows rows) {
  Target t = target();
  const HeadRows r = rows.resolved(H, KV, D);
  if (matmul_ == Precision::Bf16) {
    if (cuda::gqa_attention_bf16_supported(D)) {
      cuda::gqa_attention_forward_bf16(y, lse, q, k, v, B, T, H, KV, D, r.q, r.kv, t.stream.stream());
      return;
    }
    // Head dimensions over 128 (more than the tensor-core kernels hold in shared memory): the fp32 kernel on
    // rounded copies of q, k, v (each over the span of its rows, at its row stride), so that only its
    // probabilities are not rounded for P·v.
    const size_t nq = view_span(int64_t(B) * T, r.q, int64_t(H) * D);
    const size_t nk = view_span(int64_t(B) * T, r.kv, int64_t(KV) * D);
    auto* rq = static_cast<float*>(t.stream.workspace(sizeof(float) * std::max<size_t>(1, nq + 2 * nk)));
    float* rk = rq + nq;
    float* rv = rk + nk;
    rounded_f32(rq, q, nq, t.stream.stream());
    rounded_f32(rk, k, nk, t.stream.stream());
    rounded_f32(rv, v, nk, t.stream.stream());
    cuda::gqa_attention_forward(y, lse, rq, rk, rv, B, T, H, KV, D, r.q, r.kv, t.stream.stream());
    return;
  }
  PIPER_CHECK(!q.bf16 && !k.bf16 && !v.bf16, "gqa_attention_forward: bf16 q, k, v in fp32 matmul precision");
  cuda::gqa_attention_forward(y, lse, q.f32(), k.f32(), v.f32(), B, T, H, KV, D, r.q, r.kv, t.stream.stream());
}

size_t CudaKernels::gqa_attention_scratch_floats(int B, int T, int H, int, int) const {
  return size_t(B) * H * T;  // dy · y of every query row
}

void CudaKernels::gqa_attention_backward(float* dq, float* dk, float* dv, const float* dy, ConstAct q, ConstAct k,
                                         ConstAct v, ConstAct y, const float* lse, float* scratch, int B, int T,
                                         int H, int KV, int D, HeadRows rows) {
  Target t = target();
  const HeadRows r = rows.resolved(H, KV, D);
  if (matmul_ == Precision::Bf16) {
    if (cuda::gqa_attention_bf16_supported(D)) {
      cuda::gqa_attention_backward_bf16(dq, dk, dv, dy, q, k, v, y, lse, scratch, B, T, H, KV, D, r.q, r.kv,
                                        t.stream.stream());
      return;
    }
    // Head dimensions over 128: the fp32 kernels on rounded copies of q, k, v, dy (P and dS not rounded, and
    // Σ P dP taken as the rounded dy · y).
    const size_t nq = view_span(int64_t(B) * T, r.q, int64_t(H) * D);
    const size_t nk = view_span(int64_t(B) * T, r.kv, int64_t(KV) * D);
    const size_t ny = size_t(B) * T * H * D;
    auto* rq = static_cast<float*>(t.stream.workspace(sizeof(float) * std::max<size_t>(1, nq + ny + 2 * nk)));
    float* rdy = rq + nq;
    float* rk = rdy + ny;
    float* rv = rk + nk;
    rounded_f32(rq, q, nq, t.stream.stream());
    cuda::round_bf16(rdy, dy, ny, t.stream.stream());
    rounded_f32(rk, k, nk, t.stream.stream());
    rounded_f32(rv, v, nk, t.stream.stream());
    cuda::gqa_attention_backward(dq, dk, dv, rdy, rq, rk, rv, y, lse, scratch, B, T, H, KV, D, r.q, r.kv,
                                 t.stream.stream());
    return;
  }
  PIPER_CHECK(!q.bf16 && !k.bf16 && !v.bf16, "gqa_attention_backward: bf16 q, k, v in fp32 matmul precision");
  cuda::gqa_attention_backward(dq, dk, dv, dy, q.f32(), k.f32(), v.f32(), y, lse, scratch, B, T, H, KV, D, r.q,
                               r.kv, t.stream.stream());
}

void CudaKernels::swiglu_forward(Act a, ConstAct g, ConstAct u, size_t n) {
  Target t = target();
  cuda::swiglu_forward(a, g, u, n, t.stream.stream());
}

void CudaKernels::swiglu_backward(Act dg, Act du, const float* da, ConstAct g, ConstAct u, size_t n) {
  PIPER_CHECK(dg.bf16 == du.bf16, "swiglu_backward: dg and du of different widths");
  Target t = target();
  cuda::swiglu_backward(dg, du, da, g, u, n, t.stream.stream());
}

void CudaKernels::token_embedding_forward(float* x, const int32_t* tok, const float* w, int N, int C) {
  // the one shard of the whole vocabulary: every token is in [0, INT_MAX) (V is not an argument)
  vocab_embedding_forward(x, tok, w, N, C, 0, std::numeric_limits<int>::max());
}

void CudaKernels::token_embedding_backward(float* dw, const float* dx, const int32_t* tok, int N, int C, int V,
                                           bool accumulate) {
  vocab_embedding_backward(dw, dx, tok, N, C, 0, V, accumulate);  // the one shard of the whole vocabulary
}

void CudaKernels::vocab_embedding_forward(float* x, const int32_t* tok, const float* w, int N, int C, int v0,
                                          int Vl) {
  Target t = target();
  cuda::vocab_embedding_forward(x, tok, w, N, C, v0, Vl, t.stream.stream());
}

void CudaKernels::vocab_embedding_backward(float* dw, const float* dx, const int32_t* tok, int N, int C, int v0,
                                           int Vl, bool accumulate) {
  Target t = target();
  void* sort = t.stream.workspace(std::max<size_t>(1, cuda::token_embedding_backward_workspace_bytes(N)));
  cuda::vocab_embedding_backward(dw, dx, tok, N, C, v0, Vl, accumulate, sort, t.stream.stream());
}

void CudaKernels::softmax_xent_forward(float* probs, double* loss_sum, const float* logits, const int32_t* targets,
                                       int N, int V, float scale) {
  Target t = target();
  auto* row_loss = static_cast<double*>(t.stream.workspace(sizeof(double) * size_t(N > 0 ? N : 1)));  // (N)
  cuda::softmax_xent_forward(probs, loss_sum, logits, targets, N, V, scale, row_loss, t.stream.stream());
}

void CudaKernels::softmax_xent_backward(float* dlogits, const float* probs, const int32_t* targets, int N, int V,
                                        float scale) {
  Target t = target();
  cuda::vocab_xent_backward(dlogits, probs, targets, N, V, 0, scale, t.stream.stream());  // the whole vocabulary
}

void CudaKernels::vocab_xent_stats(float* stats, const float* logits, const int32_t* targets, int N, int Vl, int v0) {
  Target t = target();
  cuda::vocab_xent_stats(stats, logits, targets, N, Vl, v0, t.stream.stream());
}

void CudaKernels::vocab_xent_finish(float* probs, double* loss_sum, const float* logits, const float* all,
                                    const int32_t* targets, int N, int Vl, int ranks, float scale) {
  Target t = target();
  auto* row_loss = static_cast<double*>(t.stream.workspace(sizeof(double) * size_t(N > 0 ? N : 1)));  // (N)
  cuda::vocab_xent_finish(probs, loss_sum, logits, all, targets, N, Vl, ranks, scale, row_loss, t.stream.stream());
}

void CudaKernels::vocab_xent_backward(float* dlogits, const float* probs, const int32_t* targets, int N, int Vl,
                                      int v0, float scale) {
  Target t = target();
  cuda::vocab_xent_backward(dlogits, probs, targets, N, Vl, v0, scale, t.stream.stream());
}

void CudaKernels::add(float* y, const float* a, const float* b, size_t n) {
  Target t = target();
  cuda::add(y, a, b, n, t.stream.stream());
}

void CudaKernels::accumulate(float* y, const float* x, size_t n) {
  Target t = target();
  cuda::accumulate(y, x, n, t.stream.stream());
}

void CudaKernels::fill(float* y, float value, size_t n) {
  Target t = target();
  cuda::fill(y, value, n, t.stream.stream());
}

void CudaKernels::to_bf16_with_column_sums(uint16_t* dst, float* sums, const float* src, int N, int C) {
  Target t = target();
  auto* partial = static_cast<float*>(t.stream.workspace(sizeof(float) * size_t(cuda::column_chunks(N)) * C));
  cuda::column_sums(sums, src, N, C, false, partial, t.stream.stream());  // sums(C) = Σ_rows src
  cuda::to_bf16(dst, src, size_t(N) * size_t(C), t.stream.stream());
}

void CudaKernels::gelu_backward_to_bf16(uint16_t* dpre, float* sums, const float* dy, ConstAct dgelu, int N, int C) {
  Target t = target();
  const size_t n = size_t(N) * size_t(C);
  auto* products = static_cast<float*>(t.stream.workspace(sizeof(float) * (n + size_t(cuda::column_chunks(N)) * C)));
  float* partial = products + n;  // (chunks,C)
  cuda::gelu_backward(products, dy, dgelu, n, t.stream.stream());              // (N,C)
  cuda::column_sums(sums, products, N, C, false, partial, t.stream.stream());  // sums(C) = Σ_rows products
  cuda::to_bf16(dpre, products, n, t.stream.stream());
}

void CudaKernels::to_bf16(uint16_t* dst, const float* src, size_t n) {
  Target t = target();
  cuda::to_bf16(dst, src, n, t.stream.stream());
}

void CudaKernels::from_bf16(float* dst, const uint16_t* src, size_t n) {
  Target t = target();
  cuda::from_bf16(dst, src, n, t.stream.stream());
}

void CudaKernels::copy(void* dst, const void* src, size_t bytes) {
  if (dst == src || bytes == 0) return;
  Target t = target();
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, t.stream.stream()));
}

void CudaKernels::sum_squares(double* acc, const float* x, size_t n) {
  Target t = target();
  auto* partial = static_cast<double*>(t.stream.workspace(sizeof(double) * cuda::sum_squares_partials(n)));
  cuda::sum_squares(acc, x, n, partial, t.stream.stream());
}

void CudaKernels::adamw(float* param, const float* grad, float* m, float* v, size_t n, const AdamWArgs& args) {
  Target t = target();
  cuda::adamw(param, grad, m, v, n, args, t.stream.stream());
}

void CudaKernels::gather_rows(Act dst, const float* src, const int32_t* rows, const float* scale, int m, int C) {
  Target t = target();
  cuda::gather_rows(dst, src, rows, scale, m, C, t.stream.stream());
}

void CudaKernels::combine_rows(float* dst, ConstAct src, const int32_t* pos, const float* w, int n, int K, int C,
                               bool accumulate) {
  Target t = target();
  cuda::combine_rows(dst, src, pos, w, n, K, C, accumulate, t.stream.stream());
}

void CudaKernels::rows_dot(float* out, const float* a, ConstAct b, const int32_t* pos, int n, int K, int C) {
  Target t = target();
  cuda::rows_dot(out, a, b, pos, n, K, C, t.stream.stream());
}

void CudaKernels::moe_route(float* probs, int32_t* selected, float* weight, const float* logits, const float* bias,
                            int n, int E, int K, bool norm_topk) {
  Target t = target();
  cuda::moe_route(probs, selected, weight, logits, bias, n, E, K, norm_topk, t.stream.stream());
}

void CudaKernels::moe_assign(int32_t* position, int32_t* counts, int32_t* token, float* token_weight, float* fraction,
                             double* stats, const int32_t* selected, const float* weight, int n, int T, int E, int K,
                             int capacity, int A) {
  Target t = target();
  cuda::moe_assign(position, counts, token, token_weight, fraction, stats, selected, weight, n, T, E, K, capacity, A,
                   t.stream.stream());
}

void CudaKernels::moe_balance_loss(double* loss, const float* fraction, const float* probs, int n, int T, int E,
                                   double scale) {
  Target t = target();
  cuda::moe_balance_loss(loss, fraction, probs, n, T, E, scale, t.stream.stream());
}

void CudaKernels::moe_router_backward(float* dlogits, const float* probs, const int32_t* selected, const float* weight,
                                      const float* fraction, const float* dweight, int n, int T, int E, int K,
                                      bool norm_topk, double balance_scale) {
  Target t = target();
  cuda::moe_router_backward(dlogits, probs, selected, weight, fraction, dweight, n, T, E, K, norm_topk, balance_scale,
                            t.stream.stream());
}

void CudaKernels::upload(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  Target t = target();
  // Ordered after the stream's earlier work; complete on return, so the host buffer may be reused.
  CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, t.stream.stream()));
  CUDA_CHECK(cudaStreamSynchronize(t.stream.stream()));
}

void* CudaKernels::host_alloc(size_t bytes) {
  void* p = nullptr;
  return cudaMallocHost(&p, std::max<size_t>(bytes, 1)) == cudaSuccess ? p : nullptr;
}

// Reached from destructors (a checkpoint writer's staging buffer): never throws. A failure here follows an
// earlier device error, which was reported where it happened.
void CudaKernels::host_free(void* p) {
  if (p && cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
}

void CudaKernels::download(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  Target t = target();
  CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, t.stream.stream()));
  CUDA_CHECK(cudaStreamSynchronize(t.stream.stream()));
}

}  // namespace piper

#endif  // PIPER_HAVE_CUDA
