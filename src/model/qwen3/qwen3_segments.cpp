// Qwen3 segment math over backend kernels and the sizes of its buffers. Shapes: b sequences of T tokens,
// n = b·T rows, C d_model, H query heads and KV key/value heads of D = head_dim, QD = H·D, KD = KV·D, F d_ff.
// The attention and MLP halves are tensor-parallel (Megatron): on rank t of k, H, KV and F are this rank's part.
#include "model/qwen3/qwen3_segments.hpp"

#include <algorithm>

#include "model/act_output.hpp"
#include "model/attention_scratch.hpp"
#include "model/product_gradient.hpp"
#include "model/stash_carver.hpp"
#include "model/vocab_shard.hpp"
#include "util/error.hpp"

namespace piper::qwen3 {

namespace {

const size_t f = sizeof(float), i32 = sizeof(int32_t);  // token and target ids are int32

struct Shape {
  int b, T, n, C, H, KV, D, QD, KD, F, V;
  float eps, theta;
  bool qk_norm;
  bool bf16;  // the activations only matmuls read are bf16 (ModelDims::bf16_matmul_inputs)
  // With k_proj and v_proj copied (fewer key/value heads than ranks): the rank reads heads [kv0, kv0 + KV) of the
  // kv_whole heads they hold. kv_whole = 0: it holds its own piece of them.
  int kv0 = 0, kv_whole = 0;
  Shape(const ModelDims& d, int samples)
      : b(samples), T(d.seq_len), n(samples * d.seq_len), C(d.d_model), H(d.n_heads), KV(d.n_kv_heads),
        D(d.head_dim), QD(d.n_heads * d.head_dim), KD(d.n_kv_heads * d.head_dim), F(d.d_ff), V(d.vocab),
        eps(float(d.norm_eps)), theta(float(d.rope_theta)), qk_norm(d.qk_norm), bf16(d.bf16_matmul_inputs) {}
  // Rank `shard` of a tensor-parallel group of `shards` (tp_refusal says they divide): H/k query heads, F/k hidden
  // units, and KV/k key/value heads or, when KV < k, the one head its query heads all read.
  Shape(const ModelDims& d, int samples, int shards, int shard) : Shape(d, samples) {
    if (shards <= 1) return;
    H /= shards, F /= shards;
    if (KV % shards == 0) KV /= shards;
    else kv_whole = KV, kv0 = shard * KV / shards, KV = 1;
    QD = H * D, KD = KV * D;
  }
};

// The embedding and the LM head use their vocabulary rows (model/vocab_shard.hpp): their pieces, or, tied, their
// rows of the one tensor every rank holds whole.

// ---------------------------------------------------------------- embedding: tokens(b,T) → x(n,C)
// Vocabulary-parallel over a tensor-parallel group: a rank's rows for its tokens, zeros for the others (partial).
SegmentSizes embed_sizes(const Segment&, const ModelDims& d, int samples) {
  Shape s(d, samples);
  SegmentSizes z;
  z.out_bytes = size_t(s.n) * s.C * f;
  z.stash_bytes = size_t(s.n) * i32;  // tokens
  return z;
}

void embed_forward(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  Shape s(d, io.samples);
  const Vocab v(d, io.shards, io.shard);
  const float* w = vocab_rows(io.w[kEmbedTokens], d, v, d.tie_embeddings);
  k.vocab_embedding_forward(io.out, static_cast<const int32_t*>(io.stash), w, s.n, s.C, v.v0, v.Vl);  // (n,C)
}

void embed_backward_weight(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  Shape s(d, io.samples);
  const Vocab v(d, io.shards, io.shard);
  const bool acc = io.accumulate(kEmbedTokens);
  k.vocab_embedding_backward(vocab_grad_rows(k, io.g[kEmbedTokens], d, v, acc, d.tie_embeddings), io.dout,
                             static_cast<const int32_t*>(io.stash), s.n, s.C, v.v0, v.Vl, acc);  // (Vl,C)
}

// The embedding by rows (or, tied to the LM head, held whole and used by its rows).
ParamSplit embed_tp_split(const ModelDims& d, int, int k) {
  return d.tie_embeddings ? ParamSplit::copy() : ParamSplit::rows(d.vocab, d.d_model, k);
}

// ---------------------------------------------------------------- attention half: x + o(attn(norm x))
// Forward → backward: the normed input, q and k before their norms (with qk_norm), q and k after norm and
// RoPE, v, the attention output and the log-sum-exp of each query row. Selective recompute keeps the products
// (projections, attention output) and recomputes the normed input and, with qk_norm, q and k from q_pre, k_pre.
struct AttentionStash {
  float *rstd, *q_rstd, *k_rstd, *lse;
  Act h;            // read by matmuls alone
  Act q, k, v;      // read by the attention's products alone
  Act q_pre, k_pre; // the projections before their norms: bf16 as a held stash gives them back
  Act y;            // read by o_proj and by the attention's backward (dy · y): bf16 likewise
  size_t bytes, kept_bytes;
  AttentionStash(StashParts p, const Shape& s) {
    StashCarver c(p);
    rstd = c.keep_exact(s.n);                                                // (n)
    q_pre = s.qk_norm ? c.keep_act(int64_t(s.n) * s.QD, s.bf16) : Act();   // (n,H,D)
    q_rstd = s.qk_norm ? c.keep_exact(int64_t(s.n) * s.H) : nullptr;        // (n,H)
    k_pre = s.qk_norm ? c.keep_act(int64_t(s.n) * s.KD, s.bf16) : Act();   // (n,KV,D)
    k_rstd = s.qk_norm ? c.keep_exact(int64_t(s.n) * s.KV) : nullptr;       // (n,KV)
    v = c.keep_act(int64_t(s.n) * s.KD, s.bf16);                             // (b,T,KV,D)
    y = c.keep_act(int64_t(s.n) * s.QD, s.bf16);                             // (b,T,H,D)
    lse = c.keep_exact(int64_t(s.b) * s.H * s.T);                            // (b,H,T)
    c.tail_act(h, int64_t(s.n) * s.C, s.bf16);                          // (n,C)
    if (s.qk_norm) {  // norm and RoPE of the kept projections
      c.tail_act(q, int64_t(s.n) * s.QD, s.bf16);                       // (b,T,H,D)
      c.tail_act(k, int64_t(s.n) * s.KD, s.bf16);                       // (b,T,KV,D)
    } else {          // the projections themselves, after RoPE
      q = c.keep_act(int64_t(s.n) * s.QD, s.bf16);
      k = c.keep_act(int64_t(s.n) * s.KD, s.bf16);
    }
    c.finish();
    bytes = c.bytes();
    kept_bytes = c.kept_bytes;
  }
};

// Backward-input → backward-weight: gradients of the projections' outputs, of the q/k norms' outputs
// and of the normed input; in a bf16 run the output's gradient rounded.
struct AttentionWStash {
  StashCarver c;
  float *dq, *dk;
  ProductGradient dv;  // (n,KD)
  Act dq_pre, dk_pre;  // with qk_norm: read by matmuls alone
  float* dh;
  ProductGradient dout;  // (n,C): io.dout itself in fp32
  size_t floats;
  AttentionWStash(float* p, const Shape& s)
      : c(p),
        dq(c.keep<float>(int64_t(s.n) * s.QD)),  // d(q after norm, before RoPE) (n,QD)
        dk(c.keep<float>(int64_t(s.n) * s.KD)),  // (n,KD)
        dv(c, s.n, s.KD, s.bf16, true, false),
        dq_pre(s.qk_norm ? c.keep_act(int64_t(s.n) * s.QD, s.bf16) : Act(dq)),  // d(q projection) (n,QD)
        dk_pre(s.qk_norm ? c.keep_act(int64_t(s.n) * s.KD, s.bf16) : Act(dk)),
        dh(c.keep<float>(int64_t(s.n) * s.C)),  // d(normed input) (n,C)
        dout(c, s.n, s.C, s.bf16, false, false), floats(c.bytes() / sizeof(float)) {}
};

// This rank's rows of k_proj or v_proj (KD, C): its piece, or within a copy those of its head.
const float* kv_rows(const float* w, const Shape& s) { return w + int64_t(s.kv0) * s.D * s.C; }

// The gradient of k_proj or v_proj from dy(n,KD): its piece, or within a copy the rows of this rank's head, the
// others zero when overwriting (the ranks sharing a head add up in the sum over the group).
void kv_backward_weight(Kernels& k, float* g, ConstAct dy, ConstAct h, const Shape& s, bool accumulate) {
  const int64_t head = int64_t(s.D) * s.C;  // one head's rows
  if (s.kv_whole > 0 && !accumulate) {
    k.fill(g, 0.f, size_t(s.kv0 * head));
    k.fill(g + (s.kv0 + s.KV) * head, 0.f, size_t((s.kv_whole - s.kv0 - s.KV) * head));
  }
  k.linear_backward_weight(g + s.kv0 * head, nullptr, dy, h, s.n, s.C, s.KD, accumulate);
}

StashLayout attention_stash_layout(const Segment& seg, const ModelDims& d, int samples) {
  StashLayout layout;
  AttentionStash(StashParts::recording(&layout), Shape(d, samples, seg.shards, 0));
  return layout;
}

SegmentSizes attention_sizes(const Segment& seg, const ModelDims& d, int samples) {
  Shape s(d, samples, seg.shards, 0);
  SegmentSizes z;
  z.input_bytes = z.out_bytes = size_t(s.n) * s.C * f;
  const AttentionStash st(StashParts{}, s);
  z.stash_bytes = st.bytes;
  z.stash_kept_bytes = st.kept_bytes;
  z.wstash_bytes = AttentionWStash(nullptr, s).floats * f;
  // fused backward: wstash + d(attention output) + (bf16) dv in fp32 before it is rounded; the forward's fp32 q_pre,
  // k_pre, q, k, v or y before it is rounded (bf16) fits in it
  z.workspace_bytes = z.wstash_bytes + size_t(s.n) * s.QD * f + (s.bf16 ? size_t(s.n) * s.KD * f : 0);
  return z;
}

// q or k (b,T,heads,D) rotated by RoPE where it was computed (fp32_room), then settled into its activation.
void rotate_into(Kernels& k, Act dst, float* x, const Shape& s, int heads) {
  k.rope(x, s.b, s.T, heads, s.D, s.theta, false);
  settle(k, dst, x, size_t(s.n) * size_t(heads) * size_t(s.D));
}

// The normed input, and with qk_norm q and k from their projections: the forward's cheap part, again.
void attention_norms(Kernels& k, const Shape& s, const AttentionStash& st, const SegmentIO& io) {
  const float* const* w = io.w;
  if (!s.qk_norm) return;
  float* q = fp32_room(st.q, io.workspace);
  k.rmsnorm_forward(q, st.q_rstd, st.q_pre, w[kQNorm], s.n * s.H, s.D, s.eps);      // per head (n·H,D)
  rotate_into(k, st.q, q, s, s.H);
  float* kk = fp32_room(st.k, io.workspace);
  k.rmsnorm_forward(kk, st.k_rstd, st.k_pre, w[kKNorm], s.n * s.KV, s.D, s.eps);   // (n·KV,D)
  rotate_into(k, st.k, kk, s, s.KV);
}

void attention_rerun_tail(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  Shape s(d, io.samples, io.shards, io.shard);
  AttentionStash st(StashParts::of(io), s);
  k.rmsnorm_forward(st.h, st.rstd, io.in, io.w[kInputNorm], s.n, s.C, s.eps);  // (n,C)
  attention_norms(k, s, st, io);
}

void attention_forward(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  Shape s(d, io.samples, io.shards, io.shard);
  AttentionStash st(StashParts::of(io), s);
  const float* const* w = io.w;
  const float *wk = kv_rows(w[kKProj], s), *wv = kv_rows(w[kVProj], s);  // (KD,C)
  k.rmsnorm_forward(st.h, st.rstd, io.in, w[kInputNorm], s.n, s.C, s.eps);           // (n,C)
  if (s.qk_norm) {
    linear_into(k, st.q_pre, io.workspace, st.h, w[kQProj], nullptr, s.n, s.C, s.QD);  // (n,QD)
    linear_into(k, st.k_pre, io.workspace, st.h, wk, nullptr, s.n, s.C, s.KD);         // (n,KD)
    attention_norms(k, s, st, io);                                                     // q, k normed and rotated
  } else {
    float* q = fp32_room(st.q, io.workspace);
    k.linear_forward(q, st.h, w[kQProj], nullptr, s.n, s.C, s.QD);                    // (n,QD)
    rotate_into(k, st.q, q, s, s.H);
    float* kk = fp32_room(st.k, io.workspace);
    k.linear_forward(kk, st.h, wk, nullptr, s.n, s.C, s.KD);                          // (n,KD)
    rotate_into(k, st.k, kk, s, s.KV);
  }
  linear_into(k, st.v, io.workspace, st.h, wv, nullptr, s.n, s.C, s.KD);              // (n,KD)
  float* y = fp32_room(st.y, io.workspace);
  k.gqa_attention_forward(y, st.lse, st.q, st.k, st.v, s.b, s.T, s.H, s.KV, s.D);     // (b,T,H,D)
  settle(k, st.y, y, size_t(s.n) * s.QD);
  k.linear_forward(io.out, st.y, w[kOProj], nullptr, s.n, s.QD, s.C);                 // (n,C), partial
  if (io.shard == 0) k.accumulate(io.out, io.in, size_t(s.n) * s.C);                  // residual
}

void attention_backward_input(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  Shape s(d, io.samples, io.shards, io.shard);
  AttentionStash st(StashParts::of(io), s);
  AttentionWStash ws(io.wstash, s);
  const float* const* w = io.w;
  float* dy = io.workspace;  // d(attention output) (n,QD)
  ws.dout.settle_from(k, io.dout, s.n, s.C);
  k.linear_backward_input(dy, ws.dout.read(io.dout), w[kOProj], s.n, s.QD, s.C, false);
  float* dv = fp32_room(ws.dv.dy, dy + size_t(s.n) * s.QD);  // (n,KD)
  k.gqa_attention_backward(ws.dq, ws.dk, dv, dy, st.q, st.k, st.v, st.y, st.lse, io.scratch, s.b, s.T, s.H, s.KV,
                           s.D);                                                      // after RoPE
  ws.dv.settle_from(k, dv, s.n, s.KD);
  k.rope(ws.dq, s.b, s.T, s.H, s.D, s.theta, true);                                   // before RoPE
  k.rope(ws.dk, s.b, s.T, s.KV, s.D, s.theta, true);
  if (s.qk_norm) {
    k.rmsnorm_backward_input(ws.dq_pre, ws.dq, st.q_pre, st.q_rstd, w[kQNorm], s.n * s.H, s.D, false);
    k.rmsnorm_backward_input(ws.dk_pre, ws.dk, st.k_pre, st.k_rstd, w[kKNorm], s.n * s.KV, s.D, false);
  }
  k.linear_backward_input(ws.dh, ws.dq_pre, w[kQProj], s.n, s.C, s.QD, false);         // d normed input (n,C)
  k.linear_backward_input(ws.dh, ws.dk_pre, kv_rows(w[kKProj], s), s.n, s.C, s.KD, true);
  k.linear_backward_input(ws.dh, ws.dv.dy, kv_rows(w[kVProj], s), s.n, s.C, s.KD, true);  // partial over ranks
  if (io.shard == 0) k.copy(io.din, io.dout, sizeof(float) * size_t(s.n) * s.C);       // residual path
  k.rmsnorm_backward_input(io.din, ws.dh, io.in, st.rstd, w[kInputNorm], s.n, s.C, io.shard == 0);
}

void attention_backward_weight(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  Shape s(d, io.samples, io.shards, io.shard);
  AttentionStash st(StashParts::of(io), s);
  AttentionWStash ws(io.wstash, s);
  float* const* g = io.g;
  ws.dout.weight_gradients(k, g[kOProj], nullptr, io.dout, st.y, s.n, s.QD, s.C, io.accumulate(kOProj));
  k.linear_backward_weight(g[kQProj], nullptr, ws.dq_pre, st.h, s.n, s.C, s.QD, io.accumulate(kQProj));
  kv_backward_weight(k, g[kKProj], ws.dk_pre, st.h, s, io.accumulate(kKProj));
  kv_backward_weight(k, g[kVProj], ws.dv.dy, st.h, s, io.accumulate(kVProj));
  if (s.qk_norm) {
    k.rmsnorm_backward_weight(g[kQNorm], ws.dq, st.q_pre, st.q_rstd, s.n * s.H, s.D, io.accumulate(kQNorm));
    k.rmsnorm_backward_weight(g[kKNorm], ws.dk, st.k_pre, st.k_rstd, s.n * s.KV, s.D, io.accumulate(kKNorm));
  }
  k.rmsnorm_backward_weight(g[kInputNorm], ws.dh, io.in, st.rstd, s.n, s.C, io.accumulate(kInputNorm));
}

size_t attention_scratch_floats(const Kernels& k, const ModelDims& d, int samples) {
  return k.gqa_attention_scratch_floats(samples, d.seq_len, d.n_heads, d.n_kv_heads, d.head_dim);
}

uint64_t attention_scratch_estimate(const ModelDims& d, int samples, int threads) {
  return attention_scratch_estimate_bytes(samples, d.n_heads, d.seq_len, threads);
}

// Megatron: q_proj by rows and o_proj by columns (H/k heads a rank), k_proj and v_proj by rows (KV/k heads) or
// copied (fewer key/value heads than ranks); the norms copied.
ParamSplit attention_tp_split(const ModelDims& d, int slot, int k) {
  const int64_t C = d.d_model, QD = int64_t(d.n_heads) * d.head_dim, KD = int64_t(d.n_kv_heads) * d.head_dim;
  switch (slot) {
    case kQProj: return ParamSplit::rows(QD, C, k);                  // (QD,C)
    case kKProj:
    case kVProj: return d.n_kv_heads % k == 0 ? ParamSplit::rows(KD, C, k) : ParamSplit::copy();  // (KD,C)
    case kOProj: return ParamSplit::cols(C, QD, k);                  // (C,QD)
    default: return ParamSplit::copy();                              // input_layernorm, q_norm, k_norm
  }
}

std::string attention_tp_refusal(const ModelDims& d, int k) {
  const int H = d.n_heads, KV = d.n_kv_heads;
  if (k < 1) return cat(k, " ranks: a group needs at least one");
  if (H % k != 0) return cat(H, " query heads do not divide among ", k, " ranks");
  if (KV % k != 0 && k % KV != 0)
    return cat(KV, " key/value heads do not divide among ", k, " ranks, nor ", k, " ranks among them");
  return "";
}

// ---------------------------------------------------------------- MLP half: x + down(silu(gate h) · up h)
// Selective recompute keeps the projections and recomputes the normed input and silu(g)·u.
struct MlpStash {
  float* rstd;
  Act h, a;  // read by matmuls alone
  Act g, u;  // read by SwiGLU (and its backward): bf16 as a held stash gives them back
  size_t bytes, kept_bytes;
  MlpStash(StashParts p, const Shape& s) {
    StashCarver c(p);
    rstd = c.keep_exact(s.n);               // (n)
    g = c.keep_act(int64_t(s.n) * s.F, s.bf16);  // gate projection (n,F)
    u = c.keep_act(int64_t(s.n) * s.F, s.bf16);  // up projection (n,F)
    c.tail_act(h, int64_t(s.n) * s.C, s.bf16);  // normed input (n,C)
    c.tail_act(a, int64_t(s.n) * s.F, s.bf16);  // silu(g)·u (n,F)
    c.finish();
    bytes = c.bytes();
    kept_bytes = c.kept_bytes;
  }
};

struct MlpWStash {
  StashCarver c;
  Act dg, du;  // read by matmuls alone
  float* dh;
  ProductGradient dout;  // (n,C): io.dout itself in fp32
  size_t floats;
  MlpWStash(float* p, const Shape& s)
      : c(p),
        dg(c.keep_act(int64_t(s.n) * s.F, s.bf16)),  // (n,F)
        du(c.keep_act(int64_t(s.n) * s.F, s.bf16)),  // (n,F)
        dh(c.keep<float>(int64_t(s.n) * s.C)),       // (n,C)
        dout(c, s.n, s.C, s.bf16, false, false), floats(c.bytes() / sizeof(float)) {}
};

StashLayout mlp_stash_layout(const Segment& seg, const ModelDims& d, int samples) {
  StashLayout layout;
  MlpStash(StashParts::recording(&layout), Shape(d, samples, seg.shards, 0));
  return layout;
}

SegmentSizes mlp_sizes(const Segment& seg, const ModelDims& d, int samples) {
  Shape s(d, samples, seg.shards, 0);
  SegmentSizes z;
  z.input_bytes = z.out_bytes = size_t(s.n) * s.C * f;
  const MlpStash st(StashParts{}, s);
  z.stash_bytes = st.bytes;
  z.stash_kept_bytes = st.kept_bytes;
  z.wstash_bytes = MlpWStash(nullptr, s).floats * f;
  // fused backward: wstash + d(silu(g)·u); the forward's fp32 g or u (bf16, where a backend computes them there) fits
  z.workspace_bytes = z.wstash_bytes + size_t(s.n) * s.F * f;
  return z;
}

void mlp_rerun_tail(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  Shape s(d, io.samples, io.shards, io.shard);
  MlpStash st(StashParts::of(io), s);
  k.rmsnorm_forward(st.h, st.rstd, io.in, io.w[kPostAttentionNorm], s.n, s.C, s.eps);  // (n,C)
  k.swiglu_forward(st.a, st.g, st.u, size_t(s.n) * s.F);                               // (n,F)
}

void mlp_forward(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  Shape s(d, io.samples, io.shards, io.shard);
  MlpStash st(StashParts::of(io), s);
  const float* const* w = io.w;
  k.rmsnorm_forward(st.h, st.rstd, io.in, w[kPostAttentionNorm], s.n, s.C, s.eps);  // (n,C)
  // the projections at their stash's width (bf16: rounded as they are written), SwiGLU from what the stash holds,
  // as mlp_rerun_tail computes it again
  linear_into(k, st.g, io.workspace, st.h, w[kGateProj], nullptr, s.n, s.C, s.F);  // (n,F)
  linear_into(k, st.u, io.workspace, st.h, w[kUpProj], nullptr, s.n, s.C, s.F);    // (n,F)
  k.swiglu_forward(st.a, st.g, st.u, size_t(s.n) * s.F);                           // (n,F)
  k.linear_forward(io.out, st.a, w[kDownProj], nullptr, s.n, s.F, s.C);             // (n,C), partial
  if (io.shard == 0) k.accumulate(io.out, io.in, size_t(s.n) * s.C);                // residual
}

void mlp_backward_input(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  Shape s(d, io.samples, io.shards, io.shard);
  MlpStash st(StashParts::of(io), s);
  MlpWStash ws(io.wstash, s);
  const float* const* w = io.w;
  float* da = io.workspace;  // d(silu(g)·u) (n,F)
  ws.dout.settle_from(k, io.dout, s.n, s.C);
  k.linear_backward_input(da, ws.dout.read(io.dout), w[kDownProj], s.n, s.F, s.C, false);
  k.swiglu_backward(ws.dg, ws.du, da, st.g, st.u, size_t(s.n) * s.F);
  k.linear_backward_input(ws.dh, ws.dg, w[kGateProj], s.n, s.C, s.F, false);  // (n,C)
  k.linear_backward_input(ws.dh, ws.du, w[kUpProj], s.n, s.C, s.F, true);    // partial over ranks
  if (io.shard == 0) k.copy(io.din, io.dout, sizeof(float) * size_t(s.n) * s.C);  // residual path
  k.rmsnorm_backward_input(io.din, ws.dh, io.in, st.rstd, w[kPostAttentionNorm], s.n, s.C, io.shard == 0);
}

void mlp_backward_weight(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  Shape s(d, io.samples, io.shards, io.shard);
  MlpStash st(StashParts::of(io), s);
  MlpWStash ws(io.wstash, s);
  float* const* g = io.g;
  ws.dout.weight_gradients(k, g[kDownProj], nullptr, io.dout, st.a, s.n, s.F, s.C, io.accumulate(kDownProj));
  k.linear_backward_weight(g[kGateProj], nullptr, ws.dg, st.h, s.n, s.C, s.F, io.accumulate(kGateProj));
  k.linear_backward_weight(g[kUpProj], nullptr, ws.du, st.h, s.n, s.C, s.F, io.accumulate(kUpProj));
  k.rmsnorm_backward_weight(g[kPostAttentionNorm], ws.dh, io.in, st.rstd, s.n, s.C,
                            io.accumulate(kPostAttentionNorm));
}

// Megatron: gate_proj and up_proj by rows, down_proj by columns (F/k hidden units a rank); the norm copied.
ParamSplit mlp_tp_split(const ModelDims& d, int slot, int k) {
  const int64_t C = d.d_model, F = d.d_ff;
  switch (slot) {
    case kGateProj:
    case kUpProj: return ParamSplit::rows(F, C, k);    // (F,C)
    case kDownProj: return ParamSplit::cols(C, F, k);  // (C,F)
    default: return ParamSplit::copy();                // post_attention_layernorm
  }
}

std::string mlp_tp_refusal(const ModelDims& d, int k) {
  if (k < 1) return cat(k, " ranks: a group needs at least one");
  return d.d_ff % k == 0 ? "" : cat("d_ff ", d.d_ff, " does not divide among ", k, " ranks");
}

// ---------------------------------------------------------------- head: final norm, LM head, statistics
// The head writes the logits of its vocabulary shard and their cross-entropy statistics; the loss segment (the
// next one, which shares its stash) finishes the cross-entropy from every shard's statistics and writes dlogits in
// place, which the head's backward reads. On one rank the shard is the whole vocabulary.
// Stash: targets(n) int32 | h(n,C) (bf16 in a bf16 run) | rstd(n) | logits(n,Vl) (then probabilities, then dlogits)
struct HeadStash {
  int32_t* targets;
  float *rstd, *logits;
  Act h;  // read by matmuls alone
  HeadStash(void* stash, const Shape& s, const Vocab& v) {
    StashCarver c(StashParts{stash, nullptr});
    targets = c.keep<int32_t>(s.n);                  // (n)
    h = c.keep_act(int64_t(s.n) * s.C, s.bf16);      // (n,C)
    rstd = c.keep<float>(s.n);                       // (n)
    logits = c.keep<float>(int64_t(s.n) * v.Vl);     // (n,Vl)
    bytes = c.bytes();
  }
  size_t bytes;
};

SegmentSizes head_sizes(const Segment& seg, const ModelDims& d, int samples) {
  Shape s(d, samples);
  const Vocab v(d, std::max(1, seg.shards), 0);
  SegmentSizes z;
  z.input_bytes = size_t(s.n) * s.C * f;
  z.out_bytes = size_t(v.shards) * s.n * 3 * f;  // every shard's statistics (shards,n,3)
  z.stash_bytes = HeadStash(nullptr, s, v).bytes;
  z.wstash_bytes = size_t(s.n) * s.C * f;  // d(normed input)
  z.workspace_bytes = z.wstash_bytes;
  return z;
}

void head_forward(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  Shape s(d, io.samples);
  const Vocab v(d, io.shards, io.shard);
  HeadStash st(io.stash, s, v);
  k.rmsnorm_forward(st.h, st.rstd, io.in, io.w[kFinalNorm], s.n, s.C, s.eps);                     // (n,C)
  const float* w = vocab_rows(io.w[kLmHead], d, v, d.tie_embeddings);
  k.linear_forward(st.logits, st.h, w, nullptr, s.n, s.C, v.Vl);  // (n,Vl)
  k.vocab_xent_stats(io.out + int64_t(io.shard) * s.n * 3, st.logits, st.targets, s.n, v.Vl, v.v0);  // (n,3)
}

const float* head_logits(const ModelDims& d, int samples, const void* stash) {
  return HeadStash(const_cast<void*>(stash), Shape(d, samples), Vocab(d, 1, 0)).logits;
}

void head_backward_input(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  Shape s(d, io.samples);
  const Vocab v(d, io.shards, io.shard);
  HeadStash st(io.stash, s, v);
  // dlogits (n,Vl), written by the loss segment → d h (n,C) → d input, partial over the shards
  const float* w = vocab_rows(io.w[kLmHead], d, v, d.tie_embeddings);
  k.linear_backward_input(io.wstash, st.logits, w, s.n, s.C, v.Vl, false);
  k.rmsnorm_backward_input(io.din, io.wstash, io.in, st.rstd, io.w[kFinalNorm], s.n, s.C, false);
}

void head_backward_weight(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  Shape s(d, io.samples);
  const Vocab v(d, io.shards, io.shard);
  HeadStash st(io.stash, s, v);
  const bool acc = io.accumulate(kLmHead);
  float* g = vocab_grad_rows(k, io.g[kLmHead], d, v, acc, d.tie_embeddings);
  k.linear_backward_weight(g, nullptr, st.logits, st.h, s.n, s.C, v.Vl, acc);
  k.rmsnorm_backward_weight(io.g[kFinalNorm], io.wstash, io.in, st.rstd, s.n, s.C, io.accumulate(kFinalNorm));
}

// Vocabulary-parallel: the LM head by rows (or, tied to the embedding, held whole and used by its rows); the norm
// copied.
ParamSplit head_tp_split(const ModelDims& d, int slot, int k) {
  if (slot == kLmHead && !d.tie_embeddings) return ParamSplit::rows(d.vocab, d.d_model, k);  // (V,C)
  return ParamSplit::copy();
}

// ---------------------------------------------------------------- loss: cross-entropy from every shard's statistics
SegmentSizes loss_sizes(const Segment& seg, const ModelDims& d, int samples) {
  Shape s(d, samples);
  SegmentSizes z;
  z.input_bytes = size_t(std::max(1, seg.shards)) * s.n * 3 * f;  // (shards,n,3)
  return z;
}

void loss_forward(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  Shape s(d, io.samples);
  const Vocab v(d, io.shards, io.shard);
  HeadStash st(io.link, s, v);
  k.vocab_xent_finish(st.logits, io.loss_sum, st.logits, io.in, st.targets, s.n, v.Vl, v.shards, io.loss_scale);
}

void loss_backward_input(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  Shape s(d, io.samples);
  const Vocab v(d, io.shards, io.shard);
  HeadStash st(io.link, s, v);
  k.vocab_xent_backward(st.logits, st.logits, st.targets, s.n, v.Vl, v.v0, io.loss_scale);  // dlogits (n,Vl)
  k.fill(io.din, 0.f, size_t(v.shards) * s.n * 3);  // the statistics have no gradient the head reads
}

ParamSplit no_params_tp_split(const ModelDims&, int, int) { return ParamSplit::copy(); }

}  // namespace

const SegmentType& embed_type() {
  static const SegmentType t{.name = "qwen3.embed", .data = DataSlot::Tokens, .reads_input = false,
                             .sizes = embed_sizes, .forward = embed_forward,
                             .backward_weight = embed_backward_weight, .tp_split = embed_tp_split,
                             .tp_refusal = vocab_tp_refusal};
  return t;
}

const SegmentType& attention_type() {
  static const SegmentType t{.name = "qwen3.attention", .sizes = attention_sizes, .forward = attention_forward,
                             .backward_input = attention_backward_input,
                             .backward_weight = attention_backward_weight, .rerun_tail = attention_rerun_tail,
                             .stash_layout = attention_stash_layout, .scratch_floats = attention_scratch_floats,
                             .scratch_estimate = attention_scratch_estimate, .tp_split = attention_tp_split,
                             .tp_refusal = attention_tp_refusal,
                             .samples_apart = true};
  return t;
}

const SegmentType& mlp_type() {
  static const SegmentType t{.name = "qwen3.mlp", .sizes = mlp_sizes, .forward = mlp_forward,
                             .backward_input = mlp_backward_input, .backward_weight = mlp_backward_weight,
                             .rerun_tail = mlp_rerun_tail, .stash_layout = mlp_stash_layout,
                             .tp_split = mlp_tp_split, .tp_refusal = mlp_tp_refusal,
                             .samples_apart = true};
  return t;
}

const SegmentType& head_type() {
  static const SegmentType t{.name = "qwen3.head", .data = DataSlot::Targets, .sizes = head_sizes,
                             .forward = head_forward, .backward_input = head_backward_input,
                             .backward_weight = head_backward_weight, .tp_split = head_tp_split,
                             .tp_refusal = vocab_tp_refusal, .tp_output = SegmentType::TpOutput::Gathered,
                             .logits = head_logits};
  return t;
}

const SegmentType& loss_type() {
  static const SegmentType t{.name = "qwen3.loss", .computes_loss = true, .sizes = loss_sizes, .forward = loss_forward,
                             .backward_input = loss_backward_input, .link_offset = -1, .tp_split = no_params_tp_split,
                             .tp_refusal = vocab_tp_refusal, .tp_input_grad_partial = false};
  return t;
}

}  // namespace piper::qwen3
