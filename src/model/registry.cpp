// The registered model families and their segment types: a new family adds one line here and a folder
// of its own (see README.md in this folder).
#include "model/family.hpp"

#include <algorithm>
#include <charconv>
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
  for (const Family* f : families()) register_model_family_reader({f->kind, f->reads_tokens, f->read_keys, f->keys});
  return true;
}();

}  // namespace

void read_decoder_keys(TomlReader& r, ModelSpec& m) {
  m.vocab = int(r.get_int("vocab", m.vocab, 2, INT32_MAX));
  m.seq_len = int(r.get_int("seq_len", m.seq_len, 1, 1 << 20));
  m.d_model = int(r.get_int("d_model", m.d_model, 1, 1 << 20));
  m.n_layers = int(r.get_int("n_layers", m.n_layers, 1, 100000));
  m.n_heads = int(r.get_int("n_heads", m.n_heads, 1, 1 << 16));
}

namespace {

std::string text_of(int v) { return std::to_string(v); }
std::string text_of(bool v) { return v ? "true" : "false"; }
// Shortest text that reads back as the same double (1e-06, 10000, 0.001).
std::string text_of(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

// Every model key of every family and where ModelDims keeps it.
struct KeyField {
  const char* key;
  std::string (*value)(const ModelDims&);
};
const KeyField kKeyFields[] = {
    {"vocab", [](const ModelDims& d) { return text_of(d.vocab); }},
    {"seq_len", [](const ModelDims& d) { return text_of(d.seq_len); }},
    {"d_model", [](const ModelDims& d) { return text_of(d.d_model); }},
    {"n_layers", [](const ModelDims& d) { return text_of(d.n_layers); }},
    {"n_heads", [](const ModelDims& d) { return text_of(d.n_heads); }},
    {"n_kv_heads", [](const ModelDims& d) { return text_of(d.n_kv_heads); }},
    {"head_dim", [](const ModelDims& d) { return text_of(d.head_dim); }},
    {"d_ff", [](const ModelDims& d) { return text_of(d.d_ff); }},
    {"rope_theta", [](const ModelDims& d) { return text_of(d.rope_theta); }},
    {"norm_eps", [](const ModelDims& d) { return text_of(d.norm_eps); }},
    {"qk_norm", [](const ModelDims& d) { return text_of(d.qk_norm); }},
    {"tie_embeddings", [](const ModelDims& d) { return text_of(d.tie_embeddings); }},
    {"d_in", [](const ModelDims& d) { return text_of(d.d_in); }},
    {"d_hidden", [](const ModelDims& d) { return text_of(d.d_hidden); }},
    {"n_classes", [](const ModelDims& d) { return text_of(d.n_classes); }},
    {"moe.experts", [](const ModelDims& d) { return text_of(d.moe_experts); }},
    {"moe.top_k", [](const ModelDims& d) { return text_of(d.moe_top_k); }},
    {"moe.d_expert", [](const ModelDims& d) { return text_of(d.moe_d_expert); }},
    {"moe.every", [](const ModelDims& d) { return text_of(d.moe_every); }},
    {"moe.norm_topk_prob", [](const ModelDims& d) { return text_of(d.moe_norm_topk_prob); }},
    {"moe.aux_loss_coef", [](const ModelDims& d) { return text_of(d.moe_aux_loss_coef); }},
    {"moe.capacity_factor", [](const ModelDims& d) { return text_of(d.moe_capacity_factor); }},
};

}  // namespace

std::vector<std::pair<std::string, std::string>> model_key_values(const ModelSpec& spec) {
  std::vector<std::pair<std::string, std::string>> out = {{"kind", spec.kind}};
  const Family* f = find_family(spec.kind);
  PIPER_CHECK(f, "unknown model.kind '", spec.kind, "'");
  for (const std::string& key : f->keys) {
    const KeyField* field = nullptr;
    for (const KeyField& k : kKeyFields)
      if (key == k.key) field = &k;
    PIPER_CHECK(field, "model key '", key, "' of family ", f->kind, " has no entry in kKeyFields");
    out.emplace_back(key, field->value(spec));
  }
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
    for (const std::string& k : f->keys)
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  return keys;
}

const SegmentType* find_segment_type(const std::string& name) {
  for (const Family* f : families())
    for (const SegmentType* t : f->segment_types)
      if (t->name == name) return t;
  return nullptr;
}

}  // namespace piper
