// Building a family's Hugging Face config.json keys (Family::hf_config) from a model's key values: keys that
// follow a piper key (their JSON type taken from its value), and keys piper fixes.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/family.hpp"

namespace piper {

class HfConfigBuilder {
 public:
  explicit HfConfigBuilder(const ModelKeyValues& keys);
  // A model key's value as written (UserError when the model has no such key), as a number, an integer, a flag.
  const std::string& value(const std::string& piper_key) const;
  double number(const std::string& piper_key) const;
  int64_t integer(const std::string& piper_key) const;
  bool flag(const std::string& piper_key) const;
  bool has(const std::string& piper_key) const { return values_.count(piper_key) > 0; }
  // `name` = the value of `piper_key` (true/false, an integer, or a number as written there); `shapes`: an imported
  // config.json must agree (or, `at_least`, may hold more)
  void follow(const std::string& name, const std::string& piper_key, bool at_least = false, bool shapes = true);
  // the same for a key transformers reads as a float (written 10000.0, not 10000)
  void follow_number(const std::string& name, const std::string& piper_key, bool shapes = true);
  // `name` = `json`, a choice piper fixes; `shapes`: an imported config.json must agree with it
  void fixed(const std::string& name, const std::string& json, bool shapes = false);
  std::vector<HfConfigKey> take() { return std::move(out_); }

 private:
  std::map<std::string, std::string> values_;
  std::vector<HfConfigKey> out_;
};

}  // namespace piper
