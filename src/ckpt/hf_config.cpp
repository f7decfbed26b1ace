// config.json for Hugging Face model folders (hf_config.hpp): the model's family lists the keys
// (Family::hf_config), written here through nlohmann-json in that order, and compared key by key on import.
#include "ckpt/hf_config.hpp"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "model/family.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

using Json = nlohmann::ordered_json;

// The family's config.json keys for these model keys, or a UserError where there is no transformers class.
std::vector<HfConfigKey> config_keys(const ModelKeyValues& model_keys, std::vector<std::string>& notes) {
  std::string kind;
  for (const auto& [k, v] : model_keys)
    if (k == "kind") kind = v;
  const Family* family = find_family(kind);
  if (!family || !family->hf_config)
    throw UserError(cat("model.kind = \"", kind, "\" has no Hugging Face model class; export to a .safetensors file ",
                        "instead of a folder"));
  return family->hf_config(model_keys, notes);
}

bool same_value(const Json& a, const Json& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    return x == y || std::abs(x - y) <= 1e-9 * std::max(std::abs(x), std::abs(y));
  }
  return a == b;
}

}  // namespace

std::string hf_config_json(const ModelKeyValues& model_keys, const std::string& torch_dtype,
                           std::vector<std::string>& notes) {
  Json c = Json::object();
  try {
    for (const HfConfigKey& k : config_keys(model_keys, notes)) c[k.name] = Json::parse(k.json);
  } catch (const UserError& e) {
    throw UserError(cat("export: ", e.what()));
  }
  c["torch_dtype"] = torch_dtype;
  c["transformers_version"] = "4.51.0";  // the first release with Qwen3
  return c.dump(2) + "\n";
}

std::vector<std::string> hf_config_mismatches(const std::string& text, const std::string& path,
                                              const ModelKeyValues& model_keys) {
  Json theirs;
  try {
    theirs = Json::parse(text);
  } catch (const Json::exception& e) {  // a syntax error, or a number past what it holds
    throw UserError(cat(path, ": not JSON (", e.what(), ")"));
  }
  if (!theirs.is_object()) throw UserError(cat(path, ": not a JSON object"));
  // transformers 5 writes the rope base inside rope_parameters
  if (!theirs.contains("rope_theta") && theirs.contains("rope_parameters") && theirs["rope_parameters"].is_object() &&
      theirs["rope_parameters"].contains("rope_theta"))
    theirs["rope_theta"] = theirs["rope_parameters"]["rope_theta"];
  std::vector<std::string> notes, out;
  for (const HfConfigKey& k : config_keys(model_keys, notes)) {
    if (!k.shapes || !theirs.contains(k.name) || theirs[k.name].is_null()) continue;  // absent: transformers' default
    const Json& t = theirs[k.name];
    const Json ours = Json::parse(k.json);
    const std::string who = k.piper_key.empty() ? std::string("piper's fixed choice") : cat("model.", k.piper_key);
    const bool fits = k.at_least && t.is_number() && ours.is_number() ? t.get<double>() >= ours.get<double>()
                                                                      : same_value(t, ours);
    if (!fits)
      out.push_back(cat(path, ": ", k.name, " = ", t.dump(), " but the job's model has ", ours.dump(), " (", who,
                        k.at_least ? ", at most" : "", ")"));
  }
  return out;
}

}  // namespace piper
