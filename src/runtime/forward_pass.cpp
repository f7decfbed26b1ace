// A model's forward on one device for sampling: the segments in model order over one sequence of T tokens, their
// buffers carved for the longest context and reused for shorter ones (segments carve from the start).
#include "runtime/forward_pass.hpp"

#include <algorithm>

#include "backend/ragged_rows.hpp"
#include "model/segment_type.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

// The model's dims for a context of T tokens: every routed token kept (no expert capacity).
ModelDims context_dims(const ModelDims& d, int T) {
  ModelDims c = d;
  c.seq_len = T;
  c.rows_per_sample = T;
  c.moe_capacity_factor = 0;
  return c;
}

}  // namespace

ForwardPass::ForwardPass(const Model& model, Backend& backend)
    : model_(model), backend_(backend), k_(backend.kernels()), stream_(backend.make_stream("forward")) {
  backend_.bind(stream_.get());
  if (!model_.reads_tokens)
    throw UserError(cat("model.kind = \"", model_.kind, "\" is not a language model: there are no tokens to sample"));
  const auto head = std::find_if(model_.segments.begin(), model_.segments.end(),
                                 [](const Segment& s) { return s.type->logits != nullptr; });
  PIPER_CHECK(head != model_.segments.end(), "model.kind '", model_.kind, "' has no head that gives logits");
  head_ = size_t(head - model_.segments.begin());
  const ModelDims d = context_dims(model_.dims, model_.dims.seq_len);
  size_t scratch_floats = 0, routing = 0, workspace_bytes = 0;
  for (size_t s = 0; s <= head_; ++s) {
    const Segment& seg = model_.segments[s];
    const SegmentSizes z = segment_sizes(seg, d, 1);
    out_.push_back(z.out_bytes ? device(z.out_bytes) : nullptr);
    stash_.push_back(z.stash_bytes ? device(z.stash_bytes) : nullptr);
    scratch_floats = std::max(scratch_floats, segment_scratch_floats(k_, seg, d, 1));
    workspace_bytes = std::max(workspace_bytes, z.workspace_bytes);
    if (seg.type->routed_experts) routing = std::max(routing, size_t(routing_stats_size(seg.type->routed_experts(d))));
  }
  if (scratch_floats) scratch_ = static_cast<float*>(device(scratch_floats * sizeof(float)));
  if (workspace_bytes) workspace_ = static_cast<float*>(device(workspace_bytes));
  sums_ = static_cast<double*>(device((2 + routing) * sizeof(double)));
  backend_.zero(sums_, (2 + routing) * sizeof(double));
  params_.assign(model_.params.size(), nullptr);
  for (size_t p = 0; p < model_.params.size(); ++p)
    params_[p] = static_cast<float*>(device(size_t(model_.params[p].numel) * sizeof(float)));
}

ForwardPass::~ForwardPass() {
  backend_.synchronize(stream_.get());
  for (auto& [p, bytes] : owned_) backend_.release(p, bytes);
}

void* ForwardPass::device(size_t bytes) {
  void* p = backend_.allocate(bytes);
  owned_.emplace_back(p, bytes);
  return p;
}

void ForwardPass::set_param(size_t index, const std::vector<float>& values) {
  PIPER_CHECK(index < params_.size() && values.size() == size_t(model_.params[index].numel), "parameter ", index,
              ": ", values.size(), " values for ", model_.params[index].numel);
  k_.upload(params_[index], values.data(), values.size() * sizeof(float));
}

std::vector<float> ForwardPass::next_logits(const std::vector<int32_t>& tokens) {
  const int T = int(tokens.size());
  PIPER_CHECK(T >= 1 && T <= max_context(), T, " tokens: a context holds 1 to ", max_context());
  const ModelDims d = context_dims(model_.dims, T);
  const std::vector<int32_t> targets(size_t(T), 0);  // the head's cross-entropy statistics are not read
  std::vector<const float*> w;
  for (size_t s = 0; s <= head_; ++s) {
    const Segment& seg = model_.segments[s];
    const SegmentSizes z = segment_sizes(seg, d, 1);
    if (seg.type->data == DataSlot::Tokens) k_.upload(stash_[s], tokens.data(), tokens.size() * sizeof(int32_t));
    if (seg.type->data == DataSlot::Targets) k_.upload(stash_[s], targets.data(), targets.size() * sizeof(int32_t));
    w.assign(seg.params.size(), nullptr);
    for (size_t i = 0; i < seg.params.size(); ++i) w[i] = params_[size_t(seg.params[i])];
    SegmentIO io;
    io.samples = 1;
    io.w = w.data();
    io.in = seg.type->reads_input ? static_cast<const float*>(out_[s - 1]) : nullptr;
    io.out = static_cast<float*>(out_[s]);
    io.stash = stash_[s];
    if (seg.type->link_offset != 0) io.link = stash_[size_t(int(s) + seg.type->link_offset)];
    if (z.ragged_parts > 0 && io.in) {  // the input's part counts, on the host (a plan's counts read)
      counts_.resize(size_t(z.ragged_parts));
      k_.download(counts_.data(), RaggedRows(io.in, z.ragged_parts).counts, counts_.size() * sizeof(int32_t));
      io.counts = counts_.data();
    }
    io.scratch = scratch_;
    io.workspace = workspace_;
    io.loss_sum = sums_;
    io.balance_loss = sums_ + 1;
    if (seg.type->routed_experts) io.routing = sums_ + 2;
    io.loss_scale = 1.f / float(T);
    segment_forward(k_, seg, d, io);
  }
  // the last position's row of the head's logits (T, vocab)
  const float* logits = model_.segments[head_].type->logits(d, 1, stash_[head_]);
  std::vector<float> out(static_cast<size_t>(vocab()));
  k_.download(out.data(), logits + int64_t(T - 1) * vocab(), out.size() * sizeof(float));
  return out;
}

}  // namespace piper
