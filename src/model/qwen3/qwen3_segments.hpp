// Qwen3's segment types (token embedding; attention half of a block: RMSNorm, q/k/v/o, per-head q/k
// RMSNorm, RoPE, causal GQA; SwiGLU MLP half; final RMSNorm + LM head; cross-entropy) and the order of
// each one's parameters, which the builder and the math share.
#pragma once
#include "model/segment_type.hpp"

namespace piper::qwen3 {

enum EmbedParam { kEmbedTokens, kEmbedParams };
// q_norm and k_norm are present only with qk_norm
enum AttentionParam { kInputNorm, kQProj, kKProj, kVProj, kOProj, kQNorm, kKNorm, kAttentionParams };
enum MlpParam { kPostAttentionNorm, kGateProj, kUpProj, kDownProj, kMlpParams };
enum HeadParam { kFinalNorm, kLmHead, kHeadParams };
// A mixture-of-experts MLP is three segments: dispatch (these parameters), experts (for expert e: gate_proj
// at 3e, up_proj at 3e + 1, down_proj at 3e + 2) and combine (none).
// The selection bias (auxiliary-loss-free balancing) follows them when moe.bias_update_rate > 0.
enum MoeDispatchParam { kMoeNorm, kRouter, kMoeDispatchParams, kRouterBias = kMoeDispatchParams };

// The combine's parameters with shared experts (moe.shared_experts > 0): one SwiGLU of their summed width.
enum MoeSharedParam { kSharedGate, kSharedUp, kSharedDown, kMoeSharedParams };

// qwen3.cpp: moe.bias_update_rate (0: no selection bias); shared_experts × d_shared (0: no shared experts)
double moe_bias_update_rate(const ModelDims& d);
int moe_shared_width(const ModelDims& d);

const SegmentType& embed_type();
const SegmentType& attention_type();
const SegmentType& mlp_type();
const SegmentType& head_type();
const SegmentType& loss_type();  // the cross-entropy from the head's statistics (linked to the head's stash)
// qwen3_moe.cpp
const SegmentType& moe_dispatch_type();
const SegmentType& moe_experts_type();
const SegmentType& moe_combine_type();

}  // namespace piper::qwen3
