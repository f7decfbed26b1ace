// The registered model families and their segment types: a new family adds one line here and a folder
// of its own (see README.md in this folder).
#include "model/family.hpp"

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

const SegmentType* find_segment_type(const std::string& name) {
  for (const Family* f : families())
    for (const SegmentType* t : f->segment_types)
      if (t->name == name) return t;
  return nullptr;
}

}  // namespace piper
