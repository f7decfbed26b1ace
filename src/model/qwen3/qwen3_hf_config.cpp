// Qwen3's config.json for transformers (qwen3_hf_config.hpp): every key its classes read, from the model's keys;
// what transformers cannot express is refused, what it ignores (an expert capacity) is noted.
#include "model/qwen3/qwen3_hf_config.hpp"

#include "model/hf_config_keys.hpp"
#include "util/error.hpp"

namespace piper::qwen3 {

std::vector<HfConfigKey> hf_config(const ModelKeyValues& keys, std::vector<std::string>& notes) {
  HfConfigBuilder c(keys);
  if (!c.flag("qk_norm"))
    throw UserError("model.qk_norm = false has no transformers equivalent (Qwen3 always normalizes q and k)");
  const bool moe = c.has("moe.experts") && c.integer("moe.experts") > 0;
  c.fixed("architectures", moe ? R"(["Qwen3MoeForCausalLM"])" : R"(["Qwen3ForCausalLM"])");
  c.fixed("model_type", moe ? R"("qwen3_moe")" : R"("qwen3")", true);
  c.follow("vocab_size", "vocab");
  c.follow("hidden_size", "d_model");
  c.follow("intermediate_size", "d_ff");
  c.follow("num_hidden_layers", "n_layers");
  c.follow("num_attention_heads", "n_heads");
  c.follow("num_key_value_heads", "n_kv_heads");
  c.follow("head_dim", "head_dim");
  c.follow("max_position_embeddings", "seq_len", true);
  c.follow_number("rms_norm_eps", "norm_eps");
  c.follow_number("rope_theta", "rope_theta");
  c.fixed("rope_scaling", "null", true);
  c.follow("tie_word_embeddings", "tie_embeddings");
  c.fixed("hidden_act", R"("silu")", true);
  c.fixed("attention_bias", "false", true);
  c.fixed("attention_dropout", "0.0");
  c.fixed("use_sliding_window", "false");
  c.fixed("initializer_range", "0.02");
  if (!moe) return c.take();
  if (c.integer("moe.shared_experts") > 0)
    throw UserError("model.moe.shared_experts > 0 has no Qwen3MoeForCausalLM equivalent (it has none)");
  if (c.number("moe.bias_update_rate") > 0)
    throw UserError("model.moe.bias_update_rate > 0 (a router selection bias) has no Qwen3MoeForCausalLM equivalent");
  if (c.number("moe.capacity_factor") > 0)
    notes.push_back(cat("model.moe.capacity_factor = ", c.value("moe.capacity_factor"), " is not in config.json: ",
                        "transformers routes every token to its experts (dropless)"));
  c.follow("num_experts", "moe.experts");
  c.follow("num_experts_per_tok", "moe.top_k");
  c.follow("moe_intermediate_size", "moe.d_expert");
  c.follow("decoder_sparse_step", "moe.every");  // with no mlp_only_layers: layer i is sparse when (i+1) % step == 0
  c.fixed("mlp_only_layers", "[]", true);
  c.follow("norm_topk_prob", "moe.norm_topk_prob");
  c.follow_number("router_aux_loss_coef", "moe.aux_loss_coef", false);  // a training setting, not compared
  c.fixed("output_router_logits", "false");
  return c.take();
}

}  // namespace piper::qwen3
