// GPT-2's segment types (token+position embedding; a pre-LN block as two halves, attention and GELU MLP, each
// tensor-parallel; LN_f + tied LM head; the cross-entropy, apart: the embedding, head and loss vocabulary-parallel)
// and the order of each one's parameters, which the builder and the math share.
#pragma once
#include "model/segment_type.hpp"

namespace piper::gpt2 {

enum EmbeddingParam { kWte, kWpe, kEmbeddingParams };
// blocks.{i}.attn: x + proj(attn(qkv(ln1 x)))
enum AttentionParam { kLn1W, kLn1B, kQkvW, kQkvB, kAttnProjW, kAttnProjB, kAttentionParams };
// blocks.{i}.mlp: x + proj(gelu(fc(ln2 x)))
enum MlpParam { kLn2W, kLn2B, kFcW, kFcB, kMlpProjW, kMlpProjB, kMlpParams };
enum HeadParam { kLnfW, kLnfB, kHeadWte, kHeadParams };

const SegmentType& embedding_type();
const SegmentType& attention_type();
const SegmentType& mlp_type();
const SegmentType& head_type();
const SegmentType& loss_type();

}  // namespace piper::gpt2
