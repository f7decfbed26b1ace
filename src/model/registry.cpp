// The registered model families and their segment types: a new family adds one line here and a folder
// of its own (see README.md in this folder).
#include "model/family.hpp"

#include <algorithm>
#include <climits>
#include <utility>

#include "config/model_families.hpp"
#include "config/toml_reader.hpp"
#include "util/error.hpp"

namespace piper {

const std::vector<const Family*>& families() {
  static const std::vector<const Family*> all = {&gpt2_family(), &mlp_family(), &qwen3_family()};
  return all;
}

const Family* find_family(const std::string& kind) {
  for (const Family* f : families())
    if (f->kind == kind) return f;
  return nullptr;
}

std::vector<std::string> family_kinds() {
  std::vector<std::string> kinds;
  for (const Family* f : families()) kinds.push_back(f->kind);
  return kinds;
}

namespace {

// The job loader (config/, a layer below) reads [model] through these readers: registered at start-up by
// every program that links this file, which every program that builds models does.
const bool registered_with_job_loader = [] {
  for (const Family* f : families()) {
    std::vector<std::string> names;
    for (const ModelKey& k : f->keys) names.push_back(k.name);
    register_model_family_reader({f->kind, f->reads_tokens,
                                  [f](TomlReader& r, ModelSpec& spec) { read_model_keys(r, f->keys, spec); }, names});
  }
  return true;
}();

}  // namespace

std::vector<ModelKey> decoder_keys() {
  using D = ModelDims;
  return {int_key<&D::vocab>("vocab", 2, INT32_MAX, "token ids are 0 .. vocab - 1"),
          int_key<&D::seq_len>("seq_len", 1, 1 << 20, "tokens a sequence holds"),
          int_key<&D::d_model>("d_model", 1, 1 << 20, "width of the residual stream"),
          int_key<&D::n_layers>("n_layers", 1, 100000, "transformer layers"),
          int_key<&D::n_heads>("n_heads", 1, 1 << 16, "attention (query) heads")};
}

std::vector<std::pair<std::string, std::string>> model_key_values(const ModelSpec& spec) {
  std::vector<std::pair<std::string, std::string>> out = {{"kind", spec.kind}};
  const Family* f = find_family(spec.kind);
  PIPER_CHECK(f, "unknown model.kind '", spec.kind, "'");
  for (const ModelKey& k : f->keys) out.emplace_back(k.name, model_key_text(k, spec));
  return out;
}

std::string model_keys_text(const ModelSpec& spec) {
  std::string s;
  for (const auto& [k, v] : model_key_values(spec)) s += cat(s.empty() ? "" : " ", k, "=", v);
  return s;
}

std::vector<std::pair<std::string, std::string>> parse_model_keys_text(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(' ', at);
    if (end == std::string::npos) end = text.size();
    std::string word = text.substr(at, end - at);
    if (size_t eq = word.find('='); eq != std::string::npos && eq > 0) out.emplace_back(word.substr(0, eq), word.substr(eq + 1));
    at = end + 1;
  }
  return out;
}

std::vector<std::string> all_model_keys() {
  std::vector<std::string> keys = {"kind"};
  for (const Family* f : families())
    for (const ModelKey& k : f->keys)
      if (std::find(keys.begin(), keys.end(), k.name) == keys.end()) keys.push_back(k.name);
  return keys;
}

const SegmentType* find_segment_type(const std::string& name) {
  for (const Family* f : families())
    for (const SegmentType* t : f->segment_types)
      if (t->name == name) return t;
  return nullptr;
}

}  // namespace piper
