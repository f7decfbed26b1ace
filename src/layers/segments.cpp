// Segment math: GPT embedding, pre-LN transformer block, LN_f + tied LM head + cross-entropy, and the
// MLP's Linear+GELU layers and classifier head. Shapes: n = samples·T rows, C model width, F MLP width.
#include "layers/segments.hpp"

#include "layers/layout.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

bool acc(const SegmentIO& io, int param) { return !(io.overwrite >> param & 1u); }

// ---- GPT embedding: tokens(b,T) → x(n,C) ----
void embedding_forward(Kernels& k, const ModelDims& d, const SegmentIO& io) {
  const auto* tokens = static_cast<const int32_t*>(io.stash);
  k.embedding_forward(io.out, tokens, io.w[0], io.w[1], io.samples, d.seq_len, d.d_model);
}

void embedding_backward_weight(Kernels& k, const ModelDims& d, const SegmentIO& io) {
  const auto* tokens = static_cast<const int32_t*>(io.stash);
  k.embedding_backward(io.g[0], io.g[1], io.dout, tokens, io.samples, d.seq_len, d.d_model, d.vocab, acc(io, 0),
                       acc(io, 1));
}

// ---- GPT block. Params: 0 ln1.w 1 ln1.b 2 qkv.w 3 qkv.b 4 proj.w 5 proj.b 6 ln2.w 7 ln2.b
//      8 fc.w 9 fc.b 10 mlp.proj.w 11 mlp.proj.b ----
void block_forward(Kernels& k, const ModelDims& d, const SegmentIO& io) {
  const int b = io.samples, T = d.seq_len, C = d.d_model, F = d.d_ff, NH = d.n_heads;
  const int n = b * T;
  BlockStash st(n, C, F, b, NH, T);
  float* S = static_cast<float*>(io.stash);
  const float* const* w = io.w;
  k.layernorm_forward(S + st.ln1, S + st.ln1_mean, S + st.ln1_rstd, io.in, w[0], w[1], n, C);  // (n,C)
  k.linear_forward(S + st.qkv, S + st.ln1, w[2], w[3], n, C, 3 * C);                              // (n,3C)
  k.attention_forward(S + st.atty, S + st.att, S + st.qkv, b, T, C, NH);                         // (n,C)
  k.linear_forward(io.out, S + st.atty, w[4], w[5], n, C, C);                                    // (n,C)
  k.add(S + st.xmid, io.in, io.out, size_t(n) * C);                                              // residual
  k.layernorm_forward(S + st.ln2, S + st.ln2_mean, S + st.ln2_rstd, S + st.xmid, w[6], w[7], n, C);
  k.linear_gelu_forward(S + st.fc_dgelu, S + st.fc_gelu, S + st.ln2, w[8], w[9], n, C, F);        // (n,F)
  k.linear_forward(io.out, S + st.fc_gelu, w[10], w[11], n, F, C);                               // (n,C)
  k.accumulate(io.out, S + st.xmid, size_t(n) * C);                                              // residual
}

void block_backward_input(Kernels& k, const ModelDims& d, const SegmentIO& io) {
  const int b = io.samples, T = d.seq_len, C = d.d_model, F = d.d_ff, NH = d.n_heads;
  const int n = b * T;
  BlockStash st(n, C, F, b, NH, T);
  BlockWStash ws(n, C, F);
  float* S = static_cast<float*>(io.stash);
  float* W = io.wstash;
  const float* const* w = io.w;
  float* datty = io.workspace;  // (n,C)
  k.linear_backward_input(W + ws.dfc_pre, io.dout, w[10], n, F, C, false);             // d gelu out (n,F)
  k.gelu_backward(W + ws.dfc_pre, W + ws.dfc_pre, S + st.fc_dgelu, size_t(n) * F);      // d fc pre (n,F)
  k.linear_backward_input(W + ws.dln2, W + ws.dfc_pre, w[8], n, C, F, false);           // d ln2 out (n,C)
  k.copy(W + ws.dxmid, io.dout, sizeof(float) * size_t(n) * C);                         // residual path
  k.layernorm_backward_input(W + ws.dxmid, W + ws.dln2, S + st.xmid, S + st.ln2_mean, S + st.ln2_rstd, w[6], n, C,
                             true);                                                     // d xmid (n,C)
  k.linear_backward_input(datty, W + ws.dxmid, w[4], n, C, C, false);                   // d atty (n,C)
  k.attention_backward(W + ws.dqkv, datty, S + st.qkv, S + st.att, io.attn_scratch, b, T, C, NH);  // (n,3C)
  k.linear_backward_input(W + ws.dln1, W + ws.dqkv, w[2], n, C, 3 * C, false);          // d ln1 out (n,C)
  k.copy(io.din, W + ws.dxmid, sizeof(float) * size_t(n) * C);                          // residual path
  k.layernorm_backward_input(io.din, W + ws.dln1, io.in, S + st.ln1_mean, S + st.ln1_rstd, w[0], n, C, true);
}

void block_backward_weight(Kernels& k, const ModelDims& d, const SegmentIO& io) {
  const int b = io.samples, T = d.seq_len, C = d.d_model, F = d.d_ff, NH = d.n_heads;
  const int n = b * T;
  BlockStash st(n, C, F, b, NH, T);
  BlockWStash ws(n, C, F);
  const float* S = static_cast<const float*>(io.stash);
  const float* W = io.wstash;
  float* const* g = io.g;
  k.linear_backward_weight(g[10], g[11], io.dout, S + st.fc_gelu, n, F, C, acc(io, 10));
  k.linear_backward_weight(g[8], g[9], W + ws.dfc_pre, S + st.ln2, n, C, F, acc(io, 8));
  k.layernorm_backward_weight(g[6], g[7], W + ws.dln2, S + st.xmid, S + st.ln2_mean, S + st.ln2_rstd, n, C,
                              acc(io, 6));
  k.linear_backward_weight(g[4], g[5], W + ws.dxmid, S + st.atty, n, C, C, acc(io, 4));
  k.linear_backward_weight(g[2], g[3], W + ws.dqkv, S + st.ln1, n, C, 3 * C, acc(io, 2));
  k.layernorm_backward_weight(g[0], g[1], W + ws.dln1, io.in, S + st.ln1_mean, S + st.ln1_rstd, n, C, acc(io, 0));
}

// ---- GPT head. Params: 0 ln_f.w 1 ln_f.b 2 wte (tied). Stash: targets(n) | lf(n,C) | mean(n) | rstd(n) | probs(n,V)
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

void head_forward(Kernels& k, const ModelDims& d, const SegmentIO& io) {
  const int n = io.samples * d.seq_len, C = d.d_model, V = d.vocab;
  HeadStash st(io.stash, n, C);
  k.layernorm_forward(st.lf, st.mean, st.rstd, io.in, io.w[0], io.w[1], n, C);
  k.linear_forward(st.probs, st.lf, io.w[2], nullptr, n, C, V);  // logits (n,V)
  k.softmax_xent_forward(st.probs, io.loss_sum, st.probs, st.targets, n, V, io.loss_scale);
}

void head_backward_input(Kernels& k, const ModelDims& d, const SegmentIO& io) {
  const int n = io.samples * d.seq_len, C = d.d_model, V = d.vocab;
  HeadStash st(io.stash, n, C);
  k.softmax_xent_backward(st.probs, st.probs, st.targets, n, V, io.loss_scale);  // dlogits (n,V)
  k.linear_backward_input(io.wstash, st.probs, io.w[2], n, C, V, false);          // d lf (n,C)
  k.layernorm_backward_input(io.din, io.wstash, io.in, st.mean, st.rstd, io.w[0], n, C, false);
}

void head_backward_weight(Kernels& k, const ModelDims& d, const SegmentIO& io) {
  const int n = io.samples * d.seq_len, C = d.d_model, V = d.vocab;
  HeadStash st(io.stash, n, C);
  k.linear_backward_weight(io.g[2], nullptr, st.probs, st.lf, n, C, V, acc(io, 2));
  k.layernorm_backward_weight(io.g[0], io.g[1], io.wstash, io.in, st.mean, st.rstd, n, C, acc(io, 0));
}

// ---- MLP layer: y = gelu(x W^T + b). Stash: [features(b,d_in) for layer 0] | gelu'(pre)(b,H)
struct MlpStash {
  const float* x;
  float* dgelu;
  int in_dim;
  MlpStash(const Segment& seg, const ModelDims& d, const SegmentIO& io) {
    float* s = static_cast<float*>(io.stash);
    in_dim = seg.layer == 0 ? d.d_in : d.d_hidden;
    x = seg.layer == 0 ? s : io.in;
    dgelu = seg.layer == 0 ? s + int64_t(io.samples) * d.d_in : s;
  }
};

void mlp_forward(Kernels& k, const Segment& seg, const ModelDims& d, const SegmentIO& io) {
  MlpStash st(seg, d, io);
  k.linear_gelu_forward(st.dgelu, io.out, st.x, io.w[0], io.w[1], io.samples, st.in_dim, d.d_hidden);
}

void mlp_backward_input(Kernels& k, const Segment& seg, const ModelDims& d, const SegmentIO& io) {
  MlpStash st(seg, d, io);
  k.gelu_backward(io.wstash, io.dout, st.dgelu, size_t(io.samples) * d.d_hidden);  // d pre (b,H)
  if (io.din) k.linear_backward_input(io.din, io.wstash, io.w[0], io.samples, st.in_dim, d.d_hidden, false);
}

void mlp_backward_weight(Kernels& k, const Segment& seg, const ModelDims& d, const SegmentIO& io) {
  MlpStash st(seg, d, io);
  k.linear_backward_weight(io.g[0], io.g[1], io.wstash, st.x, io.samples, st.in_dim, d.d_hidden, acc(io, 0));
}

// ---- MLP head: logits = x W^T + b, cross-entropy. Stash: targets(b) | probs(b,K)
void mlp_head_forward(Kernels& k, const ModelDims& d, const SegmentIO& io) {
  auto* targets = static_cast<int32_t*>(io.stash);
  float* probs = reinterpret_cast<float*>(targets + io.samples);
  k.linear_forward(probs, io.in, io.w[0], io.w[1], io.samples, d.d_hidden, d.n_classes);
  k.softmax_xent_forward(probs, io.loss_sum, probs, targets, io.samples, d.n_classes, io.loss_scale);
}

void mlp_head_backward_input(Kernels& k, const ModelDims& d, const SegmentIO& io) {
  auto* targets = static_cast<int32_t*>(io.stash);
  float* probs = reinterpret_cast<float*>(targets + io.samples);
  k.softmax_xent_backward(probs, probs, targets, io.samples, d.n_classes, io.loss_scale);
  k.linear_backward_input(io.din, probs, io.w[0], io.samples, d.d_hidden, d.n_classes, false);
}

void mlp_head_backward_weight(Kernels& k, const ModelDims& d, const SegmentIO& io) {
  auto* targets = static_cast<int32_t*>(io.stash);
  const float* dlogits = reinterpret_cast<const float*>(targets + io.samples);
  k.linear_backward_weight(io.g[0], io.g[1], dlogits, io.in, io.samples, d.d_hidden, d.n_classes, acc(io, 0));
}

}  // namespace

DataSlot data_slot(const Segment& seg) {
  switch (seg.kind) {
    case SegmentKind::Embedding: return DataSlot::Tokens;
    case SegmentKind::Head:
    case SegmentKind::MlpHead: return DataSlot::Targets;
    case SegmentKind::MlpLayer: return seg.layer == 0 ? DataSlot::Features : DataSlot::None;
    case SegmentKind::Block: return DataSlot::None;
  }
  return DataSlot::None;
}

void segment_forward(Kernels& k, const Segment& seg, const ModelDims& d, const SegmentIO& io) {
  switch (seg.kind) {
    case SegmentKind::Embedding: return embedding_forward(k, d, io);
    case SegmentKind::Block: return block_forward(k, d, io);
    case SegmentKind::Head: return head_forward(k, d, io);
    case SegmentKind::MlpLayer: return mlp_forward(k, seg, d, io);
    case SegmentKind::MlpHead: return mlp_head_forward(k, d, io);
  }
}

void segment_backward_input(Kernels& k, const Segment& seg, const ModelDims& d, const SegmentIO& io) {
  switch (seg.kind) {
    case SegmentKind::Embedding: return;  // reads data: no input gradient
    case SegmentKind::Block: return block_backward_input(k, d, io);
    case SegmentKind::Head: return head_backward_input(k, d, io);
    case SegmentKind::MlpLayer: return mlp_backward_input(k, seg, d, io);
    case SegmentKind::MlpHead: return mlp_head_backward_input(k, d, io);
  }
}

void segment_backward_weight(Kernels& k, const Segment& seg, const ModelDims& d, const SegmentIO& io) {
  switch (seg.kind) {
    case SegmentKind::Embedding: return embedding_backward_weight(k, d, io);
    case SegmentKind::Block: return block_backward_weight(k, d, io);
    case SegmentKind::Head: return head_backward_weight(k, d, io);
    case SegmentKind::MlpLayer: return mlp_backward_weight(k, seg, d, io);
    case SegmentKind::MlpHead: return mlp_head_backward_weight(k, d, io);
  }
}

}  // namespace piper
