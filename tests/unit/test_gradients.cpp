// Whole-model checks through the families' segment code (src/model): a small GPT and a small MLP are run segment by
// segment over buffers sized by segment_sizes(); the loss is compared with a double-precision reference,
// every parameter's gradient with central differences of the loss, and split backward with fused.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/cpu_kernels.hpp"
#include "backend/profiling_kernels.hpp"
#include "config/job.hpp"
#include "config/load.hpp"
#include "model/segment_type.hpp"
#include "model/build.hpp"
#include "util/error.hpp"
#include "model/qwen3/qwen3_segments.hpp"
#include "qwen3_reference.hpp"
#include "test_util.hpp"

using namespace piper;
using namespace piper::test;

namespace {

// A model with its parameters, one batch of data and every per-segment buffer, driven the way the
// executor drives it: forward over all segments, then backward in reverse order, either fused (BI and
// BW back to back, wstash at the start of the workspace) or split (all BI, then all BW from wstash).
struct Net {
  Model model;
  int samples = 0;
  float loss_scale = 1.f;
  std::vector<std::vector<float>> params;  // by model parameter index
  std::vector<int32_t> tokens, targets;    // gpt: (samples,T) each; mlp: targets (samples)
  std::vector<float> features;             // mlp: (samples, d_in)
  std::vector<SegmentSizes> sizes;
  std::vector<Guarded> act, dact, stash, wstash, fused;  // by segment
  std::vector<std::vector<int32_t>> counts;              // by segment: its ragged input's counts, on the host
  std::vector<Guarded> tail;  // by segment: with split_stash, the part of its stash selective recompute redoes
  bool split_stash = false;
  Guarded workspace, scratch;

  Net(const ModelSpec& spec, int samples_, uint64_t seed) : model(build_model(spec)), samples(samples_) {
    const ModelDims& d = model.dims;
    Rand rng(seed);
    const size_t S = model.segments.size();
    act.resize(S), dact.resize(S), stash.resize(S), wstash.resize(S), fused.resize(S), counts.resize(S), tail.resize(S);
    size_t max_workspace = 0;
    for (size_t s = 0; s < S; ++s) {
      SegmentSizes z = segment_sizes(model.segments[s], d, samples);
      sizes.push_back(z);
      act[s].resize(z.out_bytes);
      dact[s].resize(z.out_bytes);
      stash[s].resize(z.stash_bytes);
      tail[s].resize(z.stash_bytes - z.stash_kept_bytes);
      wstash[s].resize(z.wstash_bytes);
      fused[s].resize(z.workspace_bytes);
      max_workspace = std::max(max_workspace, z.workspace_bytes);
    }
    workspace.resize(max_workspace);
    if (model.reads_tokens) {
      tokens = rng.ints(size_t(samples) * d.seq_len, 0, d.vocab);
      targets = rng.ints(size_t(samples) * d.seq_len, 0, d.vocab);
      loss_scale = 1.f / float(samples * d.seq_len);
    } else {
      features = rng.normal(size_t(samples) * d.d_in);
      targets = rng.ints(size_t(samples), 0, d.n_classes);
      loss_scale = 1.f / float(samples);
    }
    params.resize(model.params.size());
    for (size_t p = 0; p < model.params.size(); ++p) params[p].resize(size_t(model.params[p].numel));
  }

  // The model's own initialization.
  void init(uint64_t seed) {
    for (size_t p = 0; p < params.size(); ++p)
      init_param_range(model.params[p], seed, 0, model.params[p].numel, params[p].data());
  }

  // A generic point for gradient checks: larger than GPT-2 init so attention is far from uniform and
  // every nonlinearity is exercised; LN weights near 1, biases small but non-zero.
  void randomize(uint64_t seed, double matrix_std) {
    Rand rng(seed);
    for (size_t p = 0; p < params.size(); ++p) {
      const ParamSpec& spec = model.params[p];
      if (spec.init == InitKind::Ones) params[p] = rng.normal(params[p].size(), 0.2, 1.0);
      else if (spec.init == InitKind::Zeros) params[p] = rng.normal(params[p].size(), 0.2);
      else params[p] = rng.normal(params[p].size(), matrix_std);
    }
  }

  bool buffers_intact() const {
    for (size_t s = 0; s < act.size(); ++s)
      if (!act[s].intact() || !dact[s].intact() || !stash[s].intact() || !wstash[s].intact() || !fused[s].intact() ||
          !tail[s].intact())
        return false;
    return workspace.intact() && scratch.intact();
  }

  void load_data(size_t s) {
    const Segment& seg = model.segments[s];
    switch (seg.type->data) {
      case DataSlot::Tokens: std::memcpy(stash[s].data(), tokens.data(), tokens.size() * sizeof(int32_t)); break;
      case DataSlot::Targets:
      case DataSlot::Labels: std::memcpy(stash[s].data(), targets.data(), targets.size() * sizeof(int32_t)); break;
      case DataSlot::Features: std::memcpy(stash[s].data(), features.data(), features.size() * sizeof(float)); break;
      case DataSlot::None: break;
    }
  }

  // Everything but the gradient pointers; `w` must outlive the call.
  SegmentIO io_for(size_t s, std::vector<const float*>& w) {
    const Segment& seg = model.segments[s];
    w.resize(seg.params.size());
    for (size_t i = 0; i < seg.params.size(); ++i) w[i] = params[size_t(seg.params[i])].data();
    SegmentIO io;
    io.samples = samples;
    io.w = w.data();
    const bool has_in = sizes[s].input_bytes > 0;
    io.in = has_in ? act[s - 1].data() : nullptr;
    io.din = has_in ? dact[s - 1].data() : nullptr;
    io.out = sizes[s].out_bytes > 0 ? act[s].data() : nullptr;
    io.dout = sizes[s].out_bytes > 0 ? dact[s].data() : nullptr;
    io.stash = stash[s].data();
    if (!counts[s].empty()) io.counts = counts[s].data();
    if (split_stash && sizes[s].stash_kept_bytes > 0) io.stash_tail = tail[s].data();
    if (seg.type->link_offset != 0) io.link = stash[size_t(int(s) + seg.type->link_offset)].data();
    io.scratch = scratch.data();
    io.loss_scale = loss_scale;
    return io;
  }

  void size_scratch(Kernels& k) {
    size_t floats = 0;
    for (const auto& seg : model.segments) floats = std::max(floats, segment_scratch_floats(k, seg, model.dims, samples));
    if (scratch.size() != floats * sizeof(float)) scratch.resize(floats * sizeof(float));
  }

  double forward(Kernels& k) {
    size_scratch(k);
    double loss = 0;
    std::vector<const float*> w;
    for (size_t s = 0; s < model.segments.size(); ++s) {
      load_data(s);
      if (sizes[s].ragged_parts > 0 && sizes[s].input_bytes > 0) {  // as a counts read of the plan brings them
        const auto* header = reinterpret_cast<const int32_t*>(act[s - 1].data());
        counts[s].assign(header, header + sizes[s].ragged_parts);
      }
      SegmentIO io = io_for(s, w);
      io.loss_sum = &loss;
      io.balance_loss = &loss;
      segment_forward(k, model.segments[s], model.dims, io);
    }
    return loss;
  }

  // Gradients of the loss of the last forward, one vector per model parameter. They start as junk:
  // the first writer of each parameter (in backward order) overwrites, later ones (the tied wte) add.
  std::vector<std::vector<float>> backward(Kernels& k, bool split) {
    std::vector<std::vector<float>> grads(params.size());
    for (size_t p = 0; p < params.size(); ++p) grads[p].assign(params[p].size(), 1e3f);
    std::vector<bool> written(params.size(), false);
    std::vector<std::vector<uint8_t>> flags(model.segments.size());
    auto overwrite_bits = [&](const Segment& seg) {
      auto& bits = flags[size_t(&seg - model.segments.data())];
      bits.assign(seg.params.size(), 0);
      for (size_t i = 0; i < seg.params.size(); ++i)
        if (!written[size_t(seg.params[i])]) {
          bits[i] = 1;
          written[size_t(seg.params[i])] = true;
        }
      return bits.data();
    };
    std::vector<const float*> w;
    std::vector<float*> g;
    auto grad_ptrs = [&](const Segment& seg) {
      g.resize(seg.params.size());
      for (size_t i = 0; i < seg.params.size(); ++i) g[i] = grads[size_t(seg.params[i])].data();
      return g.data();
    };
    const int S = int(model.segments.size());
    const ModelDims& d = model.dims;
    if (!split) {
      for (int s = S - 1; s >= 0; --s) {
        const Segment& seg = model.segments[size_t(s)];
        SegmentIO io = io_for(size_t(s), w);
        io.g = grad_ptrs(seg);
        io.overwrite = overwrite_bits(seg);
        io.wstash = fused[size_t(s)].data();
        io.workspace = fused[size_t(s)].data() + sizes[size_t(s)].wstash_bytes / sizeof(float);
        segment_backward_input(k, seg, d, io);
        segment_backward_weight(k, seg, d, io);
      }
      return grads;
    }
    for (int s = S - 1; s >= 0; --s) {
      const Segment& seg = model.segments[size_t(s)];
      SegmentIO io = io_for(size_t(s), w);
      io.wstash = wstash[size_t(s)].data();
      io.workspace = workspace.data();
      segment_backward_input(k, seg, d, io);
    }
    // BW may only read what BI left in wstash: poison the shared scratch in between.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::fill(workspace.data(), workspace.data() + workspace.size(), nan);
    std::fill(scratch.data(), scratch.data() + scratch.size(), nan);
    for (int s = S - 1; s >= 0; --s) {
      const Segment& seg = model.segments[size_t(s)];
      SegmentIO io = io_for(size_t(s), w);
      io.g = grad_ptrs(seg);
      io.overwrite = overwrite_bits(seg);
      io.wstash = wstash[size_t(s)].data();
      io.workspace = nullptr;
      io.scratch = nullptr;
      segment_backward_weight(k, seg, d, io);
    }
    return grads;
  }

  // Selective recompute at the segment level: every split stash's tail poisoned, then rerun from the kept part.
  int rerun_tails(Kernels& k) {
    int reran = 0;
    std::vector<const float*> w;
    for (size_t s = 0; s < model.segments.size(); ++s) {
      const Segment& seg = model.segments[s];
      if (!split_stash || sizes[s].stash_kept_bytes == 0 || !seg.type->rerun_tail) continue;
      float* t = reinterpret_cast<float*>(tail[s].data());
      std::fill(t, t + tail[s].size() / sizeof(float), std::numeric_limits<float>::quiet_NaN());
      SegmentIO io = io_for(s, w);
      double sink = 0;
      io.loss_sum = io.balance_loss = &sink;
      seg.type->rerun_tail(k, seg, model.dims, io);
      ++reran;
    }
    return reran;
  }

  // The loss in double precision, from the same parameters and data, with the textbook math.
  double reference_loss() const {
    const ModelDims& d = model.dims;
    auto P = [&](const Segment& seg, int i) -> const std::vector<float>& { return params[size_t(seg.params[size_t(i)])]; };
    if (model.kind == "qwen3") {
      Qwen3RefDims q{samples, d.seq_len, d.d_model, d.n_heads, d.n_kv_heads, d.head_dim, d.d_ff, d.vocab,
                     d.n_layers, d.norm_eps, d.rope_theta, d.qk_norm, {}};
      q.moe = {d.moe_experts, d.moe_top_k, d.moe_d_expert, d.moe_every, d.moe_norm_topk_prob, d.moe_aux_loss_coef,
               d.moe_capacity_factor, d.moe_experts > 0 ? qwen3::moe_shared_width(d) : 0};
      return qwen3_loss_ref(q, params, d.tie_embeddings, tokens, targets);
    }
    if (model.kind == "gpt") {
      const int B = samples, T = d.seq_len, C = d.d_model, F = d.d_ff, NH = d.n_heads, n = B * T;
      const Segment& emb = model.segments.front();
      std::vector<double> x = embedding_ref(tokens, P(emb, 0), P(emb, 1), B, T, C);
      const size_t S = model.segments.size();  // embedding, blocks, head, loss
      for (size_t s = 1; s + 2 < S; s += 2) {  // a block: its attention and MLP halves
        const Segment &att = model.segments[s], &mlp = model.segments[s + 1];
        auto h = layernorm_ref(x, P(att, 0), P(att, 1), n, C);
        auto qkv = linear_ref(h, P(att, 2), P(att, 3).data(), n, C, 3 * C);
        auto a = attention_ref(qkv, B, T, C, NH);
        auto proj = linear_ref(a, P(att, 4), P(att, 5).data(), n, C, C);
        for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
        auto h2 = layernorm_ref(x, P(mlp, 0), P(mlp, 1), n, C);
        auto f = linear_ref(h2, P(mlp, 2), P(mlp, 3).data(), n, C, F);
        for (auto& v : f) v = gelu_ref(v);
        auto m = linear_ref(f, P(mlp, 4), P(mlp, 5).data(), n, F, C);
        for (size_t i = 0; i < x.size(); ++i) x[i] += m[i];
      }
      const Segment& head = model.segments[S - 2];  // the loss after it has no parameters
      auto lf = layernorm_ref(x, P(head, 0), P(head, 1), n, C);
      const float* no_bias = nullptr;
      auto logits = linear_ref(lf, P(head, 2), no_bias, n, C, d.vocab);  // tied: the embedding's wte
      return double(loss_scale) * xent_ref(logits, targets, n, d.vocab);
    }
    std::vector<double> h(features.begin(), features.end());
    int in = d.d_in;
    for (size_t s = 0; s + 1 < model.segments.size(); ++s) {
      const Segment& layer = model.segments[s];
      h = linear_ref(h, P(layer, 0), P(layer, 1).data(), samples, in, d.d_hidden);
      for (auto& v : h) v = gelu_ref(v);
      in = d.d_hidden;
    }
    const Segment& head = model.segments.back();
    auto logits = linear_ref(h, P(head, 0), P(head, 1).data(), samples, in, d.n_classes);
    return double(loss_scale) * xent_ref(logits, targets, samples, d.n_classes);
  }
};

ModelSpec small_gpt() {
  ModelSpec s;
  s.kind = "gpt";
  s.vocab = 16, s.seq_len = 4, s.d_model = 8, s.n_layers = 2, s.n_heads = 2, s.d_ff = 16;
  return s;
}

// GQA (4 query heads over 2 key/value heads), head_dim unlike d_model / n_heads, a short RoPE period.
ModelSpec small_qwen3(bool tied, bool qk_norm, int kv_heads = 2) {
  ModelSpec s;
  s.kind = "qwen3";
  s.vocab = 16, s.seq_len = 6, s.d_model = 12, s.n_layers = 2, s.n_heads = 4, s.n_kv_heads = kv_heads;
  s.head_dim = 4, s.d_ff = 20, s.rope_theta = 100, s.norm_eps = 1e-6, s.qk_norm = qk_norm, s.tie_embeddings = tied;
  return s;
}

// Qwen3 with a mixture of experts in every `every`-th layer: 4 experts, top-2, a large balance coefficient
// so its gradient shows, optionally a capacity that drops tokens, shared experts and a selection bias.
ModelSpec small_qwen3_moe(int every, double capacity, bool norm_topk, int shared_width = 0, double bias_rate = 0) {
  ModelSpec s = small_qwen3(false, true);
  s.moe_experts = 4, s.moe_top_k = 2, s.moe_d_expert = 8, s.moe_every = every;
  s.moe_norm_topk_prob = norm_topk, s.moe_aux_loss_coef = 0.05, s.moe_capacity_factor = capacity;
  if (shared_width > 0 || bias_rate > 0) {  // through the job loader's own keys
    std::string keys;
    if (shared_width > 0) keys += cat("shared_experts = 1\nd_shared = ", shared_width, "\n");
    if (bias_rate > 0) keys += cat("bias_update_rate = ", bias_rate, "\n");
    const JobSpec job = load_job_text(cat("[model]\nkind = \"qwen3\"\n[model.moe]\n", keys, "[data]\npath = \"",
                                          scratch_data_file(), "\"\n"),
                                      "job.toml");
    std::copy(std::begin(job.model.family_values), std::end(job.model.family_values), std::begin(s.family_values));
    s.family_given = job.model.family_given;
  }
  return s;
}

ModelSpec small_mlp() {
  ModelSpec s;
  s.kind = "mlp";
  s.d_in = 6, s.d_hidden = 10, s.n_layers = 3, s.n_classes = 5;
  return s;
}

// The parameter both the embedding and the head use (GPT's wte), or -1.
int tied_param(const Model& m) {
  for (int p : m.segments.front().params)
    for (int q : m.segments.back().params)
      if (p == q) return p;
  return -1;
}

// Elements checked per parameter: all of the tied wte (every row the embedding touches must be summed
// with the head's part) and of tensors up to 32 elements, a fixed random sample of 24 elsewhere.
std::vector<size_t> elements_to_check(const ParamSpec& p, bool tied, Rand& rng) {
  std::vector<size_t> which;
  const size_t n = size_t(p.numel);
  if (tied || n <= 32) {
    for (size_t i = 0; i < n; ++i) which.push_back(i);
    return which;
  }
  auto picks = rng.ints(24, 0, int(n));
  which.assign(picks.begin(), picks.end());
  which.push_back(0);
  which.push_back(n - 1);
  return which;
}

// Checks each parameter's gradient (fused backward) against two central differences of the loss:
//  - of the fp32 loss the layer code computes, step 1e-2 (parameters have scale 0.1-1): fp32 rounding
//    noise of the mean loss (~1e-7) over 2·step gives ~1e-5 absolute, truncation (step²·f''') up to
//    ~1e-4 absolute: tolerance 2e-2 relative, floor 2e-2 × the largest gradient of the model;
//  - of the double-precision reference loss, step 1e-3: noise ~1e-13, truncation ~1e-7 relative, so
//    what remains is the fp32 error of the analytic gradient: tolerance 2e-3, floor 1e-3 × largest.
// Worst errors seen: 7e-3 (fp32 differences, truncation on the MLP's first layer) and 6e-4 (reference).
// `min_share`: every parameter's largest gradient is at least this share of the model's largest (it moves
// the loss); a deep model's embedding and LM head dominate, so that share is smaller there.
// `fp32_differences`: also compare with differences of the fp32 loss at step 1e-2. Top-k routing is piecewise
// constant in the router logits, and steps that large cross its boundaries: MoE models skip that check and
// rely on the double reference (step 1e-3).
void check_all_gradients(Net& net, Kernels& k, double min_share = 0.05, bool fp32_differences = true) {
  net.forward(k);
  auto grads = net.backward(k, false);
  CHECK(net.buffers_intact());
  Rand rng(5);
  const size_t P = net.params.size();
  const int tied = tied_param(net.model);
  std::vector<std::vector<size_t>> which(P);
  std::vector<std::vector<double>> num32(P), numref(P);
  double scale = 0;
  for (size_t p = 0; p < P; ++p) {
    which[p] = elements_to_check(net.model.params[p], int(p) == tied, rng);
    num32[p] = fp32_differences ? numeric_grad(net.params[p], 1e-2, [&] { return net.forward(k); }, which[p])
                                : std::vector<double>(net.params[p].size(), 0.0);
    numref[p] = numeric_grad(net.params[p], 1e-3, [&] { return net.reference_loss(); }, which[p]);
    for (size_t i : which[p]) scale = std::max(scale, std::fabs(numref[p][i]));
  }
  for (size_t p = 0; p < P; ++p) {
    double largest = 0;
    for (size_t i : which[p]) largest = std::max(largest, std::fabs(numref[p][i]));
    size_t w32 = which[p][0], wref = which[p][0];
    double e32 = grad_error(grads[p], num32[p], 2e-2 * scale, which[p], &w32);
    double eref = grad_error(grads[p], numref[p], 1e-3 * scale, which[p], &wref);
    INFO(net.model.params[p].name << ": vs fp32 differences " << e32 << " at [" << w32 << "] analytic "
                                  << grads[p][w32] << " numeric " << num32[p][w32] << "; vs double reference "
                                  << eref << " at [" << wref << "] analytic " << grads[p][wref] << " numeric "
                                  << numref[p][wref] << "; largest |gradient| " << largest << " of " << scale);
    if (fp32_differences) CHECK(e32 < 2e-2);
    CHECK(eref < 2e-3);
    CHECK(largest > min_share * scale);  // not vacuous: every parameter moves the loss
  }
}

void check_split_equals_fused(Net& net, Kernels& k) {
  net.forward(k);
  auto fused = net.backward(k, false);
  std::vector<std::vector<float>> fused_dact;
  for (auto& a : net.dact) fused_dact.emplace_back(a.data(), a.data() + a.size());
  net.forward(k);
  auto split = net.backward(k, true);
  for (size_t p = 0; p < fused.size(); ++p) {
    INFO(net.model.params[p].name);
    CHECK(bitwise_equal(fused[p], split[p]));
  }
  for (size_t s = 0; s < net.dact.size(); ++s) {
    INFO("activation gradient of segment " << net.model.segments[s].name);
    std::vector<float> d(net.dact[s].data(), net.dact[s].data() + net.dact[s].size());
    CHECK(bitwise_equal(fused_dact[s], d));
  }
  CHECK(net.buffers_intact());
}

}  // namespace

TEST_CASE("GPT: the loss matches a double-precision reference and starts near ln(vocab)", "[layers][gpt]") {
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    CpuKernels k(threads);
    Net net(small_gpt(), 2, 7);
    net.randomize(8, 0.3);
    double loss = net.forward(k);
    CHECK(loss == Approx(net.reference_loss()).epsilon(2e-5));
    CHECK(net.buffers_intact());
    // At GPT-2 init (std 0.02) the logits have std ~0.06, so the mean loss is ln(V) up to ~0.002 of bias
    // and a sampling spread of ~0.06/sqrt(tokens): 0.0075 over 64 tokens.
    Net wide(small_gpt(), 16, 9);
    wide.init(1234);
    loss = wide.forward(k);
    CHECK(loss == Approx(wide.reference_loss()).epsilon(2e-5));
    CHECK(std::fabs(loss - std::log(16.0)) < 0.04);
    CHECK(wide.buffers_intact());
  }
}

TEST_CASE("GPT: gradients of every parameter match finite differences of the loss (tied wte summed)",
          "[layers][gpt]") {
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    CpuKernels k(threads);
    Net net(small_gpt(), 2, 17);
    net.randomize(18, 0.3);
    check_all_gradients(net, k);
  }
}

TEST_CASE("GPT: split backward (BI, then BW from wstash) is bit-identical to fused", "[layers][gpt]") {
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    CpuKernels k(threads);
    Net net(small_gpt(), 2, 27);
    net.randomize(28, 0.3);
    check_split_equals_fused(net, k);
  }
}

TEST_CASE("MLP: loss matches a reference, gradients match finite differences, split equals fused",
          "[layers][mlp]") {
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    CpuKernels k(threads);
    Net net(small_mlp(), 4, 37);
    net.randomize(38, 0.6);
    CHECK(net.forward(k) == Approx(net.reference_loss()).epsilon(2e-5));
    check_all_gradients(net, k);
    check_split_equals_fused(net, k);
    net.init(99);
    CHECK(net.forward(k) == Approx(net.reference_loss()).epsilon(2e-5));
  }
}

TEST_CASE("Qwen3: the loss matches a double-precision reference and starts near ln(vocab)", "[layers][qwen3]") {
  for (int threads : {1, 2}) {
    for (bool tied : {false, true}) {
      for (bool qk_norm : {true, false}) {
        INFO("threads " << threads << " tied " << tied << " qk_norm " << qk_norm);
        CpuKernels k(threads);
        Net net(small_qwen3(tied, qk_norm), 2, 41);
        net.randomize(42, 0.3);
        double loss = net.forward(k);
        CHECK(loss == Approx(net.reference_loss()).epsilon(2e-5));
        CHECK(net.buffers_intact());
        // At init (std 0.02, unit norms) the logits are small: the mean loss is ln(V) up to ~0.04.
        Net wide(small_qwen3(tied, qk_norm), 8, 43);
        wide.init(1234);
        loss = wide.forward(k);
        CHECK(loss == Approx(wide.reference_loss()).epsilon(2e-5));
        CHECK(std::fabs(loss - std::log(16.0)) < 0.04);
      }
    }
  }
}

TEST_CASE("Qwen3: gradients of every parameter match finite differences of the loss", "[layers][qwen3]") {
  struct Case {
    bool tied, qk_norm;
    int kv;
  };
  for (Case c : {Case{false, true, 2}, Case{true, true, 1}, Case{false, false, 4}}) {
    INFO("tied " << c.tied << " qk_norm " << c.qk_norm << " kv heads " << c.kv);
    CpuKernels k(2);
    Net net(small_qwen3(c.tied, c.qk_norm, c.kv), 2, 51);
    net.randomize(52, 0.2);
    check_all_gradients(net, k, 0.01);
  }
}

TEST_CASE("Qwen3: split backward (BI, then BW from wstash) is bit-identical to fused", "[layers][qwen3]") {
  for (int threads : {1, 2}) {
    for (bool tied : {false, true}) {
      INFO("threads " << threads << " tied " << tied);
      CpuKernels k(threads);
      Net net(small_qwen3(tied, true), 2, 61);
      net.randomize(62, 0.3);
      check_split_equals_fused(net, k);
    }
  }
}

TEST_CASE("Qwen3 MoE: the loss (balance loss included) matches a double-precision reference", "[layers][qwen3][moe]") {
  struct Case {
    int every;
    double capacity;
    bool norm_topk;
    int shared = 0;  // shared experts' width
  };
  for (Case c : {Case{1, 0.0, true}, Case{2, 0.0, false}, Case{1, 0.7, true}, Case{1, 0.0, true, 6},
                 Case{2, 0.7, true, 6}}) {
    for (int threads : {1, 2}) {
      INFO("every " << c.every << " capacity " << c.capacity << " norm_topk " << c.norm_topk << " shared " << c.shared
                    << " threads " << threads);
      CpuKernels k(threads);
      Net net(small_qwen3_moe(c.every, c.capacity, c.norm_topk, c.shared), 2, 71);
      net.randomize(72, 0.3);
      CHECK(net.forward(k) == Approx(net.reference_loss()).epsilon(2e-5));
      CHECK(net.buffers_intact());
    }
  }
}

TEST_CASE("Qwen3 MoE: gradients of router, experts and shared experts match finite differences", "[layers][qwen3][moe]") {
  struct Case {
    int every;
    double capacity;
    bool norm_topk;
    int shared = 0;  // shared experts' width
  };
  for (Case c : {Case{1, 0.0, true}, Case{2, 0.0, false}, Case{1, 0.7, true}, Case{1, 0.0, true, 6}}) {
    INFO("every " << c.every << " capacity " << c.capacity << " norm_topk " << c.norm_topk << " shared " << c.shared);
    CpuKernels k(2);
    Net net(small_qwen3_moe(c.every, c.capacity, c.norm_topk, c.shared), 2, 81);
    net.randomize(82, 0.2);
    check_all_gradients(net, k, 0.002, false);
  }
}

TEST_CASE("Qwen3 MoE: split backward is bit-identical to fused", "[layers][qwen3][moe]") {
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    CpuKernels k(threads);
    Net net(small_qwen3_moe(1, 0.7, true, 6), 2, 91);
    net.randomize(92, 0.3);
    check_split_equals_fused(net, k);
  }
}

TEST_CASE("Qwen3 MoE: no segment copies between device and host, routing included", "[layers][qwen3][moe]") {
  struct Case {
    double capacity;
    int shared;
    double bias_rate;
  };
  for (Case c : {Case{0.0, 0, 0.0}, Case{0.7, 6, 0.01}}) {
    INFO("capacity " << c.capacity << " shared " << c.shared << " bias rate " << c.bias_rate);
    CpuKernels cpu(2);
    ProfilingKernels k(cpu);  // counts every upload and download like a kernel
    Net net(small_qwen3_moe(1, c.capacity, true, c.shared, c.bias_rate), 2, 101);
    net.randomize(102, 0.3);
    const double loss = net.forward(k);
    if (c.bias_rate == 0) CHECK(loss == Approx(net.reference_loss()).epsilon(2e-5));  // the reference has no bias
    CHECK(std::isfinite(loss));
    net.backward(k, false);
    net.backward(k, true);
    KernelProfile p = k.take(0, 1);
    CHECK(p.by_kernel.count("moe_route") == 1);  // the routing ran, as kernels
    CHECK(p.by_kernel.count("download") == 0);
    CHECK(p.by_kernel.count("upload") == 0);
    // and the count would see one
    double host = 0;
    k.download(&host, net.params[0].data(), sizeof(float));
    CHECK(k.take(0, 1).by_kernel.at("download").downloads == 1);
  }
}

TEST_CASE("selective recompute: each split stash's tail, rerun from the kept part, gives the same gradients to the bit",
          "[layers][recompute]") {
  struct Case {
    const char* what;
    ModelSpec spec;
  };
  for (const Case& c : {Case{"GPT-2", small_gpt()}, Case{"Qwen3", small_qwen3(false, true)},
                        Case{"Qwen3 without qk_norm", small_qwen3(true, false)},
                        Case{"Qwen3-MoE with capacity", small_qwen3_moe(1, 0.7, true)}}) {
    INFO(c.what);
    CpuKernels k(2);
    Net plain(c.spec, 2, 111), split(c.spec, 2, 111);
    plain.randomize(112, 0.3);
    split.randomize(112, 0.3);
    split.split_stash = true;
    const double loss = plain.forward(k);
    const auto want = plain.backward(k, true);
    CHECK(split.forward(k) == loss);
    CHECK(split.rerun_tails(k) > 0);
    const auto got = split.backward(k, true);
    for (size_t p = 0; p < want.size(); ++p) {
      INFO("parameter " << split.model.params[p].name);
      CHECK(got[p] == want[p]);
    }
    CHECK(split.buffers_intact());
  }
}
