// GPT-2's segment types (token+position embedding, pre-LN block with GELU MLP, LN_f + tied LM head +
// cross-entropy) and the order of each one's parameters, which the builder and the math share.
#pragma once
#include "model/segment_type.hpp"
#include "model/stash_carver.hpp"

namespace piper::gpt2 {

enum EmbeddingParam { kWte, kWpe, kEmbeddingParams };
enum BlockParam {
  kLn1W, kLn1B, kQkvW, kQkvB, kAttnProjW, kAttnProjB, kLn2W, kLn2B, kFcW, kFcB, kMlpProjW, kMlpProjB, kBlockParams
};
enum HeadParam { kLnfW, kLnfB, kHeadWte, kHeadParams };

const SegmentType& embedding_type();
const SegmentType& block_type();
const SegmentType& head_type();

// Each saved tensor of a block; n = samples·T rows. Selective recompute keeps the layernorm statistics, qkv, the
// residual midpoint and the MLP's activations, and recomputes the normed inputs and the attention (its
// probabilities and output).
struct BlockStash {
  float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *xmid, *ln2, *ln2_mean, *ln2_rstd, *fc_dgelu, *fc_gelu;
  size_t bytes, kept_bytes;
  BlockStash(StashParts p, int64_t n, int64_t C, int64_t F, int64_t B, int64_t NH, int64_t T);
};

// Offsets (floats) of the backward-input results a block's weight gradients need; n rows.
struct BlockWStash {
  size_t dfc_pre, dln2, dxmid, dqkv, dln1, total;
  BlockWStash(int64_t n, int64_t C, int64_t F);
};

}  // namespace piper::gpt2
