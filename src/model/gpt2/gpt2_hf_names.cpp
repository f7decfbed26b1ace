// GPT-2's parameter names as Hugging Face's GPT2LMHeadModel has them: one table of name pairs per block
// and one for the rest; the four Conv1D weights are stored transposed there, (in, out). And its config.json.
#include "model/gpt2/gpt2_hf_names.hpp"

#include <vector>

#include "model/hf_config_keys.hpp"
#include "util/error.hpp"

namespace piper::gpt2 {

namespace {

struct Pair {
  const char* piper;
  const char* hf;
  bool conv1d;  // HF keeps it transposed
};

// Inside blocks.L. / transformer.h.L.
const std::vector<Pair>& block_pairs() {
  static const std::vector<Pair> pairs = {
      {"ln1.weight", "ln_1.weight", false},           {"ln1.bias", "ln_1.bias", false},
      {"attn.qkv.weight", "attn.c_attn.weight", true}, {"attn.qkv.bias", "attn.c_attn.bias", false},
      {"attn.proj.weight", "attn.c_proj.weight", true}, {"attn.proj.bias", "attn.c_proj.bias", false},
      {"ln2.weight", "ln_2.weight", false},           {"ln2.bias", "ln_2.bias", false},
      {"mlp.fc.weight", "mlp.c_fc.weight", true},     {"mlp.fc.bias", "mlp.c_fc.bias", false},
      {"mlp.proj.weight", "mlp.c_proj.weight", true}, {"mlp.proj.bias", "mlp.c_proj.bias", false}};
  return pairs;
}

const std::vector<Pair>& top_pairs() {
  static const std::vector<Pair> pairs = {{"wte", "wte.weight", false},
                                          {"wpe", "wpe.weight", false},
                                          {"ln_f.weight", "ln_f.weight", false},
                                          {"ln_f.bias", "ln_f.bias", false}};
  return pairs;
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// "blocks.12.rest" → (12, "rest"); false when `name` is not under prefix + number + ".".
bool split_layer(const std::string& name, const std::string& prefix, std::string& layer, std::string& rest) {
  if (!starts_with(name, prefix)) return false;
  size_t i = prefix.size(), j = i;
  while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j >= name.size() || name[j] != '.') return false;
  layer = name.substr(i, j - i);
  rest = name.substr(j + 1);
  return true;
}

}  // namespace

HfName to_hf(const std::string& name) {
  std::string layer, rest;
  if (split_layer(name, "blocks.", layer, rest))
    for (const Pair& p : block_pairs())
      if (rest == p.piper) return {cat("transformer.h.", layer, ".", p.hf), p.conv1d};
  for (const Pair& p : top_pairs())
    if (name == p.piper) return {cat("transformer.", p.hf), false};
  return {};
}

HfName from_hf(const std::string& hf_name) {
  const std::string name = starts_with(hf_name, "transformer.") ? hf_name.substr(12) : hf_name;
  std::string layer, rest;
  if (split_layer(name, "h.", layer, rest)) {
    if (rest == "attn.bias" || rest == "attn.masked_bias") return {};  // the causal mask, not a parameter
    for (const Pair& p : block_pairs())
      if (rest == p.hf) return {cat("blocks.", layer, ".", p.piper), p.conv1d};
  }
  for (const Pair& p : top_pairs())
    if (name == p.hf) return {p.piper, false};
  return {hf_name, false};  // reported by the caller as a tensor the model does not have
}

std::vector<HfConfigKey> hf_config(const ModelKeyValues& keys, std::vector<std::string>&) {
  HfConfigBuilder c(keys);
  c.fixed("architectures", R"(["GPT2LMHeadModel"])");
  c.fixed("model_type", R"("gpt2")", true);
  c.follow("vocab_size", "vocab");
  c.follow("n_positions", "seq_len");
  c.follow("n_embd", "d_model");
  c.follow("n_layer", "n_layers");
  c.follow("n_head", "n_heads");
  c.follow("n_inner", "d_ff");
  c.fixed("activation_function", R"("gelu_new")", true);  // the tanh approximation piper's GELU is
  c.fixed("layer_norm_epsilon", "1e-05", true);
  for (const char* p : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) c.fixed(p, "0.0");
  c.fixed("tie_word_embeddings", "true", true);
  c.fixed("bos_token_id", "null");
  c.fixed("eos_token_id", "null");
  return c.take();
}

}  // namespace piper::gpt2
