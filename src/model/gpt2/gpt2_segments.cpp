// GPT-2 segment math over backend kernels: embedding, the pre-LN block's attention and MLP halves, LN_f + tied LM
// head (and the cross-entropy's statistics), the cross-entropy; their buffer sizes. Shapes: n = samples·T rows, C
// model width, NH heads, F MLP width. The halves are tensor-parallel (Megatron): on rank t of k, the heads and the
// hidden units are this rank's part; the embedding and the head are vocabulary-parallel: rank t uses rows
// [t·V/k, (t+1)·V/k) of wte (held whole).
#include "model/gpt2/gpt2_segments.hpp"

#include <algorithm>

#include "model/act_output.hpp"
#include "model/attention_scratch.hpp"
#include "model/product_gradient.hpp"
#include "model/stash_carver.hpp"
#include "model/vocab_shard.hpp"
#include "util/error.hpp"

namespace piper::gpt2 {

namespace {

const size_t f = sizeof(float), i32 = sizeof(int32_t);  // token and target ids are int32

// A block half's shapes on one rank of a tensor-parallel group of `shards` (tp_refusal says they divide): H of the
// NH heads, A = H·(C/NH) columns of each of q, k and v (and of the attention output), F hidden units.
struct Shape {
  int b, T, n, C, H, A, F, D;
  bool bf16;  // the activations only matmuls read are bf16 (ModelDims::bf16_matmul_inputs)
  Shape(const ModelDims& d, int samples, int shards)
      : b(samples), T(d.seq_len), n(samples * d.seq_len), C(d.d_model), H(d.n_heads / shards),
        A(d.d_model / shards), F(d.d_ff / shards), D(d.d_model / d.n_heads), bf16(d.bf16_matmul_inputs) {}
  // q, k and v as views of the fused qkv (n,3A): rows 3A apart, k at +A, v at +2A (Kernels::gqa_attention_*)
  HeadRows fused() const { return {3 * int64_t(A), 3 * int64_t(A)}; }
};

// The embedding and the tied LM head use their rows of wte (V,C), held whole by every rank (model/vocab_shard.hpp).

ParamSplit copy_tp_split(const ModelDims&, int, int) { return ParamSplit::copy(); }

SegmentSizes embedding_sizes(const Segment&, const ModelDims& d, int samples) {
  SegmentSizes s;
  int64_t n = int64_t(samples) * d.seq_len;
  s.out_bytes = size_t(n * d.d_model) * f;
  s.stash_bytes = size_t(n) * i32;  // tokens
  return s;
}

// ---- GPT embedding: tokens(b,T) → x(n,C) = wte[tok] + wpe[t] ----
// Vocabulary-parallel over a tensor-parallel group (wte and wpe held whole): a rank's wte rows for its tokens, zeros
// for the others, and wpe added by shard 0 alone, so that the ranks' outputs sum to the whole (partial).
void embedding_forward(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const auto* tokens = static_cast<const int32_t*>(io.stash);
  const Vocab v(d, io.shards, io.shard);
  const int64_t T = d.seq_len, C = d.d_model, n = int64_t(io.samples) * T;
  k.vocab_embedding_forward(io.out, tokens, vocab_rows(io.w[kWte], d, v, true), int(n), int(C), v.v0, v.Vl);  // (n,C)
  if (io.shard == 0)
    for (int b = 0; b < io.samples; ++b) k.accumulate(io.out + b * T * C, io.w[kWpe], size_t(T * C));  // + wpe[t]
}

void embedding_backward_weight(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const auto* tokens = static_cast<const int32_t*>(io.stash);
  const Vocab v(d, io.shards, io.shard);
  const int64_t T = d.seq_len, C = d.d_model, n = int64_t(io.samples) * T;
  const bool acc = io.accumulate(kWte);
  float* g = vocab_grad_rows(k, io.g[kWte], d, v, acc, true);
  k.vocab_embedding_backward(g, io.dout, tokens, int(n), int(C), v.v0, v.Vl, acc);  // (Vl,C)
  // wpe (T,C): Σ_b dout, in sample order, by shard 0; the others write zeros when overwriting, else nothing.
  if (io.shard != 0) {
    if (!io.accumulate(kWpe)) k.fill(io.g[kWpe], 0.f, size_t(T * C));
    return;
  }
  int b = 0;
  if (!io.accumulate(kWpe) && io.samples > 0) k.copy(io.g[kWpe], io.dout, sizeof(float) * size_t(T * C)), b = 1;
  else if (!io.accumulate(kWpe)) k.fill(io.g[kWpe], 0.f, size_t(T * C));
  for (; b < io.samples; ++b) k.accumulate(io.g[kWpe], io.dout + b * T * C, size_t(T * C));
}

// A bias added after a split product (by shard 0 alone): its gradient is shard 0's; the others' are zeros when
// overwriting and nothing when accumulating, so that the sum over the group is the gradient.
float* first_shard_bias(Kernels& k, const SegmentIO& io, int slot, int C) {
  if (io.shard == 0) return io.g[slot];
  if (!io.accumulate(slot)) k.fill(io.g[slot], 0.f, size_t(C));
  return nullptr;
}

// ---- attention half: x(n,C) → x + proj(attn(qkv(ln1 x))). Parameters in AttentionParam order ----
// Forward → backward: ln1's statistics and output, qkv, the attention's output and the log-sum-exp of each query row
// (flash style: the probabilities are recomputed from them). Selective recompute keeps the statistics and qkv (a
// product) and recomputes the normed input and the attention.
struct AttentionStash {
  float *ln1_mean, *ln1_rstd, *lse;
  Act ln1, qkv;  // read by products alone (qkv by the attention's)
  Act atty;      // read by proj and by the attention's backward (dy · y): bf16 as a held stash gives it back
  size_t bytes, kept_bytes;
  AttentionStash(StashParts p, const Shape& s) {
    StashCarver c(p);
    ln1_mean = c.keep_exact(s.n);                      // (n)
    ln1_rstd = c.keep_exact(s.n);                      // (n)
    qkv = c.keep_act(int64_t(s.n) * 3 * s.A, s.bf16);  // (n,3A): this rank's q, k, v
    c.tail_act(ln1, int64_t(s.n) * s.C, s.bf16);    // (n,C)
    c.tail_exact(lse, int64_t(s.b) * s.H * s.T);    // (b,H,T)
    c.tail_act(atty, int64_t(s.n) * s.A, s.bf16);   // (n,A)
    c.finish();
    bytes = c.bytes();
    kept_bytes = c.kept_bytes;
  }
};

// Backward-input → backward-weight: d qkv, d(normed input), and in a bf16 run the output's gradient rounded.
struct AttentionWStash {
  StashCarver c;
  ProductGradient dqkv;  // (n,3A)
  float* dln1;           // (n,C), partial over ranks
  ProductGradient dout;  // (n,C): io.dout itself in fp32
  size_t floats;
  AttentionWStash(float* p, const Shape& s)
      : c(p), dqkv(c, s.n, 3 * s.A, s.bf16, true, true), dln1(c.keep<float>(int64_t(s.n) * s.C)),
        dout(c, s.n, s.C, s.bf16, false, true), floats(c.bytes() / sizeof(float)) {}
};

StashLayout attention_stash_layout(const Segment& seg, const ModelDims& d, int samples) {
  StashLayout layout;
  AttentionStash(StashParts::recording(&layout), Shape(d, samples, seg.shards));
  return layout;
}

SegmentSizes attention_sizes(const Segment& seg, const ModelDims& d, int samples) {
  const Shape s(d, samples, seg.shards);
  SegmentSizes z;
  z.input_bytes = z.out_bytes = size_t(s.n) * s.C * f;
  const AttentionStash st(StashParts{}, s);
  z.stash_bytes = st.bytes;
  z.stash_kept_bytes = st.kept_bytes;
  z.wstash_bytes = AttentionWStash(nullptr, s).floats * f;
  // fused backward: wstash + d(atty) + (bf16) d qkv in fp32 before it is rounded; the forward's fp32 qkv and
  // attention output before they are rounded (bf16) fit in it, one after the other
  z.workspace_bytes = z.wstash_bytes + size_t(s.n) * s.A * f + (s.bf16 ? size_t(s.n) * 3 * s.A * f : 0);
  return z;
}

// The attention's output atty (n,A) and lse from qkv (multi-head: KV = H): in fp32 where it is computed (fp32_room),
// then settled into atty.
void attend(Kernels& k, const Shape& s, const AttentionStash& st, const SegmentIO& io) {
  float* y = fp32_room(st.atty, io.workspace);
  k.gqa_attention_forward(y, st.lse, st.qkv, st.qkv.at(s.A), st.qkv.at(2 * s.A), s.b, s.T, s.H, s.H, s.D,
                          s.fused());
  settle(k, st.atty, y, size_t(s.n) * s.A);
}

void attention_forward(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const Shape s(d, io.samples, io.shards);
  AttentionStash st(StashParts::of(io), s);
  const float* const* w = io.w;
  const bool first = io.shard == 0;  // adds the bias after the split product, and the residual
  k.layernorm_forward(st.ln1, st.ln1_mean, st.ln1_rstd, io.in, w[kLn1W], w[kLn1B], s.n, s.C);  // (n,C)
  linear_into(k, st.qkv, io.workspace, st.ln1, w[kQkvW], w[kQkvB], s.n, s.C, 3 * s.A);          // (n,3A)
  attend(k, s, st, io);                                                                          // (n,A)
  k.linear_forward(io.out, st.atty, w[kAttnProjW], first ? w[kAttnProjB] : nullptr, s.n, s.A, s.C);  // partial
  if (first) k.accumulate(io.out, io.in, size_t(s.n) * s.C);                                   // residual
}

// The normed input and the attention, from the kept qkv and statistics, with the forward's calls.
void attention_rerun_tail(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const Shape s(d, io.samples, io.shards);
  AttentionStash st(StashParts::of(io), s);
  k.layernorm_forward(st.ln1, st.ln1_mean, st.ln1_rstd, io.in, io.w[kLn1W], io.w[kLn1B], s.n, s.C);  // (n,C)
  attend(k, s, st, io);                                                                               // (n,A)
}

void attention_backward_input(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const Shape s(d, io.samples, io.shards);
  AttentionStash st(StashParts::of(io), s);
  AttentionWStash ws(io.wstash, s);
  const float* const* w = io.w;
  float* datty = io.workspace;  // (n,A)
  ws.dout.settle_from(k, io.dout, s.n, s.C);
  k.linear_backward_input(datty, ws.dout.read(io.dout), w[kAttnProjW], s.n, s.A, s.C, false);
  float* dqkv = fp32_room(ws.dqkv.dy, datty + size_t(s.n) * s.A);                     // (n,3A)
  k.gqa_attention_backward(dqkv, dqkv + s.A, dqkv + 2 * s.A, datty, st.qkv, st.qkv.at(s.A), st.qkv.at(2 * s.A),
                           st.atty, st.lse, io.scratch, s.b, s.T, s.H, s.H, s.D, s.fused());
  ws.dqkv.settle_from(k, dqkv, s.n, 3 * s.A);
  k.linear_backward_input(ws.dln1, ws.dqkv.dy, w[kQkvW], s.n, s.C, 3 * s.A, false);  // d ln1 out (n,C)
  if (io.shard == 0) k.copy(io.din, io.dout, sizeof(float) * size_t(s.n) * s.C);        // residual path
  k.layernorm_backward_input(io.din, ws.dln1, io.in, st.ln1_mean, st.ln1_rstd, w[kLn1W], s.n, s.C, io.shard == 0);
}

void attention_backward_weight(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const Shape s(d, io.samples, io.shards);
  AttentionStash st(StashParts::of(io), s);
  AttentionWStash ws(io.wstash, s);
  float* const* g = io.g;
  ws.dout.weight_gradients(k, g[kAttnProjW], first_shard_bias(k, io, kAttnProjB, s.C), io.dout, st.atty, s.n, s.A,
                           s.C, io.accumulate(kAttnProjW));
  ws.dqkv.weight_gradients(k, g[kQkvW], g[kQkvB], nullptr, st.ln1, s.n, s.C, 3 * s.A, io.accumulate(kQkvW));
  k.layernorm_backward_weight(g[kLn1W], g[kLn1B], ws.dln1, io.in, st.ln1_mean, st.ln1_rstd, s.n, s.C,
                              io.accumulate(kLn1W));
}

size_t attention_scratch_floats(const Kernels& k, const ModelDims& d, int samples) {
  const int D = d.d_model / d.n_heads;  // enough for a rank's heads too
  return k.gqa_attention_scratch_floats(samples, d.seq_len, d.n_heads, d.n_heads, D);
}

uint64_t attention_scratch_estimate(const ModelDims& d, int samples, int threads) {
  return attention_scratch_estimate_bytes(samples, d.n_heads, d.seq_len, threads);
}

// Megatron: qkv by rows, each of q, k and v apart (C/k rows of each: H/k heads a rank), proj by columns; the
// layernorm and proj's bias (added by shard 0) copied.
ParamSplit attention_tp_split(const ModelDims& d, int slot, int k) {
  const int64_t C = d.d_model;
  switch (slot) {
    case kQkvW: return {3, C / k * C};                  // (3C,C): q, k, v stacked
    case kQkvB: return {3, C / k};                      // (3C)
    case kAttnProjW: return ParamSplit::cols(C, C, k);  // (C,C)
    default: return ParamSplit::copy();                 // ln1, proj's bias
  }
}

std::string attention_tp_refusal(const ModelDims& d, int k) {
  if (k < 1) return cat(k, " ranks: a group needs at least one");
  return d.n_heads % k == 0 ? "" : cat(d.n_heads, " heads do not divide among ", k, " ranks");
}

// ---- MLP half: x(n,C) → x + proj(gelu(fc(ln2 x))). Parameters in MlpParam order ----
// Forward → backward: ln2's statistics and output, the GELU's output and derivative. Selective recompute keeps the
// statistics and the GELU's output and derivative (made from a product) and recomputes the normed input.
struct MlpStash {
  float *ln2_mean, *ln2_rstd;
  Act ln2, fc_gelu;  // read by matmuls alone
  Act fc_dgelu;      // read by the GELU's backward: bf16 as a held stash gives it back
  size_t bytes, kept_bytes;
  MlpStash(StashParts p, const Shape& s) {
    StashCarver c(p);
    ln2_mean = c.keep_exact(s.n);                      // (n)
    ln2_rstd = c.keep_exact(s.n);                      // (n)
    fc_dgelu = c.keep_act(int64_t(s.n) * s.F, s.bf16);  // gelu'(fc pre-activation) (n,F), for the backward
    fc_gelu = c.keep_act(int64_t(s.n) * s.F, s.bf16);  // (n,F)
    c.tail_act(ln2, int64_t(s.n) * s.C, s.bf16);       // (n,C)
    c.finish();
    bytes = c.bytes();
    kept_bytes = c.kept_bytes;
  }
};

// Backward-input → backward-weight: d(fc pre-activation), d(normed input), and in a bf16 run the output's gradient
// rounded.
struct MlpWStash {
  StashCarver c;
  ProductGradient dfc_pre;  // (n,F)
  float* dln2;              // (n,C), partial over ranks
  ProductGradient dout;     // (n,C): io.dout itself in fp32
  size_t floats;
  MlpWStash(float* p, const Shape& s)
      : c(p), dfc_pre(c, s.n, s.F, s.bf16, true, true), dln2(c.keep<float>(int64_t(s.n) * s.C)),
        dout(c, s.n, s.C, s.bf16, false, true), floats(c.bytes() / sizeof(float)) {}
};

StashLayout mlp_stash_layout(const Segment& seg, const ModelDims& d, int samples) {
  StashLayout layout;
  MlpStash(StashParts::recording(&layout), Shape(d, samples, seg.shards));
  return layout;
}

SegmentSizes mlp_sizes(const Segment& seg, const ModelDims& d, int samples) {
  const Shape s(d, samples, seg.shards);
  SegmentSizes z;
  z.input_bytes = z.out_bytes = size_t(s.n) * s.C * f;
  const MlpStash st(StashParts{}, s);
  z.stash_bytes = st.bytes;
  z.stash_kept_bytes = st.kept_bytes;
  z.wstash_bytes = MlpWStash(nullptr, s).floats * f;
  // fused backward: the wstash, and (bf16) d(fc pre-activation) in fp32 before it is rounded; the forward's fp32 fc
  // product (bf16) fits in it
  z.workspace_bytes = z.wstash_bytes + (s.bf16 ? size_t(s.n) * s.F * f : 0);
  return z;
}

void mlp_forward(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const Shape s(d, io.samples, io.shards);
  MlpStash st(StashParts::of(io), s);
  const float* const* w = io.w;
  const bool first = io.shard == 0;  // adds the bias after the split product, and the residual
  k.layernorm_forward(st.ln2, st.ln2_mean, st.ln2_rstd, io.in, w[kLn2W], w[kLn2B], s.n, s.C);       // (n,C)
  k.linear_gelu_forward(st.fc_dgelu, st.fc_gelu, st.ln2, w[kFcW], w[kFcB], s.n, s.C, s.F, io.workspace);  // (n,F)
  k.linear_forward(io.out, st.fc_gelu, w[kMlpProjW], first ? w[kMlpProjB] : nullptr, s.n, s.F, s.C);  // partial
  if (first) k.accumulate(io.out, io.in, size_t(s.n) * s.C);                                        // residual
}

// The normed input, from the kept statistics, with the forward's call.
void mlp_rerun_tail(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const Shape s(d, io.samples, io.shards);
  MlpStash st(StashParts::of(io), s);
  k.layernorm_forward(st.ln2, st.ln2_mean, st.ln2_rstd, io.in, io.w[kLn2W], io.w[kLn2B], s.n, s.C);  // (n,C)
}

void mlp_backward_input(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const Shape s(d, io.samples, io.shards);
  MlpStash st(StashParts::of(io), s);
  MlpWStash ws(io.wstash, s);
  const float* const* w = io.w;
  ws.dout.settle_from(k, io.dout, s.n, s.C);
  float* dpre = fp32_room(ws.dfc_pre.dy, io.workspace);                                     // (n,F)
  k.linear_backward_input(dpre, ws.dout.read(io.dout), w[kMlpProjW], s.n, s.F, s.C, false);  // d gelu out
  ws.dfc_pre.settle_gelu_backward_from(k, dpre, st.fc_dgelu, s.n, s.F);                     // d fc pre
  k.linear_backward_input(ws.dln2, ws.dfc_pre.dy, w[kFcW], s.n, s.C, s.F, false);           // d ln2 out (n,C)
  if (io.shard == 0) k.copy(io.din, io.dout, sizeof(float) * size_t(s.n) * s.C);     // residual path
  k.layernorm_backward_input(io.din, ws.dln2, io.in, st.ln2_mean, st.ln2_rstd, w[kLn2W], s.n, s.C, io.shard == 0);
}

void mlp_backward_weight(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const Shape s(d, io.samples, io.shards);
  MlpStash st(StashParts::of(io), s);
  MlpWStash ws(io.wstash, s);
  float* const* g = io.g;
  ws.dout.weight_gradients(k, g[kMlpProjW], first_shard_bias(k, io, kMlpProjB, s.C), io.dout, st.fc_gelu, s.n, s.F,
                           s.C, io.accumulate(kMlpProjW));
  ws.dfc_pre.weight_gradients(k, g[kFcW], g[kFcB], nullptr, st.ln2, s.n, s.C, s.F, io.accumulate(kFcW));
  k.layernorm_backward_weight(g[kLn2W], g[kLn2B], ws.dln2, io.in, st.ln2_mean, st.ln2_rstd, s.n, s.C,
                              io.accumulate(kLn2W));
}

// Megatron: fc by rows (F/k hidden units a rank, with their biases), proj by columns; the layernorm and proj's
// bias (added by shard 0) copied.
ParamSplit mlp_tp_split(const ModelDims& d, int slot, int k) {
  const int64_t C = d.d_model, F = d.d_ff;
  switch (slot) {
    case kFcW: return ParamSplit::rows(F, C, k);       // (F,C)
    case kFcB: return ParamSplit::rows(F, 1, k);       // (F)
    case kMlpProjW: return ParamSplit::cols(C, F, k);  // (C,F)
    default: return ParamSplit::copy();                // ln2, proj's bias
  }
}

std::string mlp_tp_refusal(const ModelDims& d, int k) {
  if (k < 1) return cat(k, " ranks: a group needs at least one");
  return d.d_ff % k == 0 ? "" : cat("d_ff ", d.d_ff, " does not divide among ", k, " ranks");
}

// ---- GPT head: ln_f, the logits of this rank's vocabulary rows of wte (the tied LM head), their cross-entropy
// statistics into its part of the (shards,n,3) output (gathered). The loss segment (the next one, which shares this
// stash) finishes the cross-entropy from every shard's statistics and writes dlogits in place, which the head's
// backward reads. On one rank the shard is the whole vocabulary.
// Stash: targets(n) int32 | lf(n,C) (bf16 in a bf16 run) | mean(n) | rstd(n) | logits(n,Vl) (then probabilities, then dlogits)
struct HeadStash {
  int32_t* targets;
  float *mean, *rstd, *logits;
  Act lf;  // read by matmuls alone
  size_t bytes;
  HeadStash(void* stash, const ModelDims& d, int64_t n, const Vocab& v) {
    StashCarver c(StashParts{stash, nullptr});
    targets = c.keep<int32_t>(n);                                   // (n)
    lf = c.keep_act(n * d.d_model, d.bf16_matmul_inputs);          // (n,C)
    mean = c.keep<float>(n);               // (n)
    rstd = c.keep<float>(n);               // (n)
    logits = c.keep<float>(n * v.Vl);      // (n,Vl)
    bytes = c.bytes();
  }
};

SegmentSizes head_sizes(const Segment& seg, const ModelDims& d, int samples) {
  SegmentSizes s;
  const int64_t n = int64_t(samples) * d.seq_len;
  const Vocab v(d, std::max(1, seg.shards), 0);
  s.input_bytes = size_t(n * d.d_model) * f;
  s.out_bytes = size_t(v.shards) * size_t(n) * 3 * f;  // every shard's statistics (shards,n,3)
  s.stash_bytes = HeadStash(nullptr, d, n, v).bytes;
  s.wstash_bytes = size_t(n * d.d_model) * f;  // d(ln_f out)
  s.workspace_bytes = s.wstash_bytes;
  return s;
}

void head_forward(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const int n = io.samples * d.seq_len, C = d.d_model;
  const Vocab v(d, io.shards, io.shard);
  HeadStash st(io.stash, d, n, v);
  k.layernorm_forward(st.lf, st.mean, st.rstd, io.in, io.w[kLnfW], io.w[kLnfB], n, C);
  k.linear_forward(st.logits, st.lf, vocab_rows(io.w[kHeadWte], d, v, true), nullptr, n, C, v.Vl);       // (n,Vl)
  k.vocab_xent_stats(io.out + int64_t(io.shard) * n * 3, st.logits, st.targets, n, v.Vl, v.v0);  // (n,3)
}

const float* head_logits(const ModelDims& d, int samples, const void* stash) {
  return HeadStash(const_cast<void*>(stash), d, int64_t(samples) * d.seq_len, Vocab(d, 1, 0)).logits;
}

void head_backward_input(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const int n = io.samples * d.seq_len, C = d.d_model;
  const Vocab v(d, io.shards, io.shard);
  HeadStash st(io.stash, d, n, v);
  // dlogits (n,Vl), written by the loss segment → d lf (n,C) → d input, partial over the shards
  k.linear_backward_input(io.wstash, st.logits, vocab_rows(io.w[kHeadWte], d, v, true), n, C, v.Vl, false);
  k.layernorm_backward_input(io.din, io.wstash, io.in, st.mean, st.rstd, io.w[kLnfW], n, C, false);
}

void head_backward_weight(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const int n = io.samples * d.seq_len, C = d.d_model;
  const Vocab v(d, io.shards, io.shard);
  HeadStash st(io.stash, d, n, v);
  const bool acc = io.accumulate(kHeadWte);
  float* g = vocab_grad_rows(k, io.g[kHeadWte], d, v, acc, true);
  k.linear_backward_weight(g, nullptr, st.logits, st.lf, n, C, v.Vl, acc);
  k.layernorm_backward_weight(io.g[kLnfW], io.g[kLnfB], io.wstash, io.in, st.mean, st.rstd, n, C, io.accumulate(kLnfW));
}

// ---- GPT loss: the cross-entropy from every shard's statistics (shards,n,3), in the head's stash ----
SegmentSizes loss_sizes(const Segment& seg, const ModelDims& d, int samples) {
  SegmentSizes s;
  s.input_bytes = size_t(std::max(1, seg.shards)) * size_t(samples) * d.seq_len * 3 * f;  // (shards,n,3)
  return s;
}

void loss_forward(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const int n = io.samples * d.seq_len;
  const Vocab v(d, io.shards, io.shard);
  HeadStash st(io.link, d, n, v);
  k.vocab_xent_finish(st.logits, io.loss_sum, st.logits, io.in, st.targets, n, v.Vl, v.shards, io.loss_scale);
}

void loss_backward_input(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const int n = io.samples * d.seq_len;
  const Vocab v(d, io.shards, io.shard);
  HeadStash st(io.link, d, n, v);
  k.vocab_xent_backward(st.logits, st.logits, st.targets, n, v.Vl, v.v0, io.loss_scale);  // dlogits (n,Vl)
  k.fill(io.din, 0.f, size_t(v.shards) * n * 3);  // the statistics have no gradient the head reads
}

}  // namespace

const SegmentType& embedding_type() {
  static const SegmentType t{.name = "gpt2.embedding", .data = DataSlot::Tokens, .reads_input = false,
                             .sizes = embedding_sizes, .forward = embedding_forward,
                             .backward_weight = embedding_backward_weight, .tp_split = copy_tp_split,
                             .tp_refusal = vocab_tp_refusal};
  return t;
}

const SegmentType& attention_type() {
  static const SegmentType t{.name = "gpt2.attention", .sizes = attention_sizes, .forward = attention_forward,
                             .backward_input = attention_backward_input,
                             .backward_weight = attention_backward_weight, .rerun_tail = attention_rerun_tail,
                             .stash_layout = attention_stash_layout,
                             .scratch_floats = attention_scratch_floats,
                             .scratch_estimate = attention_scratch_estimate, .tp_split = attention_tp_split,
                             .tp_refusal = attention_tp_refusal,
                             .samples_apart = true};
  return t;
}

const SegmentType& mlp_type() {
  static const SegmentType t{.name = "gpt2.mlp", .sizes = mlp_sizes, .forward = mlp_forward,
                             .backward_input = mlp_backward_input, .backward_weight = mlp_backward_weight,
                             .rerun_tail = mlp_rerun_tail, .stash_layout = mlp_stash_layout,
                             .tp_split = mlp_tp_split, .tp_refusal = mlp_tp_refusal,
                             .samples_apart = true};
  return t;
}

const SegmentType& head_type() {
  static const SegmentType t{.name = "gpt2.head", .data = DataSlot::Targets, .sizes = head_sizes,
                             .forward = head_forward, .backward_input = head_backward_input,
                             .backward_weight = head_backward_weight, .tp_split = copy_tp_split,
                             .tp_refusal = vocab_tp_refusal, .tp_output = SegmentType::TpOutput::Gathered,
                             .logits = head_logits};
  return t;
}

const SegmentType& loss_type() {
  static const SegmentType t{.name = "gpt2.loss", .computes_loss = true, .sizes = loss_sizes, .forward = loss_forward,
                             .backward_input = loss_backward_input, .link_offset = -1, .tp_split = copy_tp_split,
                             .tp_refusal = vocab_tp_refusal, .tp_input_grad_partial = false};
  return t;
}

}  // namespace piper::gpt2
