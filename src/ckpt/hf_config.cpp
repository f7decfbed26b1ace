// config.json for Hugging Face model folders (hf_config.hpp), written through nlohmann-json in transformers'
// own key order; the values come from the checkpoint's model keys, so nothing is transcribed by hand.
#include "ckpt/hf_config.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

#include "util/error.hpp"

namespace piper {

namespace {

using Json = nlohmann::ordered_json;

struct Keys {
  std::map<std::string, std::string> v;
  const std::string& at(const std::string& k) const {
    auto it = v.find(k);
    if (it == v.end()) throw UserError(cat("export: the checkpoint's model has no key '", k, "'"));
    return it->second;
  }
  int64_t i(const std::string& k) const { return std::stoll(at(k)); }
  double f(const std::string& k) const { return std::stod(at(k)); }
  bool b(const std::string& k) const { return at(k) == "true"; }
  bool has(const std::string& k) const { return v.count(k) > 0; }
};

Json gpt2(const Keys& m) {
  return Json{{"architectures", {"GPT2LMHeadModel"}},
              {"model_type", "gpt2"},
              {"vocab_size", m.i("vocab")},
              {"n_positions", m.i("seq_len")},
              {"n_embd", m.i("d_model")},
              {"n_layer", m.i("n_layers")},
              {"n_head", m.i("n_heads")},
              {"n_inner", m.i("d_ff")},
              {"activation_function", "gelu_new"},  // the tanh approximation piper's GELU is
              {"layer_norm_epsilon", 1e-5},
              {"resid_pdrop", 0.0},
              {"embd_pdrop", 0.0},
              {"attn_pdrop", 0.0},
              {"tie_word_embeddings", true},
              {"bos_token_id", nullptr},
              {"eos_token_id", nullptr}};
}

Json qwen3(const Keys& m, std::vector<std::string>& notes) {
  if (!m.b("qk_norm"))
    throw UserError("export: model.qk_norm = false has no transformers equivalent (Qwen3 always normalizes q and k)");
  const bool moe = m.has("moe.experts") && m.i("moe.experts") > 0;
  Json c{{"architectures", {moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"}},
         {"model_type", moe ? "qwen3_moe" : "qwen3"},
         {"vocab_size", m.i("vocab")},
         {"hidden_size", m.i("d_model")},
         {"intermediate_size", m.i("d_ff")},
         {"num_hidden_layers", m.i("n_layers")},
         {"num_attention_heads", m.i("n_heads")},
         {"num_key_value_heads", m.i("n_kv_heads")},
         {"head_dim", m.i("head_dim")},
         {"max_position_embeddings", m.i("seq_len")},
         {"rms_norm_eps", m.f("norm_eps")},
         {"rope_theta", m.f("rope_theta")},
         {"rope_scaling", nullptr},
         {"tie_word_embeddings", m.b("tie_embeddings")},
         {"hidden_act", "silu"},
         {"attention_bias", false},
         {"attention_dropout", 0.0},
         {"use_sliding_window", false},
         {"initializer_range", 0.02}};
  if (!moe) return c;
  if (m.i("moe.shared_experts") > 0)
    throw UserError("export: model.moe.shared_experts > 0 has no Qwen3MoeForCausalLM equivalent (it has none)");
  if (m.f("moe.bias_update_rate") > 0)
    throw UserError("export: model.moe.bias_update_rate > 0 (a router selection bias) has no Qwen3MoeForCausalLM "
                    "equivalent");
  if (m.f("moe.capacity_factor") > 0)
    notes.push_back(cat("model.moe.capacity_factor = ", m.at("moe.capacity_factor"), " is not in config.json: ",
                        "transformers routes every token to its experts (dropless)"));
  c["num_experts"] = m.i("moe.experts");
  c["num_experts_per_tok"] = m.i("moe.top_k");
  c["moe_intermediate_size"] = m.i("moe.d_expert");
  c["decoder_sparse_step"] = m.i("moe.every");  // with no mlp_only_layers: layer i is sparse when (i+1) % step == 0
  c["mlp_only_layers"] = Json::array();
  c["norm_topk_prob"] = m.b("moe.norm_topk_prob");
  c["router_aux_loss_coef"] = m.f("moe.aux_loss_coef");
  c["output_router_logits"] = false;
  return c;
}

// transformers' key → piper's, for the keys that shape the model (what import compares)
const std::vector<std::pair<const char*, const char*>>& shaping_keys(const std::string& kind) {
  static const std::vector<std::pair<const char*, const char*>> gpt = {
      {"model_type", "kind"},        {"vocab_size", "vocab"},  {"n_positions", "seq_len"},
      {"n_embd", "d_model"},         {"n_layer", "n_layers"},  {"n_head", "n_heads"},
      {"n_inner", "d_ff"},           {"activation_function", ""}, {"layer_norm_epsilon", ""}};
  static const std::vector<std::pair<const char*, const char*>> qwen = {
      {"model_type", "kind"},
      {"vocab_size", "vocab"},
      {"hidden_size", "d_model"},
      {"intermediate_size", "d_ff"},
      {"num_hidden_layers", "n_layers"},
      {"num_attention_heads", "n_heads"},
      {"num_key_value_heads", "n_kv_heads"},
      {"head_dim", "head_dim"},
      {"rms_norm_eps", "norm_eps"},
      {"rope_theta", "rope_theta"},
      {"rope_scaling", ""},
      {"tie_word_embeddings", "tie_embeddings"},
      {"hidden_act", ""},
      {"attention_bias", ""},
      {"num_experts", "moe.experts"},
      {"num_experts_per_tok", "moe.top_k"},
      {"moe_intermediate_size", "moe.d_expert"},
      {"decoder_sparse_step", "moe.every"},
      {"mlp_only_layers", ""},
      {"norm_topk_prob", "moe.norm_topk_prob"}};
  return kind == "gpt" ? gpt : qwen;
}

bool same_value(const Json& a, const Json& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    return x == y || std::abs(x - y) <= 1e-9 * std::max(std::abs(x), std::abs(y));
  }
  return a == b;
}

}  // namespace

std::vector<std::string> hf_config_mismatches(const std::string& text, const std::string& path,
                                              const std::vector<std::pair<std::string, std::string>>& model_keys) {
  Json theirs;
  try {
    theirs = Json::parse(text);
  } catch (const Json::parse_error& e) {
    throw UserError(cat(path, ": not JSON (", e.what(), ")"));
  }
  if (!theirs.is_object()) throw UserError(cat(path, ": not a JSON object"));
  std::vector<std::string> notes;
  const Json ours = Json::parse(hf_config_json(model_keys, "float32", notes));
  Keys m;
  for (const auto& [k, v] : model_keys) m.v[k] = v;
  // transformers 5 writes the rope base inside rope_parameters
  if (!theirs.contains("rope_theta") && theirs.contains("rope_parameters") && theirs["rope_parameters"].is_object() &&
      theirs["rope_parameters"].contains("rope_theta"))
    theirs["rope_theta"] = theirs["rope_parameters"]["rope_theta"];
  if (theirs.contains("n_inner") && theirs["n_inner"].is_null() && theirs.contains("n_embd") &&
      theirs["n_embd"].is_number())
    theirs["n_inner"] = 4 * theirs["n_embd"].get<int64_t>();  // GPT-2's null: 4 n_embd
  std::vector<std::string> out;
  for (const auto& [hf, piper] : shaping_keys(m.at("kind"))) {
    if (!theirs.contains(hf) || !ours.contains(hf)) continue;
    const Json& t = theirs[hf];
    const Json& o = ours[hf];
    const std::string who = *piper ? cat("model.", piper) : std::string("piper's fixed choice");
    if (std::string(hf) == "max_position_embeddings") continue;
    if (!same_value(t, o))
      out.push_back(cat(path, ": ", hf, " = ", t.dump(), " but the job's model has ", o.dump(), " (", who, ")"));
  }
  if (theirs.contains("max_position_embeddings") && theirs["max_position_embeddings"].is_number() &&
      theirs["max_position_embeddings"].get<double>() < double(m.i("seq_len")))
    out.push_back(cat(path, ": max_position_embeddings = ", theirs["max_position_embeddings"].dump(),
                      " is shorter than the job's model.seq_len = ", m.at("seq_len")));
  return out;
}

std::string hf_config_json(const std::vector<std::pair<std::string, std::string>>& model_keys,
                           const std::string& torch_dtype, std::vector<std::string>& notes) {
  Keys m;
  for (const auto& [k, v] : model_keys) m.v[k] = v;
  const std::string kind = m.at("kind");
  Json c;
  if (kind == "gpt") c = gpt2(m);
  else if (kind == "qwen3") c = qwen3(m, notes);
  else throw UserError(cat("export: model.kind = \"", kind, "\" has no Hugging Face model class; export to a ",
                           ".safetensors file instead of a folder"));
  c["torch_dtype"] = torch_dtype;
  c["transformers_version"] = "4.51.0";  // the first release with Qwen3
  return c.dump(2) + "\n";
}

}  // namespace piper
