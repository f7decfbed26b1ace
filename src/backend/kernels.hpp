// The compute primitives a backend provides, from which the model segments (src/model) are composed: fp32 buffers,
// and bf16 activations where a bf16 run holds them. Every pointer is device memory of the backend; shapes row-major.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstdint>
#include <string>

#include "util/error.hpp"
#include "util/precision.hpp"

namespace piper {

struct AdamWArgs {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0;
  float grad_scale = 1;  // gradient clipping coefficient, applied before the moments
  int64_t step = 1;      // 1-based step for bias correction
};

// An activation at the width a segment holds it: fp32, or bf16 bits (util/precision.hpp's rounding) where a bf16 run
// holds a tensor that only matmuls read (they round their operands to bf16 anyway, so the products see the same
// bits either way). The kernels that take one write or read it at its width; fp32 pointers convert to it. A bf16
// activation is only for a backend in bf16 matmul precision (set_matmul_precision).
struct Act {
  void* p = nullptr;
  bool bf16 = false;
  Act() = default;
  Act(float* values) : p(values) {}  // NOLINT: fp32 pointers are fp32 activations
  Act(void* data, bool is_bf16) : p(data), bf16(is_bf16) {}
  float* f32() const { return static_cast<float*>(p); }
  uint16_t* bits() const { return static_cast<uint16_t*>(p); }
  Act at(int64_t elements) const {  // the activation from element `elements` on, at its width
    return {static_cast<char*>(p) + elements * (bf16 ? 2 : 4), bf16};
  }
};
struct ConstAct {
  const void* p = nullptr;
  bool bf16 = false;
  ConstAct(const float* values) : p(values) {}   // NOLINT
  ConstAct(const Act& a) : p(a.p), bf16(a.bf16) {}  // NOLINT
  ConstAct(const void* data, bool is_bf16) : p(data), bf16(is_bf16) {}
  const float* f32() const { return static_cast<const float*>(p); }
  const uint16_t* bits() const { return static_cast<const uint16_t*>(p); }
  ConstAct at(int64_t elements) const {  // the activation from element `elements` on, at its width
    return {static_cast<const char*>(p) + elements * (bf16 ? 2 : 4), bf16};
  }
};

// Where an attention's rows lie: elements between the rows of consecutive positions of q and dq (`q`) and of k, v,
// dk and dv (`kv`); y and dy are packed (H·D). 0, the default: packed too, H·D and KV·D. GPT-2's fused qkv(B,T,3C),
// with k at +C and v at +2C: {3C, 3C}.
struct HeadRows {
  int64_t q = 0, kv = 0;
  HeadRows resolved(int H, int KV, int D) const { return {q ? q : int64_t(H) * D, kv ? kv : int64_t(KV) * D}; }
};

// One product of a grouped linear call (Kernels::linear_*_grouped): the operands of the matching linear_* call,
// without bias. forward: out = y(N,OC), a = x(N,C), b = w(OC,C). backward_input: out = dx(N,C), a = dy(N,OC),
// b = w(OC,C). backward_weight: out = dw(OC,C), a = dy(N,OC), b = x(N,C). The activations among them (a; b of
// backward_weight) may be bf16 where the matching call takes one; weights are fp32.
struct LinearGroup {
  float* out = nullptr;
  ConstAct a = ConstAct(nullptr, false);
  ConstAct b = ConstAct(nullptr, false);
  int N = 0, C = 0, OC = 0;
  bool accumulate = false;  // backward calls: add into out; forward always writes out
  // b as the weight of a forward or backward_input product (fp32)
  const float* weight() const {
    PIPER_CHECK(!b.bf16, "a grouped linear product with a bf16 weight");
    return b.f32();
  }
};

class Kernels {
 public:
  virtual ~Kernels() = default;

  // The calls that follow on this thread belong to `name` (a model segment): for profilers and tracing
  // tools; backends ignore it.
  virtual void begin_region(const char* name) { (void)name; }

  // How the matmuls of linear layers (linear_* and the grouped calls) and the products inside the attention calls
  // (attention_*, gqa_attention_*: see there) take their operands. Fp32 (the default): as they are. Bf16: both
  // operands rounded to bf16 (nearest, ties to even) and multiplied with fp32 accumulation into the fp32 output, as
  // a bf16 mixed-precision run's matmuls; everything else stays fp32. Set before the first call.
  virtual void set_matmul_precision(Precision p) = 0;
  // How this backend runs bf16 matmuls, in words (the library, the instructions): printed at start.
  virtual std::string bf16_matmul_path() const = 0;
  // From keep_weights(true) to keep_weights(false), on the calling thread, the weight operands of linear_forward and
  // linear_backward_input (w) stay as they are: a backend may round each once and reuse it (a pass run by pieces of
  // its samples). Its results do not change.
  virtual void keep_weights(bool on) { (void)on; }

  // y(N,OC) = x(N,C) · w(OC,C)^T + b(OC); b may be null. x may be a bf16 activation.
  virtual void linear_forward(float* y, ConstAct x, const float* w, const float* b, int N, int C, int OC) = 0;
  // y(N,OC) = gelu_tanh(x · w^T + b); dgelu(N,OC) = gelu_tanh'(x · w^T + b), kept for the backward.
  // Fused: one pass after the matmul computes both from one tanh. x, y and dgelu may be bf16 activations (each value
  // computed in fp32, then rounded); where y and dgelu both are, the product goes to `room`, (N,OC) fp32 (else
  // unused).
  virtual void linear_gelu_forward(Act dgelu, Act y, ConstAct x, const float* w, const float* b, int N, int C,
                                   int OC, float* room = nullptr) = 0;
  // dx(N,C) (+)= dy(N,OC) · w(OC,C); dy may be a bf16 activation.
  // y(N,OC) = linear_forward's values rounded to bf16, to to_bf16's bits; room (N,OC) fp32 is the backend's to use
  // (this default: linear_forward into room, then to_bf16; a backend may write the rounded values directly).
  virtual void linear_forward_to_bf16(uint16_t* y, ConstAct x, const float* w, const float* b, int N, int C, int OC,
                                      float* room) {
    linear_forward(room, x, w, b, N, C, OC);
    to_bf16(y, room, size_t(N) * size_t(OC));
  }
  virtual void linear_backward_input(float* dx, ConstAct dy, const float* w, int N, int C, int OC,
                                     bool accumulate) = 0;
  // dw(OC,C) (+)= dy^T · x(N,C); db(OC) (+)= Σ_rows dy; db may be null. x may be a bf16 activation, and so may dy
  // where db is null.
  virtual void linear_backward_weight(float* dw, float* db, ConstAct dy, ConstAct x, int N, int C, int OC,
                                      bool accumulate) = 0;
  // dst(N,C) = src rounded to bf16 (as to_bf16), and sums(C) = Σ_rows src summed as linear_backward_weight sums its
  // db (its bits, on each backend): a gradient that products read in bf16, with its bias gradient from fp32.
  virtual void to_bf16_with_column_sums(uint16_t* dst, float* sums, const float* src, int N, int C) = 0;
  // dpre(N,C) = dy(N,C) ⊙ dgelu rounded to bf16, and sums(C) = Σ_rows of those products in fp32: gelu_backward, then
  // to_bf16_with_column_sums of its output, to their bits, without writing the fp32 products.
  virtual void gelu_backward_to_bf16(uint16_t* dpre, float* sums, const float* dy, ConstAct dgelu, int N, int C) = 0;
  // Many independent products in one call (the experts of a mixture of experts): the same as one
  // linear_forward / linear_backward_input / linear_backward_weight call per group, in list order. Groups that
  // write the same output name the same matrix and run in list order; other outputs do not overlap, and no group
  // reads another's output. A backend may run each call as one grouped matmul; these defaults loop.
  virtual void linear_forward_grouped(const LinearGroup* groups, int count) {
    for (int i = 0; i < count; ++i) {
      const LinearGroup& g = groups[i];
      linear_forward(g.out, g.a, g.weight(), nullptr, g.N, g.C, g.OC);
    }
  }
  virtual void linear_backward_input_grouped(const LinearGroup* groups, int count) {
    for (int i = 0; i < count; ++i) {
      const LinearGroup& g = groups[i];
      linear_backward_input(g.out, g.a, g.weight(), g.N, g.C, g.OC, g.accumulate);
    }
  }
  virtual void linear_backward_weight_grouped(const LinearGroup* groups, int count) {
    for (int i = 0; i < count; ++i) {
      const LinearGroup& g = groups[i];
      linear_backward_weight(g.out, nullptr, g.a, g.b, g.N, g.C, g.OC, g.accumulate);
    }
  }
  // dpre(n) = dy(n) * dgelu(n), the derivative saved by linear_gelu_forward (fp32, or a bf16 activation widened);
  // dpre may alias dy.
  virtual void gelu_backward(float* dpre, const float* dy, ConstAct dgelu, size_t n) = 0;

  // y(N,C) = (x - mean) * rstd * w + b; mean(N), rstd(N) kept for backward. y may be a bf16 activation (each
  // value computed in fp32, then rounded).
  virtual void layernorm_forward(Act y, float* mean, float* rstd, const float* x, const float* w, const float* b,
                                 int N, int C) = 0;
  // dx(N,C) (+)= d/dx of layernorm given dy(N,C)
  virtual void layernorm_backward_input(float* dx, const float* dy, const float* x, const float* mean,
                                        const float* rstd, const float* w, int N, int C, bool accumulate) = 0;
  // dw(C), db(C) (+)= Σ_rows dy * xhat, Σ_rows dy
  virtual void layernorm_backward_weight(float* dw, float* db, const float* dy, const float* x, const float* mean,
                                         const float* rstd, int N, int C, bool accumulate) = 0;

  // x(B,T,C) = wte[tok] + wpe[t]; tok(B,T).
  virtual void embedding_forward(float* x, const int32_t* tok, const float* wte, const float* wpe, int B, int T,
                                 int C) = 0;
  // dwte(V,C) (+)= scatter of dx rows by token; dwpe(T,C) (+)= Σ_b dx. Each gradient has its own flag.
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dx, const int32_t* tok, int B, int T, int C,
                                  int V, bool accumulate_wte, bool accumulate_wpe) = 0;

  // ---- RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, token embedding ----
  // y(N,C) = x * rstd * w with rstd(N) = 1 / sqrt(mean_c x² + eps), kept for the backward. y may not alias x; it
  // may be a bf16 activation (each value computed in fp32, then rounded). x may be a bf16 activation (read widened),
  // in the three calls.
  virtual void rmsnorm_forward(Act y, float* rstd, ConstAct x, const float* w, int N, int C, float eps) = 0;
  // dx(N,C) (+)= d/dx of rmsnorm given dy(N,C); dx may be a bf16 activation where it is written (not accumulated).
  virtual void rmsnorm_backward_input(Act dx, const float* dy, ConstAct x, const float* rstd, const float* w, int N,
                                      int C, bool accumulate) = 0;
  // dw(C) (+)= Σ_rows dy * x * rstd
  virtual void rmsnorm_backward_weight(float* dw, const float* dy, ConstAct x, const float* rstd, int N, int C,
                                       bool accumulate) = 0;
  // Rotary position embedding in place on x(B,T,H,D), rotate-half convention (Hugging Face Llama/Qwen): for
  // position t and i < D/2, angle a = t · inv_freq_i with inv_freq_i = 1 / theta^(2i/D) (computed in float as
  // torch does), (x_i, x_{i+D/2}) → (x_i cos a − x_{i+D/2} sin a, x_{i+D/2} cos a + x_i sin a).
  // inverse = true rotates by −a: the backward (transpose) of the forward.
  virtual void rope(float* x, int B, int T, int H, int D, float theta, bool inverse) = 0;
  // The attention calls in bf16 matmul precision (set_matmul_precision): every product inside them takes
  // bf16-rounded operands and accumulates in fp32. Forward: S = Q·Kᵀ (Q, K rounded; the scale applied to the fp32
  // sums), Y = P·V (P and V rounded). Backward: dP = dY·Vᵀ, dV = Pᵀ·dY, dQ = dS·K, dK = dSᵀ·Q (every operand
  // rounded; scale as in the forward). The softmax, its statistics (max, sum, lse, and Σ_j P·dP, taken as dy·y from
  // the unrounded dy and the forward's y), dS = P ⊙ (dP − Σ_j P·dP) before its rounding, and every output stay
  // fp32. Where P is rounded may differ: after the normalisation (CPU) or, in a flash kernel, exp(s − running max)
  // before the division by the sum (CUDA, head dimensions up to 128; above, the fp32 kernels on rounded q, k, v,
  // dy, which leave P and dS unrounded). The scratch sizes do not depend on the precision. In fp32 nothing changes.
  // There q, k and v may be bf16 activations (all three at one width): the products read them as they are, the
  // same bits as rounding them in the call.
  //
  // Causal grouped-query attention scaled by D^-1/2: q(B,T,H,D), k(B,T,KV,D), v(B,T,KV,D) → y(B,T,H,D);
  // query head h reads key/value head h / (H/KV). lse(B,H,T) = log Σ_j exp(score) of each query row, for the
  // backward. Never holds more than one (rows × T) tile of scores per (sequence, head) at a time; skips the
  // masked (upper) half of the work. Multi-head attention is the case KV = H; q, k and v may be views of one fused
  // buffer (rows: HeadRows).
  virtual void gqa_attention_forward(float* y, float* lse, ConstAct q, ConstAct k, ConstAct v, int B, int T, int H,
                                     int KV, int D, HeadRows rows = {}) = 0;
  // dq(B,T,H,D), dk(B,T,KV,D), dv(B,T,KV,D) written (not accumulated) from dy(B,T,H,D); probabilities are
  // recomputed from q, k and lse; y is the forward output (a bf16 activation where it was rounded into one).
  // dq, dk and dv have the row strides of q, k and v. scratch: gqa_attention_scratch_floats(...) floats.
  virtual void gqa_attention_backward(float* dq, float* dk, float* dv, const float* dy, ConstAct q, ConstAct k,
                                      ConstAct v, ConstAct y, const float* lse, float* scratch, int B, int T, int H,
                                      int KV, int D, HeadRows rows = {}) = 0;
  virtual size_t gqa_attention_scratch_floats(int B, int T, int H, int KV, int D) const = 0;
  // a(n) = silu(g) * u, silu(x) = x / (1 + e^-x); a may be a bf16 activation (computed in fp32, then rounded), and
  // g and u bf16 activations (both or neither; widened).
  virtual void swiglu_forward(Act a, ConstAct g, ConstAct u, size_t n) = 0;
  // dg(n) = da * u * silu'(g), du(n) = da * silu(g); no aliasing between outputs and inputs. dg and du may be bf16
  // activations (both or neither; computed in fp32, then rounded), and g and u (both or neither; widened).
  virtual void swiglu_backward(Act dg, Act du, const float* da, ConstAct g, ConstAct u, size_t n) = 0;
  // x(N,C) = w[tok] (rows of w(V,C)). The one shard that holds every token of vocab_embedding_forward (v0 = 0,
  // Vl = INT_MAX, as V is not an argument): backends delegate, so the bits are that kernel's.
  virtual void token_embedding_forward(float* x, const int32_t* tok, const float* w, int N, int C) = 0;
  // dw(V,C) (+)= scatter-add of dx(N,C) rows by token (repeated tokens sum); accumulate=false zeroes dw first.
  // The one shard of vocab_embedding_backward (v0 = 0, Vl = V): backends delegate, so the bits are that kernel's.
  virtual void token_embedding_backward(float* dw, const float* dx, const int32_t* tok, int N, int C, int V,
                                        bool accumulate) = 0;

  // probs(N,V) = softmax(logits); *loss_sum += scale * Σ_rows -log probs[target]. loss_sum is device memory.
  // probs may alias logits (in place).
  virtual void softmax_xent_forward(float* probs, double* loss_sum, const float* logits, const int32_t* targets,
                                    int N, int V, float scale) = 0;
  // dlogits(N,V) = scale * (probs - onehot(targets)); dlogits may alias probs.
  virtual void softmax_xent_backward(float* dlogits, const float* probs, const int32_t* targets, int N, int V,
                                     float scale) = 0;

  // ---- vocabulary-parallel cross-entropy: each of `ranks` ranks holds logits(N,Vl) of vocabulary [v0, v0 + Vl) ----
  // stats(N,3), per row of this rank's shard: its largest logit m, Σ exp(logit − m), and the target's logit where
  // the target is in the shard (else 0). The ranks then gather every rank's stats (an all-gather).
  virtual void vocab_xent_stats(float* stats, const float* logits, const int32_t* targets, int N, int Vl, int v0) = 0;
  // From all(ranks,N,3), every rank's stats: M = max_r m_r, S = Σ_r s_r · exp(m_r − M); probs(N,Vl) = exp(logit − M)
  // / S, the shard's part of the softmax over the whole vocabulary (probs may alias logits); *loss_sum += scale ·
  // Σ_rows (log S + M − target logit). Every rank adds the whole loss. With one rank: softmax_xent_forward.
  virtual void vocab_xent_finish(float* probs, double* loss_sum, const float* logits, const float* all,
                                 const int32_t* targets, int N, int Vl, int ranks, float scale) = 0;
  // dlogits(N,Vl) = scale · (probs − onehot(target − v0)), the one-hot only where the target is in the shard;
  // dlogits may alias probs.
  virtual void vocab_xent_backward(float* dlogits, const float* probs, const int32_t* targets, int N, int Vl, int v0,
                                   float scale) = 0;

  // ---- vocabulary-parallel token embedding: each rank holds w(Vl,C), the embedding rows of vocabulary
  // [v0, v0 + Vl) ----
  // x(N,C): row n = w[tok[n] − v0] where v0 <= tok[n] < v0 + Vl, else a row of zeros; the ranks' x summed (an
  // all-reduce) is the whole vocabulary's token_embedding_forward, to the bit.
  virtual void vocab_embedding_forward(float* x, const int32_t* tok, const float* w, int N, int C, int v0,
                                       int Vl) = 0;
  // dw(Vl,C) (+)= scatter-add of the dx(N,C) rows whose token is in [v0, v0 + Vl), into row tok − v0, each row of
  // dw summed from its prior (or 0) over its dx rows in increasing row order (deterministic: the shards' dw
  // stacked are token_embedding_backward's, to the bit); accumulate=false zeroes dw first.
  virtual void vocab_embedding_backward(float* dw, const float* dx, const int32_t* tok, int N, int C, int v0, int Vl,
                                        bool accumulate) = 0;

  // y(n) = a + b
  virtual void add(float* y, const float* a, const float* b, size_t n) = 0;
  // y(n) += x
  virtual void accumulate(float* y, const float* x, size_t n) = 0;
  virtual void fill(float* y, float value, size_t n) = 0;
  // dst(n) = src rounded to bf16, nearest with ties to even (util/precision.hpp's bf16_bits, to the bit): a bf16
  // run's stash as stored; and back, exactly.
  virtual void to_bf16(uint16_t* dst, const float* src, size_t n) = 0;
  virtual void from_bf16(float* dst, const uint16_t* src, size_t n) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // *acc += Σ x² (acc is device memory)
  virtual void sum_squares(double* acc, const float* x, size_t n) = 0;
  // AdamW with decoupled weight decay on n elements.
  virtual void adamw(float* param, const float* grad, float* m, float* v, size_t n, const AdamWArgs& args) = 0;

  // ---- mixture of experts: token rows to and from the experts ----
  // dst(m,C) = scale[i] · src[rows[i]] for i < m; scale may be null (1). rows(m) int32, device memory; a row
  // index of -1 writes a row of zeros (the unused end of a routing's worst-case rows).
  // dst may be a bf16 activation: each value (scaled) rounded as it is stored.
  virtual void gather_rows(Act dst, const float* src, const int32_t* rows, const float* scale, int m, int C) = 0;
  // dst(n,C) (+)= Σ_k w[t,k] · src[pos[t,k]] over the k < K with pos[t,k] >= 0, in k order; w may be null (1).
  // pos(n,K) int32 and w(n,K) are device memory; a row with no valid pos is 0 (or unchanged when accumulating).
  // src may be a bf16 activation (widened).
  virtual void combine_rows(float* dst, ConstAct src, const int32_t* pos, const float* w, int n, int K, int C,
                            bool accumulate) = 0;
  // out(n,K): out[t,k] = Σ_c a[t,c] · b[pos[t,k],c], 0 where pos[t,k] < 0. a(n,C), b(m,C); b may be a bf16
  // activation (widened).
  virtual void rows_dot(float* out, const float* a, ConstAct b, const int32_t* pos, int n, int K, int C) = 0;

  // ---- mixture of experts: routing, all on the device (n tokens in sequences of T, E experts, top K) ----
  // probs(n,E) = softmax(logits) (probs may alias logits); selected(n,K): the K experts of largest probs + bias,
  // largest first (ties: the lower index); weight(n,K) = their probs, divided by their sum when norm_topk.
  // bias(E) may be null: it chooses the experts only (auxiliary-loss-free balancing), never weighs them.
  virtual void moe_route(float* probs, int32_t* selected, float* weight, const float* logits, const float* bias,
                         int n, int E, int K, bool norm_topk) = 0;
  // Capacity and the expert order of the kept assignments. In each sequence an expert keeps its first `capacity`
  // assignments in token order. position(n,K): the index of each kept assignment in expert order (expert 0's in
  // token order, then expert 1's, ...), -1 when dropped; counts(E): kept assignments per expert;
  // token(A), token_weight(A): the token and weight of each kept assignment in that order, -1 and 0 after the
  // last (A >= kept assignments); fraction(n/T,E) = E/(K·T) · the sequence's assignments to e, dropped or not.
  // stats (E+1 doubles, may be null) += the assignments of each expert, then the dropped ones.
  virtual void moe_assign(int32_t* position, int32_t* counts, int32_t* token, float* token_weight, float* fraction,
                          double* stats, const int32_t* selected, const float* weight, int n, int T, int E, int K,
                          int capacity, int A) = 0;
  // The sequence-wise balance loss: *loss += scale · Σ_sequences Σ_e fraction[q,e] · mean over q's tokens of
  // probs[t,e]. loss is device memory.
  virtual void moe_balance_loss(double* loss, const float* fraction, const float* probs, int n, int T, int E,
                                double scale) = 0;
  // dlogits(n,E): the router's backward from dweight(n,K), the gradient of the combine weights (0 where dropped),
  // through the top-k weights and the softmax, plus balance_scale · d(Σ_q Σ_e fraction · mean_t probs)/dprobs.
  virtual void moe_router_backward(float* dlogits, const float* probs, const int32_t* selected, const float* weight,
                                   const float* fraction, const float* dweight, int n, int T, int E, int K,
                                   bool norm_topk, double balance_scale) = 0;

  // Host ↔ device copies (plain memcpy on CPU).
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;
  // Host memory that copies to and from the device run fastest from (page-locked on CUDA; plain on CPU).
  // Null when it cannot be had; freed with host_free.
  virtual void* host_alloc(size_t bytes) { return std::malloc(bytes); }
  virtual void host_free(void* p) { std::free(p); }
  // Whether buffer memory is host memory that MPI and the host may read and write directly (CPU).
  virtual bool buffers_on_host() const { return false; }
};

}  // namespace piper
