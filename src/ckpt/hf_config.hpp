// The Hugging Face config.json of a piper model, for exported model folders: GPT2LMHeadModel for "gpt",
// Qwen3ForCausalLM or Qwen3MoeForCausalLM for "qwen3" (every key transformers reads, from the model's own keys).
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace piper {

// config.json's text from the checkpoint's model keys ("key=value" pairs of model_keys_text, defaults included);
// torch_dtype "float32" or "bfloat16". Throws UserError naming the key for a model transformers cannot express
// (the mlp family, qk_norm = false, shared experts, a router selection bias). `notes` gets one line per setting
// that transformers ignores (an expert capacity: it routes without dropping).
std::string hf_config_json(const std::vector<std::pair<std::string, std::string>>& model_keys,
                           const std::string& torch_dtype, std::vector<std::string>& notes);

// Where a model folder's config.json (the text of file `path`) disagrees with the model of a job (its model keys):
// one line per key that shapes the model, naming the transformers key and piper's, and both values; empty when
// they agree. Keys the file leaves out take transformers' meaning as absent and are not compared; the file's
// max_position_embeddings need only cover the job's seq_len. Throws UserError when the text is not a JSON object.
std::vector<std::string> hf_config_mismatches(const std::string& text, const std::string& path,
                                              const std::vector<std::pair<std::string, std::string>>& model_keys);

}  // namespace piper
