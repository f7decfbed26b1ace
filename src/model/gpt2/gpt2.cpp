// The GPT-2 family: its [model] keys, parameters (tied token embedding, pre-LN blocks) and FLOPs.
// Registered in model/registry.cpp as model.kind = "gpt".
#include <cmath>

#include "config/toml_reader.hpp"
#include "model/family.hpp"
#include "model/gpt2/gpt2_segments.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

void read_keys(TomlReader& r, ModelSpec& m) {
  read_decoder_keys(r, m);
  m.d_ff = int(r.get_int("d_ff", 4 * m.d_model, 1, 1 << 22));
  if (m.d_model % m.n_heads != 0)
    r.error_msg(r.has("n_heads") ? "n_heads" : "d_model",
                cat("n_heads (", m.n_heads, ") must divide d_model (", m.d_model, ")"));
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

  for (int l = 0; l < L; ++l) {
    std::string b = cat("blocks.", l, ".");
    Segment blk{&block_type(), cat("blocks.", l), l, {}, 0};
    blk.params = {
        m.add_param(b + "ln1.weight", {C}, InitKind::Ones, 0, false),
        m.add_param(b + "ln1.bias", {C}, InitKind::Zeros, 0, false),
        m.add_param(b + "attn.qkv.weight", {3 * C, C}, InitKind::Normal, std, true),
        m.add_param(b + "attn.qkv.bias", {3 * C}, InitKind::Zeros, 0, false),
        m.add_param(b + "attn.proj.weight", {C, C}, InitKind::Normal, proj_std, true),
        m.add_param(b + "attn.proj.bias", {C}, InitKind::Zeros, 0, false),
        m.add_param(b + "ln2.weight", {C}, InitKind::Ones, 0, false),
        m.add_param(b + "ln2.bias", {C}, InitKind::Zeros, 0, false),
        m.add_param(b + "mlp.fc.weight", {F, C}, InitKind::Normal, std, true),
        m.add_param(b + "mlp.fc.bias", {F}, InitKind::Zeros, 0, false),
        m.add_param(b + "mlp.proj.weight", {C, F}, InitKind::Normal, proj_std, true),
        m.add_param(b + "mlp.proj.bias", {C}, InitKind::Zeros, 0, false),
    };
    PIPER_CHECK(blk.params.size() == kBlockParams, "gpt2 block parameter list out of order");
    // matmuls: qkv 3C*C, proj C*C, fc F*C, proj C*F (2 FLOPs each), causal attention:
    // QK^T and AV over (T+1)/2 keys on average per query, 2*C FLOPs per key each.
    double matmul = 2.0 * T * (4.0 * C * C + 2.0 * C * F);
    double attention = 2.0 * 2.0 * C * (T * (T + 1) / 2.0);
    blk.fwd_flops_per_sample = matmul + attention;
    m.segments.push_back(blk);
  }

  Segment head{&head_type(), "head", int(L - 1), {}, 0};
  head.params = {m.add_param("ln_f.weight", {C}, InitKind::Ones, 0, false),
                 m.add_param("ln_f.bias", {C}, InitKind::Zeros, 0, false), wte};
  head.fwd_flops_per_sample = 2.0 * T * C * V;
  m.segments.push_back(head);
  return m;
}

}  // namespace

const Family& gpt2_family() {
  static const Family f{"gpt", true, read_keys, build,
                        {&gpt2::embedding_type(), &gpt2::block_type(), &gpt2::head_type()},
                        {"vocab", "seq_len", "d_model", "n_layers", "n_heads", "d_ff"}};
  return f;
}

}  // namespace piper
