// GPT-2 segment math over backend kernels: embedding, pre-LN transformer block, LN_f + tied LM head +
// cross-entropy; their buffer sizes. Shapes: n = samples·T rows, C model width, F MLP width.
#include "model/gpt2/gpt2_segments.hpp"

#include "util/error.hpp"

namespace piper::gpt2 {

BlockStash::BlockStash(StashParts p, int64_t n, int64_t C, int64_t F, int64_t B, int64_t NH, int64_t T) {
  StashCarver c(p);
  ln1_mean = c.keep<float>(n);
  ln1_rstd = c.keep<float>(n);
  qkv = c.keep<float>(n * 3 * C);
  xmid = c.keep<float>(n * C);
  ln2_mean = c.keep<float>(n);
  ln2_rstd = c.keep<float>(n);
  fc_dgelu = c.keep<float>(n * F);  // gelu'(fc pre-activation), for the backward
  fc_gelu = c.keep<float>(n * F);
  c.tail(ln1, n * C);
  c.tail(att, B * NH * T * T);
  c.tail(atty, n * C);
  c.tail(ln2, n * C);
  c.finish();
  bytes = c.bytes();
  kept_bytes = c.kept_bytes;
}

BlockWStash::BlockWStash(int64_t n, int64_t C, int64_t F) {
  size_t o = 0;
  auto take = [&](int64_t count) { size_t at = o; o += size_t(count); return at; };
  dfc_pre = take(n * F);
  dln2 = take(n * C);
  dxmid = take(n * C);
  dqkv = take(n * 3 * C);
  dln1 = take(n * C);
  total = o;
}

namespace {

const size_t f = sizeof(float), i32 = sizeof(int32_t);  // token and target ids are int32

SegmentSizes embedding_sizes(const Segment&, const ModelDims& d, int samples) {
  SegmentSizes s;
  int64_t n = int64_t(samples) * d.seq_len;
  s.out_bytes = size_t(n * d.d_model) * f;
  s.stash_bytes = size_t(n) * i32;  // tokens
  return s;
}

SegmentSizes block_sizes(const Segment&, const ModelDims& d, int samples) {
  SegmentSizes s;
  const int64_t b = samples, n = b * d.seq_len;
  BlockStash st(StashParts{}, n, d.d_model, d.d_ff, b, d.n_heads, d.seq_len);
  BlockWStash ws(n, d.d_model, d.d_ff);
  s.input_bytes = s.out_bytes = size_t(n * d.d_model) * f;
  s.stash_bytes = st.bytes;
  s.stash_kept_bytes = st.kept_bytes;
  s.wstash_bytes = ws.total * f;
  s.workspace_bytes = (ws.total + size_t(n * d.d_model)) * f;  // fused backward: wstash + d(atty)
  return s;
}

SegmentSizes head_sizes(const Segment&, const ModelDims& d, int samples) {
  SegmentSizes s;
  int64_t n = int64_t(samples) * d.seq_len;
  s.input_bytes = size_t(n * d.d_model) * f;
  // targets, ln_f out, mean, rstd, probs (overwritten by dlogits in backward)
  s.stash_bytes = size_t(n) * i32 + size_t(n * d.d_model + 2 * n + n * int64_t(d.vocab)) * f;
  s.wstash_bytes = size_t(n * d.d_model) * f;  // d(ln_f out)
  s.workspace_bytes = s.wstash_bytes;
  return s;
}

size_t block_scratch_floats(const Kernels& k, const ModelDims& d, int samples) {
  return k.attention_scratch_floats(samples, d.seq_len, d.d_model, d.n_heads);
}

uint64_t block_scratch_estimate(const ModelDims& d, int, int threads) {
  return uint64_t(threads) * uint64_t(d.seq_len) * uint64_t(d.seq_len) * sizeof(float);
}

// ---- GPT embedding: tokens(b,T) → x(n,C) ----
void embedding_forward(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const auto* tokens = static_cast<const int32_t*>(io.stash);
  k.embedding_forward(io.out, tokens, io.w[kWte], io.w[kWpe], io.samples, d.seq_len, d.d_model);
}

void embedding_backward_weight(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const auto* tokens = static_cast<const int32_t*>(io.stash);
  k.embedding_backward(io.g[kWte], io.g[kWpe], io.dout, tokens, io.samples, d.seq_len, d.d_model, d.vocab, io.accumulate(kWte),
                       io.accumulate(kWpe));
}

// ---- GPT block: x(n,C) → x + attn(ln1 x) → + mlp(ln2 ·). Parameters in BlockParam order ----
void block_forward(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const int b = io.samples, T = d.seq_len, C = d.d_model, F = d.d_ff, NH = d.n_heads;
  const int n = b * T;
  BlockStash st(StashParts::of(io), n, C, F, b, NH, T);
  const float* const* w = io.w;
  k.layernorm_forward(st.ln1, st.ln1_mean, st.ln1_rstd, io.in, w[kLn1W], w[kLn1B], n, C);  // (n,C)
  k.linear_forward(st.qkv, st.ln1, w[kQkvW], w[kQkvB], n, C, 3 * C);                              // (n,3C)
  k.attention_forward(st.atty, st.att, st.qkv, b, T, C, NH);                         // (n,C)
  k.linear_forward(io.out, st.atty, w[kAttnProjW], w[kAttnProjB], n, C, C);                                    // (n,C)
  k.add(st.xmid, io.in, io.out, size_t(n) * C);                                              // residual
  k.layernorm_forward(st.ln2, st.ln2_mean, st.ln2_rstd, st.xmid, w[kLn2W], w[kLn2B], n, C);
  k.linear_gelu_forward(st.fc_dgelu, st.fc_gelu, st.ln2, w[kFcW], w[kFcB], n, C, F);        // (n,F)
  k.linear_forward(io.out, st.fc_gelu, w[kMlpProjW], w[kMlpProjB], n, F, C);                               // (n,C)
  k.accumulate(io.out, st.xmid, size_t(n) * C);                                              // residual
}

// The normed inputs and the attention, from the kept qkv, residual midpoint and statistics: what selective
// recompute redoes, with the forward's calls.
void block_rerun_tail(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const int b = io.samples, T = d.seq_len, C = d.d_model, F = d.d_ff, NH = d.n_heads;
  const int n = b * T;
  BlockStash st(StashParts::of(io), n, C, F, b, NH, T);
  const float* const* w = io.w;
  k.layernorm_forward(st.ln1, st.ln1_mean, st.ln1_rstd, io.in, w[kLn1W], w[kLn1B], n, C);  // (n,C)
  k.attention_forward(st.atty, st.att, st.qkv, b, T, C, NH);                                // (n,C)
  k.layernorm_forward(st.ln2, st.ln2_mean, st.ln2_rstd, st.xmid, w[kLn2W], w[kLn2B], n, C);
}

void block_backward_input(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const int b = io.samples, T = d.seq_len, C = d.d_model, F = d.d_ff, NH = d.n_heads;
  const int n = b * T;
  BlockStash st(StashParts::of(io), n, C, F, b, NH, T);
  BlockWStash ws(n, C, F);
  float* W = io.wstash;
  const float* const* w = io.w;
  float* datty = io.workspace;  // (n,C)
  k.linear_backward_input(W + ws.dfc_pre, io.dout, w[kMlpProjW], n, F, C, false);             // d gelu out (n,F)
  k.gelu_backward(W + ws.dfc_pre, W + ws.dfc_pre, st.fc_dgelu, size_t(n) * F);      // d fc pre (n,F)
  k.linear_backward_input(W + ws.dln2, W + ws.dfc_pre, w[kFcW], n, C, F, false);           // d ln2 out (n,C)
  k.copy(W + ws.dxmid, io.dout, sizeof(float) * size_t(n) * C);                         // residual path
  k.layernorm_backward_input(W + ws.dxmid, W + ws.dln2, st.xmid, st.ln2_mean, st.ln2_rstd, w[kLn2W], n, C,
                             true);                                                     // d xmid (n,C)
  k.linear_backward_input(datty, W + ws.dxmid, w[kAttnProjW], n, C, C, false);                   // d atty (n,C)
  k.attention_backward(W + ws.dqkv, datty, st.qkv, st.att, io.scratch, b, T, C, NH);  // (n,3C)
  k.linear_backward_input(W + ws.dln1, W + ws.dqkv, w[kQkvW], n, C, 3 * C, false);          // d ln1 out (n,C)
  k.copy(io.din, W + ws.dxmid, sizeof(float) * size_t(n) * C);                          // residual path
  k.layernorm_backward_input(io.din, W + ws.dln1, io.in, st.ln1_mean, st.ln1_rstd, w[kLn1W], n, C, true);
}

void block_backward_weight(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const int b = io.samples, T = d.seq_len, C = d.d_model, F = d.d_ff, NH = d.n_heads;
  const int n = b * T;
  BlockStash st(StashParts::of(io), n, C, F, b, NH, T);
  BlockWStash ws(n, C, F);
  const float* W = io.wstash;
  float* const* g = io.g;
  k.linear_backward_weight(g[kMlpProjW], g[kMlpProjB], io.dout, st.fc_gelu, n, F, C, io.accumulate(kMlpProjW));
  k.linear_backward_weight(g[kFcW], g[kFcB], W + ws.dfc_pre, st.ln2, n, C, F, io.accumulate(kFcW));
  k.layernorm_backward_weight(g[kLn2W], g[kLn2B], W + ws.dln2, st.xmid, st.ln2_mean, st.ln2_rstd, n, C,
                              io.accumulate(kLn2W));
  k.linear_backward_weight(g[kAttnProjW], g[kAttnProjB], W + ws.dxmid, st.atty, n, C, C, io.accumulate(kAttnProjW));
  k.linear_backward_weight(g[kQkvW], g[kQkvB], W + ws.dqkv, st.ln1, n, C, 3 * C, io.accumulate(kQkvW));
  k.layernorm_backward_weight(g[kLn1W], g[kLn1B], W + ws.dln1, io.in, st.ln1_mean, st.ln1_rstd, n, C, io.accumulate(kLn1W));
}

// ---- GPT head: ln_f, tied LM head (the embedding's wte), cross-entropy. Stash: targets(n) | lf(n,C) | mean(n) | rstd(n) | probs(n,V)
struct HeadStash {
  int32_t* targets;
  float *lf, *mean, *rstd, *probs;
  HeadStash(void* stash, int64_t n, int64_t C) {
    targets = static_cast<int32_t*>(stash);
    lf = reinterpret_cast<float*>(targets + n);
    mean = lf + n * C;
    rstd = mean + n;
    probs = rstd + n;
  }
};

void head_forward(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const int n = io.samples * d.seq_len, C = d.d_model, V = d.vocab;
  HeadStash st(io.stash, n, C);
  k.layernorm_forward(st.lf, st.mean, st.rstd, io.in, io.w[kLnfW], io.w[kLnfB], n, C);
  k.linear_forward(st.probs, st.lf, io.w[kHeadWte], nullptr, n, C, V);  // logits (n,V)
  k.softmax_xent_forward(st.probs, io.loss_sum, st.probs, st.targets, n, V, io.loss_scale);
}

void head_backward_input(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const int n = io.samples * d.seq_len, C = d.d_model, V = d.vocab;
  HeadStash st(io.stash, n, C);
  k.softmax_xent_backward(st.probs, st.probs, st.targets, n, V, io.loss_scale);  // dlogits (n,V)
  k.linear_backward_input(io.wstash, st.probs, io.w[kHeadWte], n, C, V, false);          // d lf (n,C)
  k.layernorm_backward_input(io.din, io.wstash, io.in, st.mean, st.rstd, io.w[kLnfW], n, C, false);
}

void head_backward_weight(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const int n = io.samples * d.seq_len, C = d.d_model, V = d.vocab;
  HeadStash st(io.stash, n, C);
  k.linear_backward_weight(io.g[kHeadWte], nullptr, st.probs, st.lf, n, C, V, io.accumulate(kHeadWte));
  k.layernorm_backward_weight(io.g[kLnfW], io.g[kLnfB], io.wstash, io.in, st.mean, st.rstd, n, C, io.accumulate(kLnfW));
}

}  // namespace

const SegmentType& embedding_type() {
  static const SegmentType t{.name = "gpt2.embedding", .data = DataSlot::Tokens, .reads_input = false,
                             .sizes = embedding_sizes, .forward = embedding_forward,
                             .backward_weight = embedding_backward_weight};
  return t;
}

const SegmentType& block_type() {
  static const SegmentType t{.name = "gpt2.block", .sizes = block_sizes, .forward = block_forward,
                             .backward_input = block_backward_input, .backward_weight = block_backward_weight,
                             .rerun_tail = block_rerun_tail, .scratch_floats = block_scratch_floats,
                             .scratch_estimate = block_scratch_estimate};
  return t;
}

const SegmentType& head_type() {
  static const SegmentType t{.name = "gpt2.head", .data = DataSlot::Targets, .computes_loss = true,
                             .sizes = head_sizes, .forward = head_forward, .backward_input = head_backward_input,
                             .backward_weight = head_backward_weight};
  return t;
}

}  // namespace piper::gpt2
