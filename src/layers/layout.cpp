// Buffer sizes per segment kind (see layout.hpp). Token and target ids are int32, everything else fp32.
#include "layers/layout.hpp"

namespace piper {

BlockStash::BlockStash(int64_t n, int64_t C, int64_t F, int64_t B, int64_t NH, int64_t T) {
  size_t o = 0;
  auto take = [&](int64_t count) { size_t at = o; o += size_t(count); return at; };
  ln1 = take(n * C);
  ln1_mean = take(n);
  ln1_rstd = take(n);
  qkv = take(n * 3 * C);
  att = take(B * NH * T * T);
  atty = take(n * C);
  xmid = take(n * C);
  ln2 = take(n * C);
  ln2_mean = take(n);
  ln2_rstd = take(n);
  fc_dgelu = take(n * F);  // gelu'(fc pre-activation), for the backward
  fc_gelu = take(n * F);
  total = o;
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

SegmentSizes segment_sizes(const Segment& seg, const ModelDims& d, int samples) {
  const size_t f = sizeof(float), i32 = sizeof(int32_t);
  const int64_t b = samples;
  SegmentSizes s;
  switch (seg.kind) {
    case SegmentKind::Embedding: {
      int64_t n = b * d.seq_len;
      s.out_bytes = size_t(n * d.d_model) * f;
      s.stash_bytes = size_t(n) * i32;  // tokens
      break;
    }
    case SegmentKind::Block: {
      int64_t n = b * d.seq_len;
      BlockStash st(n, d.d_model, d.d_ff, b, d.n_heads, d.seq_len);
      BlockWStash ws(n, d.d_model, d.d_ff);
      s.input_bytes = s.out_bytes = size_t(n * d.d_model) * f;
      s.stash_bytes = st.total * f;
      s.wstash_bytes = ws.total * f;
      s.workspace_bytes = (ws.total + size_t(n * d.d_model)) * f;  // fused backward: wstash + d(atty)
      break;
    }
    case SegmentKind::Head: {
      int64_t n = b * d.seq_len;
      s.input_bytes = size_t(n * d.d_model) * f;
      // targets, ln_f out, mean, rstd, probs (overwritten by dlogits in backward)
      s.stash_bytes = size_t(n) * i32 + size_t(n * d.d_model + 2 * n + n * d.vocab) * f;
      s.wstash_bytes = size_t(n * d.d_model) * f;  // d(ln_f out)
      s.workspace_bytes = s.wstash_bytes;
      break;
    }
    case SegmentKind::MlpLayer: {
      int64_t in = seg.layer == 0 ? d.d_in : d.d_hidden;
      s.out_bytes = size_t(b * d.d_hidden) * f;
      s.input_bytes = seg.layer == 0 ? 0 : size_t(b * in) * f;
      // layer 0 keeps its input samples; every layer keeps gelu' of its pre-activation
      s.stash_bytes = size_t((seg.layer == 0 ? b * in : 0) + b * d.d_hidden) * f;
      s.wstash_bytes = size_t(b * d.d_hidden) * f;  // d(pre)
      s.workspace_bytes = s.wstash_bytes;
      break;
    }
    case SegmentKind::MlpHead: {
      s.input_bytes = size_t(b * d.d_hidden) * f;
      s.stash_bytes = size_t(b) * i32 + size_t(b * d.n_classes) * f;  // targets, probs
      s.wstash_bytes = 0;  // dlogits overwrite probs in the stash
      break;
    }
  }
  return s;
}

}  // namespace piper
