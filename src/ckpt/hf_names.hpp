// Parameter names and layouts between piper and Hugging Face transformers, for safetensors export and
// import, as each family maps them (Family::to_hf/from_hf: GPT-2's GPT2LMHeadModel names, Conv1D weights
// stored (in, out)); Qwen3 and the MLP keep piper's names, which are already those of Qwen3ForCausalLM.
#pragma once
#include <string>

#include "ckpt/safetensors.hpp"

namespace piper {

// A piper parameter (model.kind `kind`) as Hugging Face stores it: renamed, Conv1D weights transposed.
NamedTensor to_hf(const std::string& kind, const NamedTensor& piper_tensor);

// A Hugging Face tensor as piper names and lays it out. Returns a tensor with an empty name for what piper
// does not keep: a tied lm_head.weight and GPT-2's causal-mask buffers (attn.bias, attn.masked_bias).
// GPT-2 names are taken with or without the "transformer." prefix.
NamedTensor from_hf(const std::string& kind, const NamedTensor& hf_tensor, bool tied_head);

}  // namespace piper
