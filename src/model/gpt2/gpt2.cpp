// The GPT-2 family: its [model] keys, parameters (tied token embedding, pre-LN blocks, each as an attention and
// an MLP segment) and FLOPs.
// Registered in model/registry.cpp as model.kind = "gpt".
#include <cmath>

#include "model/family.hpp"
#include "model/gpt2/gpt2_hf_names.hpp"
#include "model/gpt2/gpt2_segments.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

std::vector<ModelKey> keys() {
  std::vector<ModelKey> k = decoder_keys();
  k.push_back({.name = "d_ff", .field = &ModelDims::d_ff, .min = 1, .max = 1 << 22,
               .fallback = [](const ModelDims& d) { return 4.0 * d.d_model; }, .doc = "width of the MLP's hidden layer",
               .check = [](const ModelDims& d, const KeyGiven& given) -> std::optional<KeyProblem> {
                 if (d.d_model % d.n_heads == 0) return std::nullopt;
                 return KeyProblem{given("n_heads") ? "n_heads" : "d_model",
                                   cat("n_heads (", d.n_heads, ") must divide d_model (", d.d_model, ")")};
               }});
  return k;
}

Model build(const ModelSpec& s) {
  using namespace gpt2;
  Model m;
  m.dims = s;
  m.dims.rows_per_sample = s.seq_len;
  m.dims.act_width = s.d_model;
  const int64_t V = s.vocab, T = s.seq_len, C = s.d_model, F = s.d_ff, L = s.n_layers;
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * float(L));

  Segment emb{&embedding_type(), "embedding", 0, {}, 0};
  int wte = m.add_param("wte", {V, C}, InitKind::Normal, std, true);
  emb.params = {wte, m.add_param("wpe", {T, C}, InitKind::Normal, std, true)};
  m.segments.push_back(emb);

  // A block is two segments, its attention and MLP halves (tensor parallelism sums each half's partial output
  // between them); the parameters keep the order of the block's: ln1, attn, ln2, mlp.
  // FLOPs: matmuls qkv 3C*C and proj C*C, fc F*C and proj C*F (2 FLOPs each); causal attention: QK^T and AV over
  // (T+1)/2 keys on average per query, 2*C FLOPs per key each.
  const double attention = 2.0 * 2.0 * C * (T * (T + 1) / 2.0);
  for (int l = 0; l < L; ++l) {
    std::string b = cat("blocks.", l, ".");
    Segment att{&attention_type(), b + "attn", l, {}, 0};
    att.params = {
        m.add_param(b + "ln1.weight", {C}, InitKind::Ones, 0, false),
        m.add_param(b + "ln1.bias", {C}, InitKind::Zeros, 0, false),
        m.add_matmul_weight(b + "attn.qkv.weight", {3 * C, C}, std),
        m.add_param(b + "attn.qkv.bias", {3 * C}, InitKind::Zeros, 0, false),
        m.add_matmul_weight(b + "attn.proj.weight", {C, C}, proj_std),
        m.add_param(b + "attn.proj.bias", {C}, InitKind::Zeros, 0, false),
    };
    PIPER_CHECK(att.params.size() == kAttentionParams, "gpt2 attention parameter list out of order");
    att.fwd_flops_per_sample = 2.0 * T * 4.0 * C * C + attention;
    att.tail_flops_per_sample = attention;  // selective recompute redoes the attention, not the products
    m.segments.push_back(att);

    Segment mlp{&mlp_type(), b + "mlp", l, {}, 0};
    mlp.params = {
        m.add_param(b + "ln2.weight", {C}, InitKind::Ones, 0, false),
        m.add_param(b + "ln2.bias", {C}, InitKind::Zeros, 0, false),
        m.add_matmul_weight(b + "mlp.fc.weight", {F, C}, std),
        m.add_param(b + "mlp.fc.bias", {F}, InitKind::Zeros, 0, false),
        m.add_matmul_weight(b + "mlp.proj.weight", {C, F}, proj_std),
        m.add_param(b + "mlp.proj.bias", {C}, InitKind::Zeros, 0, false),
    };
    PIPER_CHECK(mlp.params.size() == kMlpParams, "gpt2 MLP parameter list out of order");
    mlp.fwd_flops_per_sample = 2.0 * T * 2.0 * C * F;  // its rerun (the layernorm) counts no FLOPs
    m.segments.push_back(mlp);
  }

  Segment head{&head_type(), "head", int(L - 1), {}, 0};
  head.params = {m.add_param("ln_f.weight", {C}, InitKind::Ones, 0, false),
                 m.add_param("ln_f.bias", {C}, InitKind::Zeros, 0, false), wte};
  head.fwd_flops_per_sample = 2.0 * T * C * V;
  m.segments.push_back(head);
  m.segments.push_back(Segment{&loss_type(), "loss", int(L - 1), {}, 0});  // its FLOPs are the head's
  return m;
}

}  // namespace

const Family& gpt2_family() {
  static const Family f{.kind = "gpt", .reads_tokens = true, .keys = keys(), .build = build,
                        .segment_types = {&gpt2::embedding_type(), &gpt2::attention_type(), &gpt2::mlp_type(),
                                          &gpt2::head_type(), &gpt2::loss_type()},
                        .to_hf = gpt2::to_hf, .from_hf = gpt2::from_hf, .hf_config = gpt2::hf_config};
  return f;
}

}  // namespace piper
