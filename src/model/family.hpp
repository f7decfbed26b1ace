// The registry of model families. A family reads its [model] keys, builds a Model (segments of its
// registered segment types, named parameters, FLOPs) and lists its segment types. See README.md here.
#pragma once
#include <string>
#include <vector>

#include "config/job.hpp"
#include "model/model.hpp"
#include "model/segment_type.hpp"

namespace piper {

class TomlReader;

struct Family {
  std::string kind;           // model.kind
  bool reads_tokens = true;   // needs data.path (a token file); else a synthetic task
  // Reads and checks the family's keys of [model] into `spec` (errors through the reader).
  void (*read_keys)(TomlReader& r, ModelSpec& spec) = nullptr;
  Model (*build)(const ModelSpec& spec) = nullptr;
  std::vector<const SegmentType*> segment_types;
  // Every [model] key read_keys reads, in order ("moe.experts" for [model.moe]): a checkpoint records their
  // values and --resume compares them (model_key_values). A key new to all families adds a line to
  // model_key_value in registry.cpp.
  std::vector<std::string> keys;
};

// Reads the keys every decoder-only transformer family shares: vocab, seq_len, d_model, n_layers, n_heads.
void read_decoder_keys(TomlReader& r, ModelSpec& spec);

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
