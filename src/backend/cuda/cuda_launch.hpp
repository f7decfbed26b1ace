// Host-side launchers of the CUDA backend's own kernels (the .cu files), called by CudaKernels.
// Every launcher enqueues on `s` and returns at once; shapes are row-major, as in kernels.hpp.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/kernels.hpp"

namespace piper::cuda {

// ---- linear_kernels.cu ----
// y(N,OC) = b broadcast over rows
void bias_fill(float* y, const float* b, int N, int OC, cudaStream_t s);
// p = pre(N,OC) + b (b may be null); y = gelu_tanh(p) and dgelu(N,OC) = gelu_tanh'(p), each at its width. pre may
// be y's or dgelu's fp32 values (read before they are written).
void bias_gelu(Act dgelu, Act y, const float* pre, const float* b, int N, int OC, cudaStream_t s);
// dpre(n) = dy(n) * dgelu(n) (fp32, or bf16 widened); dpre may alias dy
void gelu_backward(float* dpre, const float* dy, ConstAct dgelu, size_t n, cudaStream_t s);
// dst(rows,cols) packed bf16 (as uint16 bits) = src(rows,cols) with leading dimension ld, rounded to nearest even
// (util/precision.hpp's bf16_bits, to the bit): a bf16 matmul's operand
void to_bf16(uint16_t* dst, const float* src, int rows, int cols, int ld, cudaStream_t s);
// dst(n) = src(n) rounded so (contiguous), and back: a bf16 run's stash as stored
void to_bf16(uint16_t* dst, const float* src, size_t n, cudaStream_t s);
void from_bf16(float* dst, const uint16_t* src, size_t n, cudaStream_t s);

// Column sums over rows are done in two deterministic stages: partial sums of row chunks, then the sum
// of the chunks in fixed order. column_chunks(N) chunks of C floats make one partial buffer.
inline int column_chunks(int N) {
  int chunks = (N + 63) / 64;
  return chunks < 1 ? 1 : (chunks > 128 ? 128 : chunks);
}
// sum(C) (+)= Σ_rows x(N,C); partial: column_chunks(N)·C floats
void column_sums(float* sum, const float* x, int N, int C, bool accumulate, float* partial, cudaStream_t s);
// out(C) (+)= Σ_chunks partial(chunks,C), in chunk order
void column_finish(float* out, const float* partial, int chunks, int C, bool accumulate, cudaStream_t s);

// ---- norm_kernels.cu ----
void layernorm_forward(Act y, float* mean, float* rstd, const float* x, const float* w, const float* b, int N,
                       int C, cudaStream_t s);
void layernorm_backward_input(float* dx, const float* dy, const float* x, const float* mean, const float* rstd,
                              const float* w, int N, int C, bool accumulate, cudaStream_t s);
// dw(C), db(C) (+)= Σ_rows dy·xhat, Σ_rows dy; partial: 2·column_chunks(N)·C floats
void layernorm_backward_weight(float* dw, float* db, const float* dy, const float* x, const float* mean,
                               const float* rstd, int N, int C, bool accumulate, float* partial, cudaStream_t s);
void add(float* y, const float* a, const float* b, size_t n, cudaStream_t s);
void accumulate(float* y, const float* x, size_t n, cudaStream_t s);
void fill(float* y, float value, size_t n, cudaStream_t s);

// ---- rmsnorm_rope_swiglu_kernels.cu ----
// y(N,C) = x * rstd * w, rstd(N) = 1 / sqrt(mean x² + eps); one block per row
void rmsnorm_forward(Act y, float* rstd, ConstAct x, const float* w, int N, int C, float eps, cudaStream_t s);
// dx(N,C) (+)= rstd (dy·w − x rstd² Σ_c dy·w·x / C); one block per row
void rmsnorm_backward_input(Act dx, const float* dy, ConstAct x, const float* rstd, const float* w, int N,
                            int C, bool accumulate, cudaStream_t s);
// dw(C) (+)= Σ_rows dy·x·rstd, deterministic column sums; partial: column_chunks(N)·C floats
void rmsnorm_backward_weight(float* dw, const float* dy, ConstAct x, const float* rstd, int N, int C,
                             bool accumulate, float* partial, cudaStream_t s);
// Rotate-half rotary embedding in place on x(B,T,H,D); inverse rotates by the negative angle. First builds
// the cos and sin tables (T,D/2) each in `table` (rope_table_floats(T, D) floats), then rotates from them.
inline size_t rope_table_floats(int T, int D) { return 2 * size_t(T > 0 ? T : 0) * size_t(D > 1 ? D / 2 : 0); }
void rope(float* x, int B, int T, int H, int D, float theta, bool inverse, float* table, cudaStream_t s);
// a(n) = silu(g) * u (g and u fp32, or both bf16 widened)
void swiglu_forward(Act a, ConstAct g, ConstAct u, size_t n, cudaStream_t s);
// dg(n) = da * u * silu'(g), du(n) = da * silu(g)
void swiglu_backward(Act dg, Act du, const float* da, ConstAct g, ConstAct u, size_t n, cudaStream_t s);

// ---- gqa_attention_kernels.cu ----
// Causal grouped-query attention: q(B,T,H,D), k, v(B,T,KV,D) → y(B,T,H,D), lse(B,H,T). D ≤ 256. Rows of q (and
// dq) are qs elements apart, of k and v (and dk, dv) ks apart (Kernels' HeadRows, resolved); y and dy are packed.
void gqa_attention_forward(float* y, float* lse, const float* q, const float* k, const float* v, int B, int T, int H,
                           int KV, int D, int64_t qs, int64_t ks, cudaStream_t s);
// dq(B,T,H,D), dk, dv(B,T,KV,D) written from dy(B,T,H,D); drow: B·H·T floats of scratch (dy·y per query row)
void gqa_attention_backward(float* dq, float* dk, float* dv, const float* dy, const float* q, const float* k,
                            const float* v, ConstAct y, const float* lse, float* drow, int B, int T, int H,
                            int KV, int D, int64_t qs, int64_t ks, cudaStream_t s);
// drow(B,H,T) = dy · y of every query row (fp32): the first step of either backward
void gqa_attention_drow(float* drow, const float* dy, ConstAct y, int B, int T, int H, int D, cudaStream_t s);

// ---- gqa_attention_bf16_kernels.cu: the same in bf16 matmul precision (Kernels::set_matmul_precision) ----
// Whether the tensor-core kernels take head dimension D: D ≤ 128 (padded with zeros to a multiple of 16 in shared
// memory, which adds exact zeros to every sum).
bool gqa_attention_bf16_supported(int D);
// As gqa_attention_forward with every product on bf16 operands (wmma, fp32 accumulators): S = q·kᵀ of rounded q, k;
// the fp32 online softmax's exp(s − running max) rounded for P·v with v rounded. D: gqa_attention_bf16_supported.
// q, k, v: fp32 (rounded as they are loaded) or bf16 activations (loaded as they are), all three at one width.
void gqa_attention_forward_bf16(float* y, float* lse, ConstAct q, ConstAct k, ConstAct v, int B, int T,
                                int H, int KV, int D, int64_t qs, int64_t ks, cudaStream_t s);
// As gqa_attention_backward with q, k, v, dy and the recomputed P and dS rounded as the products' operands; dk, dv
// without atomics (deterministic). drow: B·H·T floats of scratch.
void gqa_attention_backward_bf16(float* dq, float* dk, float* dv, const float* dy, ConstAct q, ConstAct k,
                                 ConstAct v, ConstAct y, const float* lse, float* drow, int B, int T, int H,
                                 int KV, int D, int64_t qs, int64_t ks, cudaStream_t s);
// dst(n) = src rounded to bf16 (nearest, ties to even), kept as fp32; dst may be src
void round_bf16(float* dst, const float* src, size_t n, cudaStream_t s);

// ---- embed_loss_optim_kernels.cu ----
void embedding_forward(float* x, const int32_t* tok, const float* wte, const float* wpe, int B, int T, int C,
                       cudaStream_t s);
// dwte(V,C) as token_embedding_backward (workspace: token_embedding_backward_workspace_bytes(B·T) bytes);
// dwpe(T,C) (+)= Σ_b dx, b in order
void embedding_backward(float* dwte, float* dwpe, const float* dx, const int32_t* tok, int B, int T, int C, int V,
                        bool accumulate_wte, bool accumulate_wpe, void* workspace, cudaStream_t s);
// x(N,C): row n = w[tok[n] − v0] (rows of w(Vl,C)) where v0 <= tok[n] < v0 + Vl, else 0. Kernels::
// token_embedding_forward is its one shard with every token (v0 = 0, Vl = INT_MAX).
void vocab_embedding_forward(float* x, const int32_t* tok, const float* w, int N, int C, int v0, int Vl,
                             cudaStream_t s);
// dw(Vl,C) (+)= scatter-add of the dx(N,C) rows whose token is in [v0, v0 + Vl), to row tok − v0: the rows sorted
// by token (cub radix sort), then each token's rows summed in increasing row order (deterministic); rows of tokens
// not seen are zeroed unless accumulating. Kernels::token_embedding_backward is its one shard (v0 = 0, Vl = V).
// workspace: token_embedding_backward_workspace_bytes(N) bytes.
size_t token_embedding_backward_workspace_bytes(int N);
void vocab_embedding_backward(float* dw, const float* dx, const int32_t* tok, int N, int C, int v0, int Vl,
                              bool accumulate, void* workspace, cudaStream_t s);
// *acc += scale · Σ values(n): one block, a fixed order (the row losses of a cross-entropy)
void add_scaled_sum(double* acc, const double* values, int64_t n, double scale, cudaStream_t s);
// probs(N,V) = softmax(logits) (may alias); row_loss(N) = -log probs[target]; *loss_sum += scale·Σ row_loss.
void softmax_xent_forward(float* probs, double* loss_sum, const float* logits, const int32_t* targets, int N, int V,
                          float scale, double* row_loss, cudaStream_t s);
// *acc += Σ x²; partial: sum_squares_partials(n) doubles
size_t sum_squares_partials(size_t n);
void sum_squares(double* acc, const float* x, size_t n, double* partial, cudaStream_t s);
void adamw(float* param, const float* grad, float* m, float* v, size_t n, const AdamWArgs& args, cudaStream_t s);

// ---- moe_rows_kernels.cu ----
// dst(m,C) = scale[i] · src[rows[i]] (scale may be null; rows[i] < 0: zeros), at dst's width; one block per
// output row
void gather_rows(Act dst, const float* src, const int32_t* rows, const float* scale, int m, int C, cudaStream_t s);
// dst(n,C) (+)= Σ_k w[t,k] · src[pos[t,k]] over pos >= 0, k in order, one fma per term (w may be null; src fp32 or
// bf16, widened); one block per token row
void combine_rows(float* dst, ConstAct src, const int32_t* pos, const float* w, int n, int K, int C, bool accumulate,
                  cudaStream_t s);
// out(n,K) = a[t] · b[pos[t,k]] (0 where pos < 0; b fp32 or bf16, widened); one warp per (t,k), double sums in a
// fixed order
void rows_dot(float* out, const float* a, ConstAct b, const int32_t* pos, int n, int K, int C, cudaStream_t s);

// ---- vocab_xent_kernels.cu ----
// As Kernels::vocab_xent_stats: one block per row
void vocab_xent_stats(float* stats, const float* logits, const int32_t* targets, int N, int Vl, int v0,
                      cudaStream_t s);
// As Kernels::vocab_xent_finish: one block per row, then the row losses (row_loss: N doubles) in a fixed order
void vocab_xent_finish(float* probs, double* loss_sum, const float* logits, const float* all, const int32_t* targets,
                       int N, int Vl, int ranks, float scale, double* row_loss, cudaStream_t s);
// As Kernels::vocab_xent_backward (softmax_xent_backward is its one-shard case, v0 = 0)
void vocab_xent_backward(float* dlogits, const float* probs, const int32_t* targets, int N, int Vl, int v0,
                         float scale, cudaStream_t s);

// ---- moe_routing_kernels.cu ----
// As Kernels::moe_route: one thread per token
void moe_route(float* probs, int32_t* selected, float* weight, const float* logits, const float* bias, int n, int E,
               int K, bool norm_topk, cudaStream_t s);
// As Kernels::moe_assign: counted per (sequence, expert), totals in one block, then each kept assignment placed
void moe_assign(int32_t* position, int32_t* counts, int32_t* token, float* token_weight, float* fraction,
                double* stats, const int32_t* selected, const float* weight, int n, int T, int E, int K, int capacity,
                int A, cudaStream_t s);
// As Kernels::moe_balance_loss: one block, a fixed order
void moe_balance_loss(double* loss, const float* fraction, const float* probs, int n, int T, int E, double scale,
                      cudaStream_t s);
// As Kernels::moe_router_backward: one thread per token
void moe_router_backward(float* dlogits, const float* probs, const int32_t* selected, const float* weight,
                         const float* fraction, const float* dweight, int n, int T, int E, int K, bool norm_topk,
                         double balance_scale, cudaStream_t s);

}  // namespace piper::cuda
