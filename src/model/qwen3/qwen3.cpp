// The Qwen3 family (model.kind = "qwen3"): its [model] keys, parameters under Hugging Face's state-dict
// names (Qwen3ForCausalLM), segments (embedding, attention | MLP halves of each layer, head) and FLOPs.
#include <cmath>
#include <memory>

#include "config/toml_reader.hpp"
#include "model/family.hpp"
#include "model/qwen3/qwen3_segments.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

void read_keys(TomlReader& r, ModelSpec& m) {
  read_decoder_keys(r, m);
  m.n_kv_heads = int(r.get_int("n_kv_heads", m.n_heads, 1, 1 << 16));
  if (m.n_heads % m.n_kv_heads != 0)
    r.error_msg("n_kv_heads", cat("n_kv_heads (", m.n_kv_heads, ") must divide n_heads (", m.n_heads, ")"));
  if (!r.has("head_dim") && m.d_model % m.n_heads != 0)
    r.error_msg(r.has("n_heads") ? "n_heads" : "d_model",
                cat("n_heads (", m.n_heads, ") must divide d_model (", m.d_model, ") unless head_dim is given"));
  m.head_dim = int(r.get_int("head_dim", m.d_model / m.n_heads, 2, 1 << 16));
  if (m.head_dim % 2 != 0)
    r.error_msg("head_dim", cat("head_dim (", m.head_dim, ") must be even: RoPE rotates pairs of dimensions"));
  m.d_ff = int(r.get_int("d_ff", m.d_ff, 1, 1 << 22));
  m.rope_theta = r.get_float("rope_theta", 1e6, 0.0, 1e12, true);
  m.norm_eps = r.get_float("norm_eps", 1e-6, 0.0, 1.0, true);
  m.qk_norm = r.get_bool("qk_norm", true);
  m.tie_embeddings = r.get_bool("tie_embeddings", false);
  std::unique_ptr<TomlReader> moe;
  if (r.sub_table("moe", moe)) {
    m.moe_experts = int(moe->get_int("experts", 8, 1, 1 << 16));
    m.moe_top_k = int(moe->get_int("top_k", 2, 1, 1 << 16));
    if (m.moe_top_k > m.moe_experts)
      moe->error_msg("top_k", cat("top_k (", m.moe_top_k, ") must not exceed experts (", m.moe_experts, ")"));
    m.moe_d_expert = int(moe->get_int("d_expert", m.d_ff, 1, 1 << 22));
    m.moe_every = int(moe->get_int("every", 1, 1, 1 << 20));
    m.moe_norm_topk_prob = moe->get_bool("norm_topk_prob", true);
    m.moe_aux_loss_coef = moe->get_float("aux_loss_coef", 0.001, 0.0, 1e6);
    m.moe_capacity_factor = moe->get_float("capacity_factor", 0.0, 0.0, 1e6);
    moe->finish();
  }
}

// Layer l's MLP is a mixture of experts when (l + 1) % every == 0.
bool is_moe_layer(const ModelSpec& s, int l) { return s.moe_experts > 0 && (l + 1) % s.moe_every == 0; }

Model build(const ModelSpec& s) {
  using namespace qwen3;
  Model m;
  m.dims = s;
  m.dims.rows_per_sample = s.seq_len;
  m.dims.act_width = s.d_model;
  const int64_t V = s.vocab, T = s.seq_len, C = s.d_model, F = s.d_ff, L = s.n_layers;
  const int64_t D = s.head_dim, QD = int64_t(s.n_heads) * D, KD = int64_t(s.n_kv_heads) * D;
  const float std = 0.02f;
  auto matrix = [&](const std::string& name, int64_t out, int64_t in) {
    return m.add_param(name, {out, in}, InitKind::Normal, std, true);
  };
  auto norm = [&](const std::string& name, int64_t width) {
    return m.add_param(name, {width}, InitKind::Ones, 0, false);
  };

  Segment emb{&embed_type(), "model.embed_tokens", 0, {}, 0};
  const int embed = matrix("model.embed_tokens.weight", V, C);
  emb.params = {embed};
  m.segments.push_back(emb);

  for (int l = 0; l < L; ++l) {
    const std::string p = cat("model.layers.", l, ".");
    Segment att{&attention_type(), p + "self_attn", l, {}, 0};
    att.params = {norm(p + "input_layernorm.weight", C), matrix(p + "self_attn.q_proj.weight", QD, C),
                  matrix(p + "self_attn.k_proj.weight", KD, C), matrix(p + "self_attn.v_proj.weight", KD, C),
                  matrix(p + "self_attn.o_proj.weight", C, QD)};
    if (s.qk_norm) {
      att.params.push_back(norm(p + "self_attn.q_norm.weight", D));
      att.params.push_back(norm(p + "self_attn.k_norm.weight", D));
    }
    // q, k, v, o projections (2 FLOPs per multiply-add) and causal attention: QK^T and PV over (T+1)/2
    // keys on average per query, 2·head_dim FLOPs per key each, for every query head.
    att.fwd_flops_per_sample = 2.0 * T * (2.0 * C * QD + 2.0 * C * KD) + 2.0 * 2.0 * QD * (T * (T + 1) / 2.0);
    m.segments.push_back(att);

    if (is_moe_layer(s, l)) {
      // router and dispatch, each expert's SwiGLU on the tokens routed to it (top_k experts per token),
      // combine: three segments, so that an exchange can sit between them
      const int64_t E = s.moe_experts, DE = s.moe_d_expert, K = s.moe_top_k;
      Segment dispatch{&moe_dispatch_type(), p + "mlp.router", l, {}, 0};
      dispatch.params = {norm(p + "post_attention_layernorm.weight", C), matrix(p + "mlp.gate.weight", E, C)};
      dispatch.fwd_flops_per_sample = 2.0 * T * C * E;
      m.segments.push_back(dispatch);
      Segment experts{&moe_experts_type(), p + "mlp.experts", l, {}, 0};
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = cat(p, "mlp.experts.", e, ".");
        experts.params.push_back(matrix(x + "gate_proj.weight", DE, C));
        experts.params.push_back(matrix(x + "up_proj.weight", DE, C));
        experts.params.push_back(matrix(x + "down_proj.weight", C, DE));
      }
      experts.fwd_flops_per_sample = 2.0 * T * K * 3.0 * C * DE;
      m.segments.push_back(experts);
      m.segments.push_back(Segment{&moe_combine_type(), p + "mlp.combine", l, {}, 0});
      continue;
    }
    Segment mlp{&mlp_type(), p + "mlp", l, {}, 0};
    mlp.params = {norm(p + "post_attention_layernorm.weight", C), matrix(p + "mlp.gate_proj.weight", F, C),
                  matrix(p + "mlp.up_proj.weight", F, C), matrix(p + "mlp.down_proj.weight", C, F)};
    mlp.fwd_flops_per_sample = 2.0 * T * 3.0 * C * F;
    m.segments.push_back(mlp);
  }

  Segment head{&head_type(), "head", int(L - 1), {}, 0};
  const int final_norm = norm("model.norm.weight", C);
  head.params = {final_norm, s.tie_embeddings ? embed : matrix("lm_head.weight", V, C)};
  head.fwd_flops_per_sample = 2.0 * T * C * V;
  m.segments.push_back(head);
  return m;
}

}  // namespace

const Family& qwen3_family() {
  static const Family f{"qwen3", true, read_keys, build,
                        {&qwen3::embed_type(), &qwen3::attention_type(), &qwen3::mlp_type(), &qwen3::moe_dispatch_type(),
                         &qwen3::moe_experts_type(), &qwen3::moe_combine_type(), &qwen3::head_type()},
                        {"vocab", "seq_len", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "rope_theta",
                         "norm_eps", "qk_norm", "tie_embeddings", "moe.experts", "moe.top_k", "moe.d_expert", "moe.every",
                         "moe.norm_topk_prob", "moe.aux_loss_coef", "moe.capacity_factor"}};
  return f;
}

}  // namespace piper
