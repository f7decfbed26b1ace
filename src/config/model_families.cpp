// The registry of model family readers (see model_families.hpp).
#include "config/model_families.hpp"

#include <algorithm>

#include "util/error.hpp"

namespace piper {

namespace {

std::vector<ModelFamilyReader>& readers() {
  static std::vector<ModelFamilyReader> all;  // constructed on first use: registration may run at start-up
  return all;
}

}  // namespace

void register_model_family_reader(const ModelFamilyReader& reader) {
  for (ModelFamilyReader& r : readers())
    if (r.kind == reader.kind) {
      r = reader;
      return;
    }
  readers().push_back(reader);
}

const ModelFamilyReader* find_model_family_reader(const std::string& kind) {
  for (const ModelFamilyReader& r : readers())
    if (r.kind == kind) return &r;
  return nullptr;
}

std::vector<std::string> model_family_reader_kinds() {
  if (readers().empty()) throw SystemError("no model family is registered (the model layer is not linked in)");
  std::vector<std::string> kinds;
  for (const ModelFamilyReader& r : readers()) kinds.push_back(r.kind);
  return kinds;
}

std::vector<std::string> model_family_reader_keys() {
  std::vector<std::string> keys = {"kind"};
  for (const ModelFamilyReader& r : readers())
    for (const std::string& k : r.keys)
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  return keys;
}

}  // namespace piper
