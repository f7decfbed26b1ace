// CPU implementation of the compute primitives: OpenBLAS sgemm (one BLAS thread per call, split
// across this rank's OpenMP threads) and fused, vectorized elementwise kernels.
#pragma once
#include "backend/kernels.hpp"

namespace piper {

class CpuKernels final : public Kernels {
 public:
  explicit CpuKernels(int threads);
  int threads() const { return threads_; }

  void set_matmul_precision(Precision p) override { matmul_ = p; }
  std::string bf16_matmul_path() const override;
  void keep_weights(bool on) override;

  void linear_forward(float* y, ConstAct x, const float* w, const float* b, int N, int C, int OC) override;
  void linear_gelu_forward(Act dgelu, Act y, ConstAct x, const float* w, const float* b, int N, int C,
                           int OC, float* room = nullptr) override;
  void linear_backward_input(float* dx, ConstAct dy, const float* w, int N, int C, int OC,
                             bool accumulate) override;
  void linear_backward_weight(float* dw, float* db, ConstAct dy, ConstAct x, int N, int C, int OC,
                              bool accumulate) override;
  void gelu_backward(float* dpre, const float* dy, ConstAct dgelu, size_t n) override;
  void layernorm_forward(Act y, float* mean, float* rstd, const float* x, const float* w, const float* b, int N,
                         int C) override;
  void layernorm_backward_input(float* dx, const float* dy, const float* x, const float* mean, const float* rstd,
                                const float* w, int N, int C, bool accumulate) override;
  void layernorm_backward_weight(float* dw, float* db, const float* dy, const float* x, const float* mean,
                                 const float* rstd, int N, int C, bool accumulate) override;
  void embedding_forward(float* x, const int32_t* tok, const float* wte, const float* wpe, int B, int T,
                         int C) override;
  void embedding_backward(float* dwte, float* dwpe, const float* dx, const int32_t* tok, int B, int T, int C, int V,
                          bool accumulate_wte, bool accumulate_wpe) override;
  void rmsnorm_forward(Act y, float* rstd, ConstAct x, const float* w, int N, int C, float eps) override;
  void rmsnorm_backward_input(Act dx, const float* dy, ConstAct x, const float* rstd, const float* w, int N,
                              int C, bool accumulate) override;
  void rmsnorm_backward_weight(float* dw, const float* dy, ConstAct x, const float* rstd, int N, int C,
                               bool accumulate) override;
  void rope(float* x, int B, int T, int H, int D, float theta, bool inverse) override;
  void gqa_attention_forward(float* y, float* lse, ConstAct q, ConstAct k, ConstAct v, int B, int T,
                             int H, int KV, int D, HeadRows rows = {}) override;
  void gqa_attention_backward(float* dq, float* dk, float* dv, const float* dy, ConstAct q, ConstAct k,
                              ConstAct v, ConstAct y, const float* lse, float* scratch, int B, int T, int H,
                              int KV, int D, HeadRows rows = {}) override;
  size_t gqa_attention_scratch_floats(int B, int T, int H, int KV, int D) const override;
  void swiglu_forward(Act a, ConstAct g, ConstAct u, size_t n) override;
  void swiglu_backward(Act dg, Act du, const float* da, ConstAct g, ConstAct u, size_t n) override;
  void token_embedding_forward(float* x, const int32_t* tok, const float* w, int N, int C) override;
  void token_embedding_backward(float* dw, const float* dx, const int32_t* tok, int N, int C, int V,
                                bool accumulate) override;
  void softmax_xent_forward(float* probs, double* loss_sum, const float* logits, const int32_t* targets, int N, int V,
                            float scale) override;
  void softmax_xent_backward(float* dlogits, const float* probs, const int32_t* targets, int N, int V,
                             float scale) override;
  void vocab_xent_stats(float* stats, const float* logits, const int32_t* targets, int N, int Vl, int v0) override;
  void vocab_xent_finish(float* probs, double* loss_sum, const float* logits, const float* all, const int32_t* targets,
                         int N, int Vl, int ranks, float scale) override;
  void vocab_xent_backward(float* dlogits, const float* probs, const int32_t* targets, int N, int Vl, int v0,
                           float scale) override;
  void vocab_embedding_forward(float* x, const int32_t* tok, const float* w, int N, int C, int v0, int Vl) override;
  void vocab_embedding_backward(float* dw, const float* dx, const int32_t* tok, int N, int C, int v0, int Vl,
                                bool accumulate) override;
  void add(float* y, const float* a, const float* b, size_t n) override;
  void accumulate(float* y, const float* x, size_t n) override;
  void fill(float* y, float value, size_t n) override;
  void linear_forward_to_bf16(uint16_t* y, ConstAct x, const float* w, const float* b, int N, int C, int OC,
                              float* room) override;
  void to_bf16_with_column_sums(uint16_t* dst, float* sums, const float* src, int N, int C) override;
  void gelu_backward_to_bf16(uint16_t* dpre, float* sums, const float* dy, ConstAct dgelu, int N, int C) override;
  void to_bf16(uint16_t* dst, const float* src, size_t n) override;
  void from_bf16(float* dst, const uint16_t* src, size_t n) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void sum_squares(double* acc, const float* x, size_t n) override;
  void adamw(float* param, const float* grad, float* m, float* v, size_t n, const AdamWArgs& args) override;
  void gather_rows(Act dst, const float* src, const int32_t* rows, const float* scale, int m, int C) override;
  void combine_rows(float* dst, ConstAct src, const int32_t* pos, const float* w, int n, int K, int C,
                    bool accumulate) override;
  void rows_dot(float* out, const float* a, ConstAct b, const int32_t* pos, int n, int K, int C) override;
  void moe_route(float* probs, int32_t* selected, float* weight, const float* logits, const float* bias, int n, int E,
                 int K, bool norm_topk) override;
  void moe_assign(int32_t* position, int32_t* counts, int32_t* token, float* token_weight, float* fraction,
                  double* stats, const int32_t* selected, const float* weight, int n, int T, int E, int K, int capacity,
                  int A) override;
  void moe_balance_loss(double* loss, const float* fraction, const float* probs, int n, int T, int E,
                        double scale) override;
  void moe_router_backward(float* dlogits, const float* probs, const int32_t* selected, const float* weight,
                           const float* fraction, const float* dweight, int n, int T, int E, int K, bool norm_topk,
                           double balance_scale) override;
  void upload(void* dst, const void* host_src, size_t bytes) override;
  bool buffers_on_host() const override { return true; }
  void download(void* host_dst, const void* src, size_t bytes) override;

 private:
  // C(M,N) = op(A)(M,K) · op(B)(K,N) + beta · C of a linear layer, in the matmul precision (bf16 operands only in
  // bf16).
  void gemm(bool trans_a, bool trans_b, int M, int N, int K, ConstAct A, int lda, ConstAct B, int ldb, float beta,
            float* C, int ldc);
  void weight_gemm(bool trans_w, int M, int N, int K, ConstAct A, const float* w, int rows, int cols, float beta,
                   float* C, const float* bias = nullptr);
  // sums(C) (+)= Σ_rows x(N,C) in row order; rounded(N,C) = x in bf16 where given (one pass).
  void column_sums(float* sums, const float* x, int N, int C, bool accumulate, uint16_t* rounded);

  int threads_;
  Precision matmul_ = Precision::Fp32;
};

// How sgemm_parallel divides C(M,N) = op(A)(M,K) · op(B)(K,N) among threads: blocks of C's rows, of its
// columns, or slices of K whose partial products are then added in a fixed order.
enum class GemmSplit { Rows, Cols, K };
GemmSplit choose_gemm_split(int M, int N, int K, int threads);

// C(M,N) = alpha · op(A)(M,K) · op(B)(K,N) + beta · C, row-major, split over the calling rank's threads.
void sgemm_parallel(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                    const float* B, int ldb, float beta, float* C, int ldc, int threads);

}  // namespace piper
