// The registered model families and their segment types: a new family adds one line here and a folder
// of its own (see README.md in this folder).
#include "model/family.hpp"

#include "config/toml_reader.hpp"

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

void read_decoder_keys(TomlReader& r, ModelSpec& m) {
  m.vocab = int(r.get_int("vocab", m.vocab, 2, INT32_MAX));
  m.seq_len = int(r.get_int("seq_len", m.seq_len, 1, 1 << 20));
  m.d_model = int(r.get_int("d_model", m.d_model, 1, 1 << 20));
  m.n_layers = int(r.get_int("n_layers", m.n_layers, 1, 100000));
  m.n_heads = int(r.get_int("n_heads", m.n_heads, 1, 1 << 16));
}

const SegmentType* find_segment_type(const std::string& name) {
  for (const Family* f : families())
    for (const SegmentType* t : f->segment_types)
      if (t->name == name) return t;
  return nullptr;
}

}  // namespace piper
