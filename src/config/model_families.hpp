// The model families as the job loader sees them: each kind, whether it trains on a token file, and the
// reader of its [model] keys. The model layer (above config) registers its families here at start-up.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "config/job.hpp"
#include "config/toml_reader.hpp"

namespace piper {

struct ModelFamilyReader {
  std::string kind;                                     // model.kind
  bool reads_tokens = true;                             // needs data.path (a token file)
  std::function<void(TomlReader& r, ModelSpec& spec)> read_keys;  // the family's keys of [model], checked
  std::vector<std::string> keys;                        // every key read_keys reads ("moe.experts")
};

// Adds (or replaces) the reader of `reader.kind`.
void register_model_family_reader(const ModelFamilyReader& reader);
// The reader of `kind`, or null.
const ModelFamilyReader* find_model_family_reader(const std::string& kind);
// Every registered kind, in registration order. Throws SystemError when none is registered (the model
// layer is not linked into this program).
std::vector<std::string> model_family_reader_kinds();
// "kind" and every key of every registered family, each once, in registration order.
std::vector<std::string> model_family_reader_keys();

}  // namespace piper
