// Model construction (GPT-2 and MLP segment lists), FLOP counts and strategy-independent init.
#include "model/model.hpp"

#include <cmath>

#include "model/build.hpp"

#include "util/error.hpp"
#include "util/rng.hpp"

namespace piper {

const char* segment_kind_name(SegmentKind k) {
  switch (k) {
    case SegmentKind::Embedding: return "embedding";
    case SegmentKind::Block: return "block";
    case SegmentKind::Head: return "head";
    case SegmentKind::MlpLayer: return "mlp_layer";
    case SegmentKind::MlpHead: return "mlp_head";
  }
  return "?";
}

namespace {

int add_param(Model& m, std::string name, std::vector<int64_t> shape, InitKind init, float std, bool decay) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.numel = 1;
  for (auto d : p.shape) p.numel *= d;
  p.init = init;
  p.init_std = std;
  p.decay = decay;
  m.params.push_back(std::move(p));
  return int(m.params.size()) - 1;
}

Model build_gpt(const ModelSpec& s) {
  Model m;
  ModelDims& d = m.dims;
  d.first_kind = SegmentKind::Embedding;
  d.vocab = s.vocab; d.seq_len = s.seq_len; d.d_model = s.d_model; d.n_heads = s.n_heads; d.d_ff = s.d_ff;
  d.n_layers = s.n_layers;
  const int64_t V = s.vocab, T = s.seq_len, C = s.d_model, F = s.d_ff, L = s.n_layers;
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * float(L));

  Segment emb{SegmentKind::Embedding, "embedding", -1, {}, 0};
  int wte = add_param(m, "wte", {V, C}, InitKind::Normal, std, true);
  emb.params = {wte, add_param(m, "wpe", {T, C}, InitKind::Normal, std, true)};
  m.segments.push_back(emb);

  for (int l = 0; l < L; ++l) {
    std::string b = cat("blocks.", l, ".");
    Segment blk{SegmentKind::Block, cat("blocks.", l), l, {}, 0};
    blk.params = {
        add_param(m, b + "ln1.weight", {C}, InitKind::Ones, 0, false),
        add_param(m, b + "ln1.bias", {C}, InitKind::Zeros, 0, false),
        add_param(m, b + "attn.qkv.weight", {3 * C, C}, InitKind::Normal, std, true),
        add_param(m, b + "attn.qkv.bias", {3 * C}, InitKind::Zeros, 0, false),
        add_param(m, b + "attn.proj.weight", {C, C}, InitKind::Normal, proj_std, true),
        add_param(m, b + "attn.proj.bias", {C}, InitKind::Zeros, 0, false),
        add_param(m, b + "ln2.weight", {C}, InitKind::Ones, 0, false),
        add_param(m, b + "ln2.bias", {C}, InitKind::Zeros, 0, false),
        add_param(m, b + "mlp.fc.weight", {F, C}, InitKind::Normal, std, true),
        add_param(m, b + "mlp.fc.bias", {F}, InitKind::Zeros, 0, false),
        add_param(m, b + "mlp.proj.weight", {C, F}, InitKind::Normal, proj_std, true),
        add_param(m, b + "mlp.proj.bias", {C}, InitKind::Zeros, 0, false),
    };
    // matmuls: qkv 3C*C, proj C*C, fc F*C, proj C*F (2 FLOPs each), causal attention:
    // QK^T and AV over (T+1)/2 keys on average per query, 2*C FLOPs per key each.
    double matmul = 2.0 * T * (4.0 * C * C + 2.0 * C * F);
    double attention = 2.0 * 2.0 * C * (T * (T + 1) / 2.0);
    blk.fwd_flops_per_sample = matmul + attention;
    m.segments.push_back(blk);
  }

  Segment head{SegmentKind::Head, "head", -1, {}, 0};
  head.params = {add_param(m, "ln_f.weight", {C}, InitKind::Ones, 0, false),
                 add_param(m, "ln_f.bias", {C}, InitKind::Zeros, 0, false), wte};
  head.fwd_flops_per_sample = 2.0 * T * C * V;
  m.segments.push_back(head);
  return m;
}

Model build_mlp(const ModelSpec& s) {
  Model m;
  ModelDims& d = m.dims;
  d.first_kind = SegmentKind::MlpLayer;
  d.d_in = s.d_in; d.d_hidden = s.d_hidden; d.n_classes = s.n_classes; d.n_layers = s.n_layers;
  int64_t in = s.d_in;
  for (int l = 0; l < s.n_layers; ++l) {
    std::string b = cat("layers.", l, ".");
    Segment seg{SegmentKind::MlpLayer, cat("layers.", l), l, {}, 0};
    seg.params = {add_param(m, b + "weight", {s.d_hidden, in}, InitKind::Normal, float(1.0 / std::sqrt(double(in))), true),
                  add_param(m, b + "bias", {s.d_hidden}, InitKind::Zeros, 0, false)};
    seg.fwd_flops_per_sample = 2.0 * double(in) * s.d_hidden;
    m.segments.push_back(seg);
    in = s.d_hidden;
  }
  Segment head{SegmentKind::MlpHead, "head", -1, {}, 0};
  head.params = {add_param(m, "head.weight", {s.n_classes, in}, InitKind::Normal, float(1.0 / std::sqrt(double(in))), true),
                 add_param(m, "head.bias", {s.n_classes}, InitKind::Zeros, 0, false)};
  head.fwd_flops_per_sample = 2.0 * double(in) * s.n_classes;
  m.segments.push_back(head);
  return m;
}

}  // namespace

Model build_model(const ModelSpec& spec) {
  if (spec.kind == "gpt") return build_gpt(spec);
  if (spec.kind == "mlp") return build_mlp(spec);
  throw UserError(cat("model.kind: unknown model '", spec.kind, "'"));
}

int64_t Model::n_params() const {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel;
  return n;
}

float init_value(const ParamSpec& p, uint64_t seed, int64_t index) {
  switch (p.init) {
    case InitKind::Zeros: return 0.f;
    case InitKind::Ones: return 1.f;
    case InitKind::Normal: return p.init_std * random_normal(stream_key(seed, p.name), uint64_t(index));
  }
  return 0.f;
}

void init_param_range(const ParamSpec& p, uint64_t seed, int64_t begin, int64_t count, float* out) {
  if (p.init == InitKind::Normal) {
    uint64_t key = stream_key(seed, p.name);
    for (int64_t i = 0; i < count; ++i) out[i] = p.init_std * random_normal(key, uint64_t(begin + i));
  } else {
    float v = p.init == InitKind::Ones ? 1.f : 0.f;
    for (int64_t i = 0; i < count; ++i) out[i] = v;
  }
}

}  // namespace piper
