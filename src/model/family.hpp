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
};

// Reads the keys every decoder-only transformer family shares: vocab, seq_len, d_model, n_layers, n_heads.
void read_decoder_keys(TomlReader& r, ModelSpec& spec);

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
