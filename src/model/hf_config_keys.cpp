// HfConfigBuilder (hf_config_keys.hpp): model key values turned into config.json keys, their JSON through
// nlohmann-json.
#include "model/hf_config_keys.hpp"

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "util/error.hpp"

namespace piper {

HfConfigBuilder::HfConfigBuilder(const ModelKeyValues& keys) {
  for (const auto& [k, v] : keys) values_[k] = v;
}

const std::string& HfConfigBuilder::value(const std::string& piper_key) const {
  auto it = values_.find(piper_key);
  if (it == values_.end()) throw UserError(cat("the model has no key '", piper_key, "'"));
  return it->second;
}

double HfConfigBuilder::number(const std::string& piper_key) const {
  return std::strtod(value(piper_key).c_str(), nullptr);
}

int64_t HfConfigBuilder::integer(const std::string& piper_key) const {
  return std::strtoll(value(piper_key).c_str(), nullptr, 10);
}

bool HfConfigBuilder::flag(const std::string& piper_key) const { return value(piper_key) == "true"; }

void HfConfigBuilder::follow(const std::string& name, const std::string& piper_key, bool at_least, bool shapes) {
  const std::string& v = value(piper_key);
  nlohmann::json j;
  char* end = nullptr;
  const long long i = std::strtoll(v.c_str(), &end, 10);
  if (v == "true" || v == "false") j = v == "true";
  else if (end && *end == '\0' && !v.empty()) j = int64_t(i);
  else j = number(piper_key);
  out_.push_back({name, j.dump(), piper_key, shapes, at_least});
}

void HfConfigBuilder::follow_number(const std::string& name, const std::string& piper_key, bool shapes) {
  out_.push_back({name, nlohmann::json(number(piper_key)).dump(), piper_key, shapes, false});
}

void HfConfigBuilder::fixed(const std::string& name, const std::string& json, bool shapes) {
  out_.push_back({name, json, "", shapes, false});
}

}  // namespace piper
