// Qwen3 as Hugging Face's Qwen3ForCausalLM, or Qwen3MoeForCausalLM with [model.moe]: its config.json
// (Family::hf_config); the parameter names are transformers' already.
#pragma once
#include <string>
#include <vector>

#include "model/family.hpp"

namespace piper::qwen3 {

std::vector<HfConfigKey> hf_config(const ModelKeyValues& keys, std::vector<std::string>& notes);

}  // namespace piper::qwen3
