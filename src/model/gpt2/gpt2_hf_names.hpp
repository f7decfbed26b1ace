// GPT-2's parameter names to and from Hugging Face's GPT2LMHeadModel (Family::to_hf / from_hf): names
// are taken with or without the "transformer." prefix; the causal-mask buffers are not parameters.
#pragma once
#include <string>

#include "model/family.hpp"

namespace piper::gpt2 {

HfName to_hf(const std::string& piper_name);
HfName from_hf(const std::string& hf_name);

}  // namespace piper::gpt2
