// GPT-2 as Hugging Face's GPT2LMHeadModel: parameter names both ways (Family::to_hf / from_hf; names taken with or
// without the "transformer." prefix, the causal-mask buffers not parameters) and config.json (Family::hf_config).
#pragma once
#include <string>

#include "model/family.hpp"

namespace piper::gpt2 {

HfName to_hf(const std::string& piper_name);
HfName from_hf(const std::string& hf_name);
std::vector<HfConfigKey> hf_config(const ModelKeyValues& keys, std::vector<std::string>& notes);

}  // namespace piper::gpt2
