// The Qwen3 family (model.kind = "qwen3"): its [model] keys, parameters under Hugging Face's state-dict
// names (Qwen3ForCausalLM), segments (embedding, attention | MLP halves of each layer, head, loss) and FLOPs.
#include <cmath>
#include <memory>

#include "model/family.hpp"
#include "model/qwen3/qwen3_hf_config.hpp"
#include "model/qwen3/qwen3_segments.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

std::optional<KeyProblem> heads_divide(const ModelDims& d, const KeyGiven& given) {
  if (d.n_heads % d.n_kv_heads != 0)
    return KeyProblem{"n_kv_heads", cat("n_kv_heads (", d.n_kv_heads, ") must divide n_heads (", d.n_heads, ")")};
  if (!given("head_dim") && d.d_model % d.n_heads != 0)  // before head_dim's default is taken from them
    return KeyProblem{given("n_heads") ? "n_heads" : "d_model",
                      cat("n_heads (", d.n_heads, ") must divide d_model (", d.d_model, ") unless head_dim is given")};
  return std::nullopt;
}

enum Qwen3Value { kBiasUpdateRate, kSharedExperts, kDShared };  // this family's slots of ModelDims::family_values

// A count kept in a family slot (a float) must be a whole number.
std::optional<KeyProblem> whole(const ModelDims& d, int slot, const char* key) {
  const double v = d.family_values[slot];
  if (!((d.family_given >> slot) & 1u) || v == std::floor(v)) return std::nullopt;
  return KeyProblem{key, cat(key, " = ", v, " must be a whole number")};
}

std::vector<ModelKey> keys() {
  using D = ModelDims;
  std::vector<ModelKey> k = decoder_keys();
  const std::vector<ModelKey> own = {
      {.name = "n_kv_heads", .field = &D::n_kv_heads, .min = 1, .max = 1 << 16,
       .fallback = [](const D& d) { return double(d.n_heads); }, .doc = "key/value heads (grouped-query attention)",
       .check = heads_divide},
      {.name = "head_dim", .field = &D::head_dim, .min = 2, .max = 1 << 16,
       .fallback = [](const D& d) { return double(d.d_model / d.n_heads); }, .doc = "width of one attention head",
       .check = [](const D& d, const KeyGiven&) -> std::optional<KeyProblem> {
         if (d.head_dim % 2 == 0) return std::nullopt;
         return KeyProblem{"head_dim", cat("head_dim (", d.head_dim, ") must be even: RoPE rotates pairs of dimensions")};
       }},
      int_key<&D::d_ff>("d_ff", 1, 1 << 22, "width of the dense MLP's hidden layer"),
      {.name = "rope_theta", .field = &D::rope_theta, .min = 0, .max = 1e12, .min_exclusive = true,
       .fallback = [](const D&) { return 1e6; }, .doc = "base of the RoPE rotation frequencies"},
      {.name = "norm_eps", .field = &D::norm_eps, .min = 0, .max = 1, .min_exclusive = true,
       .fallback = [](const D&) { return 1e-6; }, .doc = "RMSNorm epsilon"},
      {.name = "qk_norm", .field = &D::qk_norm, .fallback = [](const D&) { return 1.0; },
       .doc = "RMSNorm of each head's queries and keys"},
      {.name = "tie_embeddings", .field = &D::tie_embeddings, .fallback = [](const D&) { return 0.0; },
       .doc = "the LM head is the token embedding"},
      {.name = "moe.experts", .field = &D::moe_experts, .min = 1, .max = 1 << 16, .fallback = [](const D&) { return 8.0; },
       .doc = "experts of each mixture-of-experts layer ([model.moe] present: the MLPs are mixtures)"},
      {.name = "moe.top_k", .field = &D::moe_top_k, .min = 1, .max = 1 << 16, .fallback = [](const D&) { return 2.0; },
       .doc = "experts each token is routed to",
       .check = [](const D& d, const KeyGiven&) -> std::optional<KeyProblem> {
         if (d.moe_top_k <= d.moe_experts) return std::nullopt;
         return KeyProblem{"moe.top_k", cat("top_k (", d.moe_top_k, ") must not exceed experts (", d.moe_experts, ")")};
       }},
      {.name = "moe.d_expert", .field = &D::moe_d_expert, .min = 1, .max = 1 << 22,
       .fallback = [](const D& d) { return double(d.d_ff); }, .doc = "width of an expert's hidden layer"},
      {.name = "moe.every", .field = &D::moe_every, .min = 1, .max = 1 << 20, .fallback = [](const D&) { return 1.0; },
       .doc = "layer l is a mixture when (l + 1) % every == 0"},
      {.name = "moe.norm_topk_prob", .field = &D::moe_norm_topk_prob, .fallback = [](const D&) { return 1.0; },
       .doc = "the top-k routing weights are renormalized to sum to 1"},
      {.name = "moe.aux_loss_coef", .field = &D::moe_aux_loss_coef, .min = 0, .max = 1e6,
       .fallback = [](const D&) { return 0.001; }, .doc = "weight of the load-balancing loss"},
      {.name = "moe.capacity_factor", .field = &D::moe_capacity_factor, .min = 0, .max = 1e6,
       .fallback = [](const D&) { return 0.0; }, .doc = "tokens an expert takes, times the even share; 0: dropless"},
      {.name = "moe.bias_update_rate", .field = FamilySlot{kBiasUpdateRate}, .min = 0, .max = 1,
       .fallback = [](const D&) { return 0.0; },
       .doc = "auxiliary-loss-free balancing: each step a per-expert selection bias moves by this rate toward even "
              "loads; 0: none"},
      {.name = "moe.shared_experts", .field = FamilySlot{kSharedExperts}, .min = 0, .max = 1 << 10,
       .fallback = [](const D&) { return 0.0; },
       .doc = "experts every token goes through besides its routed ones (DeepSeek-V3); 0: none",
       .check = [](const D& d, const KeyGiven&) { return whole(d, kSharedExperts, "moe.shared_experts"); }},
      {.name = "moe.d_shared", .field = FamilySlot{kDShared}, .min = 1, .max = 1 << 22,
       .fallback = [](const D& d) { return double(d.moe_d_expert); }, .doc = "width of a shared expert's hidden layer",
       .check = [](const D& d, const KeyGiven&) { return whole(d, kDShared, "moe.d_shared"); }},
  };
  k.insert(k.end(), own.begin(), own.end());
  return k;
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
  auto matrix = [&](const std::string& name, int64_t out, int64_t in) {  // read by linear-layer matmuls only
    return m.add_matmul_weight(name, {out, in}, std);
  };
  auto norm = [&](const std::string& name, int64_t width) {
    return m.add_param(name, {width}, InitKind::Ones, 0, false);
  };

  Segment emb{&embed_type(), "model.embed_tokens", 0, {}, 0};
  const int embed = m.add_param("model.embed_tokens.weight", {V, C}, InitKind::Normal, std, true);  // rows looked up
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
      if (moe_bias_update_rate(s) > 0) {  // DeepSeek-V3's name for it; moved by the routing statistics
        const int bias = m.add_param(p + "mlp.gate.e_score_correction_bias", {E}, InitKind::Zeros, 0, false);
        m.params[size_t(bias)].statistics_segment = int32_t(m.segments.size());
        dispatch.params.push_back(bias);
      }
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
      Segment combine{&moe_combine_type(), p + "mlp.combine", l, {}, 0};
      if (const int64_t S = moe_shared_width(s); S > 0) {  // DeepSeek-V3's shared experts, as one SwiGLU of width S
        combine.params = {matrix(p + "mlp.shared_experts.gate_proj.weight", S, C),
                          matrix(p + "mlp.shared_experts.up_proj.weight", S, C),
                          matrix(p + "mlp.shared_experts.down_proj.weight", C, S)};
        combine.fwd_flops_per_sample = 2.0 * T * 3.0 * C * S;
      }
      m.segments.push_back(combine);
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
  m.segments.push_back(Segment{&loss_type(), "loss", int(L - 1), {}, 0});
  return m;
}

}  // namespace

double qwen3::moe_bias_update_rate(const ModelDims& d) { return family_value(d, keys(), kBiasUpdateRate); }

int qwen3::moe_shared_width(const ModelDims& d) {
  return int(family_value(d, keys(), kSharedExperts)) * int(family_value(d, keys(), kDShared));
}

const Family& qwen3_family() {
  static const Family f{.kind = "qwen3", .reads_tokens = true, .keys = keys(), .build = build,
                        .segment_types = {&qwen3::embed_type(), &qwen3::attention_type(), &qwen3::mlp_type(),
                                          &qwen3::moe_dispatch_type(), &qwen3::moe_experts_type(),
                                          &qwen3::moe_combine_type(), &qwen3::head_type(),
                                          &qwen3::loss_type()},
                        .hf_config = qwen3::hf_config};
  return f;
}

}  // namespace piper
