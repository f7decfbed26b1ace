// CudaKernels: the host side of every primitive. Matmuls are cuBLAS fp32 gemms in row-major form (operands
// swapped for cuBLAS's column-major view, CUBLAS_COMPUTE_32F so no TF32); the rest launches cuda_launch.hpp.
#ifdef PIPER_HAVE_CUDA
#include "backend/cuda/cuda_kernels.hpp"

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_launch.hpp"

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

// The same for `batch` independent products whose operands are `stride_*` floats apart.
void gemm_batched(cublasHandle_t h, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                  int lda, long long stride_a, const float* B, int ldb, long long stride_b, float beta, float* C,
                  int ldc, long long stride_c, int batch) {
  if (M <= 0 || N <= 0 || batch <= 0) return;
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, op(trans_b), op(trans_a), N, M, K, &alpha, B, CUDA_R_32F, ldb, stride_b,
                                          A, CUDA_R_32F, lda, stride_a, &beta, C, CUDA_R_32F, ldc, stride_c, batch,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

CudaKernels::Target CudaKernels::target() {
  if (CudaStream* s = bound_cuda_stream()) return {*s, {}};
  std::unique_lock<std::mutex> lock(fallback_mu_);
  CUDA_CHECK(cudaSetDevice(fallback_->device()));
  return {*fallback_, std::move(lock)};
}

void CudaKernels::linear_forward(float* y, const float* x, const float* w, const float* b, int N, int C, int OC) {
  Target t = target();
  if (b) cuda::bias_fill(y, b, N, OC, t.stream.stream());  // y(N,OC) = b
  gemm(t.stream.blas(), false, true, N, OC, C, 1.f, x, C, w, C, b ? 1.f : 0.f, y, OC);  // y += x · w^T
}

void CudaKernels::linear_gelu_forward(float* dgelu, float* y, const float* x, const float* w, const float* b, int N,
                                      int C, int OC) {
  Target t = target();
  gemm(t.stream.blas(), false, true, N, OC, C, 1.f, x, C, w, C, 0.f, y, OC);  // y(N,OC) = x · w^T
  cuda::bias_gelu(dgelu, y, b, N, OC, t.stream.stream());                     // y = gelu(y + b), dgelu = gelu'
}

void CudaKernels::linear_backward_input(float* dx, const float* dy, const float* w, int N, int C, int OC,
                                        bool accumulate) {
  Target t = target();
  // dx(N,C) (+)= dy(N,OC) · w(OC,C)
  gemm(t.stream.blas(), false, false, N, C, OC, 1.f, dy, OC, w, C, accumulate ? 1.f : 0.f, dx, C);
}

void CudaKernels::linear_backward_weight(float* dw, float* db, const float* dy, const float* x, int N, int C, int OC,
                                         bool accumulate) {
  Target t = target();
  // dw(OC,C) (+)= dy(N,OC)^T · x(N,C)
  gemm(t.stream.blas(), true, false, OC, C, N, 1.f, dy, OC, x, C, accumulate ? 1.f : 0.f, dw, C);
  if (!db) return;
  auto* partial = static_cast<float*>(t.stream.workspace(sizeof(float) * size_t(cuda::column_chunks(N)) * OC));
  cuda::column_sums(db, dy, N, OC, accumulate, partial, t.stream.stream());  // db(OC) (+)= Σ_rows dy
}

void CudaKernels::gelu_backward(float* dpre, const float* dy, const float* dgelu, size_t n) {
  Target t = target();
  cuda::gelu_backward(dpre, dy, dgelu, n, t.stream.stream());
}

void CudaKernels::layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
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

void CudaKernels::attention_forward(float* y, float* att, const float* qkv, int B, int T, int C, int NH) {
  Target t = target();
  cublasHandle_t h = t.stream.blas();
  const int hd = C / NH;
  const float scale = 1.0f / std::sqrt(float(hd));
  const int C3 = 3 * C;
  const long long TT = (long long)T * T;
  // Per sample, batched over heads: head h of q, k, v is the column block [h·hd, (h+1)·hd) of its third.
  for (int b = 0; b < B; ++b) {
    const float* q = qkv + (long long)b * T * C3;  // (T,hd) per head, row stride 3C
    const float* k = q + C;
    float* S = att + (long long)b * NH * TT;  // (NH,T,T)
    gemm_batched(h, false, true, T, T, hd, scale, q, C3, hd, k, C3, hd, 0.f, S, T, TT, NH);  // S = scale · q k^T
  }
  cuda::causal_softmax_forward(att, (int64_t)B * NH * T, T, t.stream.stream());  // P = softmax, causal
  for (int b = 0; b < B; ++b) {
    const float* v = qkv + (long long)b * T * C3 + 2 * C;
    const float* P = att + (long long)b * NH * TT;
    float* yb = y + (long long)b * T * C;  // (T,C): head h at columns [h·hd, (h+1)·hd)
    gemm_batched(h, false, false, T, hd, T, 1.f, P, T, TT, v, C3, hd, 0.f, yb, C, hd, NH);  // y = P · v
  }
}

size_t CudaKernels::attention_scratch_floats(int B, int T, int, int NH) const {
  return size_t(B) * NH * T * T;  // dP, then dS, for every (sample, head)
}

void CudaKernels::attention_backward(float* dqkv, const float* dy, const float* qkv, const float* att, float* scratch,
                                     int B, int T, int C, int NH) {
  Target t = target();
  cublasHandle_t h = t.stream.blas();
  const int hd = C / NH;
  const float scale = 1.0f / std::sqrt(float(hd));
  const int C3 = 3 * C;
  const long long TT = (long long)T * T;
  for (int b = 0; b < B; ++b) {
    const float* v = qkv + (long long)b * T * C3 + 2 * C;
    const float* P = att + (long long)b * NH * TT;      // (NH,T,T)
    const float* dY = dy + (long long)b * T * C;        // (T,C)
    float* dP = scratch + (long long)b * NH * TT;       // (NH,T,T)
    float* dv = dqkv + (long long)b * T * C3 + 2 * C;  // (T,hd) per head, row stride 3C
    gemm_batched(h, false, true, T, T, hd, 1.f, dY, C, hd, v, C3, hd, 0.f, dP, T, TT, NH);    // dP = dY · v^T
    gemm_batched(h, true, false, T, hd, T, 1.f, P, T, TT, dY, C, hd, 0.f, dv, C3, hd, NH);    // dv = P^T · dY
  }
  cuda::causal_softmax_backward(scratch, att, (int64_t)B * NH * T, T, t.stream.stream());  // dS in place of dP
  for (int b = 0; b < B; ++b) {
    const float* q = qkv + (long long)b * T * C3;
    const float* k = q + C;
    const float* dS = scratch + (long long)b * NH * TT;
    float* dq = dqkv + (long long)b * T * C3;
    float* dk = dq + C;
    gemm_batched(h, false, false, T, hd, T, scale, dS, T, TT, k, C3, hd, 0.f, dq, C3, hd, NH);  // dq = dS · k
    gemm_batched(h, true, false, T, hd, T, scale, dS, T, TT, q, C3, hd, 0.f, dk, C3, hd, NH);   // dk = dS^T · q
  }
}

void CudaKernels::embedding_forward(float* x, const int32_t* tok, const float* wte, const float* wpe, int B, int T,
                                    int C) {
  Target t = target();
  cuda::embedding_forward(x, tok, wte, wpe, B, T, C, t.stream.stream());
}

void CudaKernels::embedding_backward(float* dwte, float* dwpe, const float* dx, const int32_t* tok, int B, int T,
                                     int C, int V, bool accumulate_wte, bool accumulate_wpe) {
  Target t = target();
  cuda::embedding_backward(dwte, dwpe, dx, tok, B, T, C, V, accumulate_wte, accumulate_wpe, t.stream.stream());
}

void CudaKernels::rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int N, int C, float eps) {
  Target t = target();
  cuda::rmsnorm_forward(y, rstd, x, w, N, C, eps, t.stream.stream());
}

void CudaKernels::rmsnorm_backward_input(float* dx, const float* dy, const float* x, const float* rstd, const float* w,
                                         int N, int C, bool accumulate) {
  Target t = target();
  cuda::rmsnorm_backward_input(dx, dy, x, rstd, w, N, C, accumulate, t.stream.stream());
}

void CudaKernels::rmsnorm_backward_weight(float* dw, const float* dy, const float* x, const float* rstd, int N, int C,
                                          bool accumulate) {
  Target t = target();
  auto* partial = static_cast<float*>(t.stream.workspace(sizeof(float) * size_t(cuda::column_chunks(N)) * C));
  cuda::rmsnorm_backward_weight(dw, dy, x, rstd, N, C, accumulate, partial, t.stream.stream());
}

void CudaKernels::rope(float* x, int B, int T, int H, int D, float theta, bool inverse) {
  Target t = target();
  cuda::rope(x, B, T, H, D, theta, inverse, t.stream.stream());
}

void CudaKernels::gqa_attention_forward(float* y, float* lse, const float* q, const float* k, const float* v, int B,
                                        int T, int H, int KV, int D) {
  Target t = target();
  cuda::gqa_attention_forward(y, lse, q, k, v, B, T, H, KV, D, t.stream.stream());
}

size_t CudaKernels::gqa_attention_scratch_floats(int B, int T, int H, int, int) const {
  return size_t(B) * H * T;  // dy · y of every query row
}

void CudaKernels::gqa_attention_backward(float* dq, float* dk, float* dv, const float* dy, const float* q,
                                         const float* k, const float* v, const float* y, const float* lse,
                                         float* scratch, int B, int T, int H, int KV, int D) {
  Target t = target();
  cuda::gqa_attention_backward(dq, dk, dv, dy, q, k, v, y, lse, scratch, B, T, H, KV, D, t.stream.stream());
}

void CudaKernels::swiglu_forward(float* a, const float* g, const float* u, size_t n) {
  Target t = target();
  cuda::swiglu_forward(a, g, u, n, t.stream.stream());
}

void CudaKernels::swiglu_backward(float* dg, float* du, const float* da, const float* g, const float* u, size_t n) {
  Target t = target();
  cuda::swiglu_backward(dg, du, da, g, u, n, t.stream.stream());
}

void CudaKernels::token_embedding_forward(float* x, const int32_t* tok, const float* w, int N, int C) {
  Target t = target();
  cuda::token_embedding_forward(x, tok, w, N, C, t.stream.stream());
}

void CudaKernels::token_embedding_backward(float* dw, const float* dx, const int32_t* tok, int N, int C, int V,
                                           bool accumulate) {
  Target t = target();
  cuda::token_embedding_backward(dw, dx, tok, N, C, V, accumulate, t.stream.stream());
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
  cuda::softmax_xent_backward(dlogits, probs, targets, N, V, scale, t.stream.stream());
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

void CudaKernels::gather_rows(float* dst, const float* src, const int32_t* rows, const float* scale, int m, int C) {
  Target t = target();
  cuda::gather_rows(dst, src, rows, scale, m, C, t.stream.stream());
}

void CudaKernels::combine_rows(float* dst, const float* src, const int32_t* pos, const float* w, int n, int K, int C,
                               bool accumulate) {
  Target t = target();
  cuda::combine_rows(dst, src, pos, w, n, K, C, accumulate, t.stream.stream());
}

void CudaKernels::rows_dot(float* out, const float* a, const float* b, const int32_t* pos, int n, int K, int C) {
  Target t = target();
  cuda::rows_dot(out, a, b, pos, n, K, C, t.stream.stream());
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

void CudaKernels::host_free(void* p) {
  if (p) CUDA_CHECK(cudaFreeHost(p));
}

void CudaKernels::download(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  Target t = target();
  CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, t.stream.stream()));
  CUDA_CHECK(cudaStreamSynchronize(t.stream.stream()));
}

}  // namespace piper

#endif  // PIPER_HAVE_CUDA
