// The Hugging Face config.json of a piper model, for exported model folders, and its comparison with a job's model
// on import: the keys come from the model's family (Family::hf_config), the values from the model's own keys.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "model/family.hpp"

namespace piper {

// config.json's text from the checkpoint's model keys ("key=value" pairs of model_keys_text, defaults included);
// torch_dtype "float32" or "bfloat16". Throws UserError for a family without a transformers class (mlp) or a model
// its class cannot express (the family names the key). `notes` gets one line per setting transformers ignores.
std::string hf_config_json(const ModelKeyValues& model_keys, const std::string& torch_dtype,
                           std::vector<std::string>& notes);

// Where a model folder's config.json (the text of file `path`) disagrees with the model of a job (its model keys):
// one line per key that shapes the model (HfConfigKey::shapes), naming the transformers key and piper's, and both
// values; empty when they agree. Keys the file leaves out or sets to null are not compared; an `at_least` key
// (max_position_embeddings) may exceed the job's value. Throws UserError when the text is not a JSON object.
std::vector<std::string> hf_config_mismatches(const std::string& text, const std::string& path,
                                              const ModelKeyValues& model_keys);

}  // namespace piper
