// piper <-> Hugging Face parameter names (see hf_names.hpp). GPT-2: one table of name pairs per block,
// and a transpose for the four Conv1D weights (HF stores them (in, out), piper (out, in) like nn.Linear).
#include "ckpt/hf_names.hpp"

#include <utility>
#include <vector>

#include "util/error.hpp"

namespace piper {

namespace {

struct Pair {
  const char* piper;
  const char* hf;
  bool conv1d;  // HF keeps it transposed
};

// Inside blocks.L. / transformer.h.L.
const std::vector<Pair>& gpt_block_pairs() {
  static const std::vector<Pair> pairs = {
      {"ln1.weight", "ln_1.weight", false},           {"ln1.bias", "ln_1.bias", false},
      {"attn.qkv.weight", "attn.c_attn.weight", true}, {"attn.qkv.bias", "attn.c_attn.bias", false},
      {"attn.proj.weight", "attn.c_proj.weight", true}, {"attn.proj.bias", "attn.c_proj.bias", false},
      {"ln2.weight", "ln_2.weight", false},           {"ln2.bias", "ln_2.bias", false},
      {"mlp.fc.weight", "mlp.c_fc.weight", true},     {"mlp.fc.bias", "mlp.c_fc.bias", false},
      {"mlp.proj.weight", "mlp.c_proj.weight", true}, {"mlp.proj.bias", "mlp.c_proj.bias", false}};
  return pairs;
}

const std::vector<Pair>& gpt_top_pairs() {
  static const std::vector<Pair> pairs = {{"wte", "wte.weight", false},
                                          {"wpe", "wpe.weight", false},
                                          {"ln_f.weight", "ln_f.weight", false},
                                          {"ln_f.bias", "ln_f.bias", false}};
  return pairs;
}

// (rows, cols) → (cols, rows)
NamedTensor transposed(NamedTensor t) {
  PIPER_CHECK(t.shape.size() == 2, "transposing ", t.name, " of rank ", t.shape.size());
  const int64_t R = t.shape[0], C = t.shape[1];
  std::vector<float> out(t.data.size());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) out[size_t(c * R + r)] = t.data[size_t(r * C + c)];
  t.data = std::move(out);
  t.shape = {C, R};
  return t;
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

NamedTensor to_hf(const std::string& kind, const NamedTensor& t) {
  if (kind != "gpt") return t;
  NamedTensor out = t;
  std::string layer, rest;
  if (split_layer(t.name, "blocks.", layer, rest)) {
    for (const Pair& p : gpt_block_pairs())
      if (rest == p.piper) {
        out.name = cat("transformer.h.", layer, ".", p.hf);
        return p.conv1d ? transposed(out) : out;
      }
  }
  for (const Pair& p : gpt_top_pairs())
    if (t.name == p.piper) {
      out.name = cat("transformer.", p.hf);
      return out;
    }
  throw UserError(cat("GPT-2 parameter '", t.name, "' has no Hugging Face name"));
}

NamedTensor from_hf(const std::string& kind, const NamedTensor& t, bool tied_head) {
  NamedTensor skip;
  if (tied_head && t.name == "lm_head.weight") return skip;
  if (kind != "gpt") return t;
  std::string name = starts_with(t.name, "transformer.") ? t.name.substr(12) : t.name;
  std::string layer, rest;
  if (split_layer(name, "h.", layer, rest)) {
    if (rest == "attn.bias" || rest == "attn.masked_bias") return skip;  // the causal mask, not a parameter
    for (const Pair& p : gpt_block_pairs())
      if (rest == p.hf) {
        NamedTensor out = p.conv1d ? transposed(t) : t;
        out.name = cat("blocks.", layer, ".", p.piper);
        return out;
      }
  }
  for (const Pair& p : gpt_top_pairs())
    if (name == p.hf) {
      NamedTensor out = t;
      out.name = p.piper;
      return out;
    }
  NamedTensor unknown = t;  // reported by the caller as a tensor the model does not have
  return unknown;
}

}  // namespace piper
