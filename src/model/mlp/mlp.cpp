// The MLP family (model.kind = "mlp"): Linear+GELU layers and a linear classifier with cross-entropy on a
// synthetic teacher task; its keys, parameters, segment types and math. Shapes: b samples, H d_hidden.
#include <cmath>

#include "model/family.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

enum LayerParam { kWeight, kBias, kLayerParams };
enum MlpValue { kInitGain };  // this family's slots of ModelDims::family_values

const size_t f = sizeof(float), i32 = sizeof(int32_t);

// The first layer reads its features from data into its stash; later layers read the previous output.
struct LayerStash {
  const float* x;
  float* dgelu;  // gelu'(pre-activation) (b,H)
  int in_dim;
  LayerStash(bool first, const ModelDims& d, const SegmentIO& io) {
    float* s = static_cast<float*>(io.stash);
    in_dim = first ? d.d_in : d.d_hidden;
    x = first ? s : io.in;
    dgelu = first ? s + int64_t(io.samples) * d.d_in : s;
  }
};

bool is_first(const Segment& seg);

SegmentSizes layer_sizes(const Segment& seg, const ModelDims& d, int samples) {
  SegmentSizes s;
  const bool first = is_first(seg);
  const int64_t b = samples, in = first ? d.d_in : d.d_hidden;
  s.out_bytes = size_t(b * d.d_hidden) * f;
  s.input_bytes = first ? 0 : size_t(b * in) * f;
  // the first layer keeps its input samples; every layer keeps gelu' of its pre-activation
  s.stash_bytes = size_t((first ? b * in : 0) + b * d.d_hidden) * f;
  s.wstash_bytes = size_t(b * d.d_hidden) * f;  // d(pre)
  s.workspace_bytes = s.wstash_bytes;
  return s;
}

// ---- layer: y(b,H) = gelu(x W^T + b) ----
void layer_forward(Kernels& k, const Segment& seg, const ModelDims& d, const SegmentIO& io) {
  LayerStash st(is_first(seg), d, io);
  k.linear_gelu_forward(st.dgelu, io.out, st.x, io.w[kWeight], io.w[kBias], io.samples, st.in_dim, d.d_hidden);
}

void layer_backward_input(Kernels& k, const Segment& seg, const ModelDims& d, const SegmentIO& io) {
  LayerStash st(is_first(seg), d, io);
  k.gelu_backward(io.wstash, io.dout, st.dgelu, size_t(io.samples) * d.d_hidden);  // d pre (b,H)
  if (io.din) k.linear_backward_input(io.din, io.wstash, io.w[kWeight], io.samples, st.in_dim, d.d_hidden, false);
}

void layer_backward_weight(Kernels& k, const Segment& seg, const ModelDims& d, const SegmentIO& io) {
  LayerStash st(is_first(seg), d, io);
  k.linear_backward_weight(io.g[kWeight], io.g[kBias], io.wstash, st.x, io.samples, st.in_dim, d.d_hidden,
                           io.accumulate(kWeight));
}

// ---- head: logits(b,K) = x W^T + b, cross-entropy. Stash: labels(b) | probs(b,K) ----
SegmentSizes head_sizes(const Segment&, const ModelDims& d, int samples) {
  SegmentSizes s;
  const int64_t b = samples;
  s.input_bytes = size_t(b * d.d_hidden) * f;
  s.stash_bytes = size_t(b) * i32 + size_t(b * d.n_classes) * f;  // labels, probs
  s.wstash_bytes = 0;  // dlogits overwrite probs in the stash
  return s;
}

void head_forward(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  auto* labels = static_cast<int32_t*>(io.stash);
  float* probs = reinterpret_cast<float*>(labels + io.samples);
  k.linear_forward(probs, io.in, io.w[kWeight], io.w[kBias], io.samples, d.d_hidden, d.n_classes);
  k.softmax_xent_forward(probs, io.loss_sum, probs, labels, io.samples, d.n_classes, io.loss_scale);
}

void head_backward_input(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  auto* labels = static_cast<int32_t*>(io.stash);
  float* probs = reinterpret_cast<float*>(labels + io.samples);
  k.softmax_xent_backward(probs, probs, labels, io.samples, d.n_classes, io.loss_scale);
  k.linear_backward_input(io.din, probs, io.w[kWeight], io.samples, d.d_hidden, d.n_classes, false);
}

void head_backward_weight(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  auto* labels = static_cast<int32_t*>(io.stash);
  const float* dlogits = reinterpret_cast<const float*>(labels + io.samples);
  k.linear_backward_weight(io.g[kWeight], io.g[kBias], dlogits, io.in, io.samples, d.d_hidden, d.n_classes,
                           io.accumulate(kWeight));
}

const SegmentType& first_layer_type() {
  static const SegmentType t{.name = "mlp.first_layer", .data = DataSlot::Features, .reads_input = false,
                             .sizes = layer_sizes, .forward = layer_forward, .backward_input = layer_backward_input,
                             .backward_weight = layer_backward_weight};
  return t;
}

const SegmentType& layer_type() {
  static const SegmentType t{.name = "mlp.layer", .sizes = layer_sizes, .forward = layer_forward,
                             .backward_input = layer_backward_input, .backward_weight = layer_backward_weight};
  return t;
}

const SegmentType& head_type() {
  static const SegmentType t{.name = "mlp.head", .data = DataSlot::Labels, .computes_loss = true, .sizes = head_sizes,
                             .forward = head_forward, .backward_input = head_backward_input,
                             .backward_weight = head_backward_weight};
  return t;
}

bool is_first(const Segment& seg) { return seg.type == &first_layer_type(); }

std::vector<ModelKey> keys() {
  using D = ModelDims;
  return {int_key<&D::d_in>("d_in", 1, 1 << 20, "features of a sample"),
          int_key<&D::d_hidden>("d_hidden", 1, 1 << 20, "width of every hidden layer"),
          int_key<&D::n_layers>("n_layers", 1, 100000, "Linear+GELU layers"),
          int_key<&D::n_classes>("n_classes", 2, 1 << 20, "classes of the synthetic task"),
          {.name = "init_gain", .field = FamilySlot{kInitGain}, .min = 0, .max = 100, .min_exclusive = true,
           .fallback = [](const D&) { return 1.0; },
           .doc = "initial weights are normal with std init_gain / sqrt(fan_in)"}};
}

Model build(const ModelSpec& s) {
  Model m;
  m.dims = s;
  m.dims.rows_per_sample = 1;
  m.dims.act_width = s.d_hidden;
  const double gain = family_value(s, keys(), kInitGain);
  int64_t in = s.d_in;
  for (int l = 0; l < s.n_layers; ++l) {
    std::string b = cat("layers.", l, ".");
    Segment seg{l == 0 ? &first_layer_type() : &layer_type(), cat("layers.", l), l, {}, 0};
    seg.params = {m.add_matmul_weight(b + "weight", {s.d_hidden, in}, float(gain / std::sqrt(double(in)))),
                  m.add_param(b + "bias", {s.d_hidden}, InitKind::Zeros, 0, false)};
    seg.fwd_flops_per_sample = 2.0 * double(in) * s.d_hidden;
    m.segments.push_back(seg);
    in = s.d_hidden;
  }
  Segment head{&head_type(), "head", s.n_layers - 1, {}, 0};
  head.params = {m.add_matmul_weight("head.weight", {s.n_classes, in}, float(gain / std::sqrt(double(in)))),
                 m.add_param("head.bias", {s.n_classes}, InitKind::Zeros, 0, false)};
  head.fwd_flops_per_sample = 2.0 * double(in) * s.n_classes;
  m.segments.push_back(head);
  return m;
}

}  // namespace

const Family& mlp_family() {
  static const Family f{.kind = "mlp", .reads_tokens = false, .keys = keys(), .build = build,
                        .segment_types = {&first_layer_type(), &layer_type(), &head_type()}};
  return f;
}

}  // namespace piper
