// The registry of model families. A family lists its [model] keys, builds a Model (segments of its
// registered segment types, named parameters, FLOPs) and lists its segment types. See README.md here.
#pragma once
#include <string>
#include <vector>

#include "config/job.hpp"
#include "model/model.hpp"
#include "model/model_keys.hpp"
#include "model/segment_type.hpp"

namespace piper {

// A parameter as Hugging Face transformers names and lays it out.
struct HfName {
  std::string name;
  bool transposed = false;  // stored (in, out) where piper keeps (out, in): GPT-2's Conv1D weights
};

// One key of a Hugging Face config.json for a model of the family.
struct HfConfigKey {
  std::string name;       // transformers' key
  std::string json;       // its value, as JSON text
  std::string piper_key;  // the model key it follows ("" for a choice piper fixes)
  bool shapes = false;    // it shapes the model: an imported folder's config.json must agree
  bool at_least = false;  // a bound the file's value may exceed (max_position_embeddings over seq_len)
};
// The model keys as "key=value" pairs (model_key_values), for the functions below.
using ModelKeyValues = std::vector<std::pair<std::string, std::string>>;

struct Family {
  std::string kind;           // model.kind
  bool reads_tokens = true;   // needs data.path (a token file); else a synthetic task
  // Its [model] keys in reading order (model_keys.hpp): the job loader reads them, checkpoints record
  // their values, --resume compares them, the plan check holds a plan's dimensions to them.
  std::vector<ModelKey> keys;
  Model (*build)(const ModelSpec& spec) = nullptr;
  std::vector<const SegmentType*> segment_types;
  // Hugging Face's name of a parameter, and of a Hugging Face tensor piper's (null: the names are the
  // same). to_hf gives an empty name for a parameter Hugging Face lacks; from_hf an empty name for what
  // piper does not keep (buffers), and the name unchanged for one it does not know.
  HfName (*to_hf)(const std::string& piper_name) = nullptr;
  HfName (*from_hf)(const std::string& hf_name) = nullptr;
  // config.json of the family's transformers class for a model (null: there is none), in transformers' key order.
  // Throws UserError naming the key for a model transformers cannot express; `notes` gets a line per setting it
  // ignores.
  std::vector<HfConfigKey> (*hf_config)(const ModelKeyValues& keys, std::vector<std::string>& notes) = nullptr;
};

// The keys every decoder-only transformer family starts with: vocab, seq_len, d_model, n_layers, n_heads.
std::vector<ModelKey> decoder_keys();

// The model as "key=value" pairs: model.kind, then each key of its family with the value in effect (defaults
// included), written as in a job file: "kind=gpt vocab=256 ... d_ff=1024" by model_keys_text. Checkpoints
// store this text; --resume compares it key by key.
std::vector<std::pair<std::string, std::string>> model_key_values(const ModelSpec& spec);
std::string model_keys_text(const ModelSpec& spec);
// The inverse of model_keys_text (pairs in their order); words without '=' are skipped.
std::vector<std::pair<std::string, std::string>> parse_model_keys_text(const std::string& text);
// "kind" and every key of every family, each once: what checkpoint.allow_changes may name as model.KEY.
std::vector<std::string> all_model_keys();

// Every registered family, in registry order.
const std::vector<const Family*>& families();
// The family of that kind, or null.
const Family* find_family(const std::string& kind);
std::vector<std::string> family_kinds();

// The families (one function each, defined in their folders).
const Family& gpt2_family();
const Family& mlp_family();
const Family& qwen3_family();

}  // namespace piper
