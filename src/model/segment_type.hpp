// A segment type: one kind of model segment a family registers — what it reads from data, the sizes of
// its buffers, and its forward, backward-input (BI) and backward-weight (BW) as backend kernel calls.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/kernels.hpp"
#include "model/model.hpp"

namespace piper {

// Sizes of the per-microbatch buffers of one segment. The compiler sizes plan buffers from these; the
// segment code carves the same buffers with the same offsets.
struct SegmentSizes {
  // Ragged activations (backend/ragged_rows.hpp): parts and row width of input and output. A segment with ragged
  // input gets the input's counts on the host (SegmentIO::counts); no segment copies device memory to the host.
  int ragged_parts = 0, ragged_width = 0;
  size_t out_bytes = 0;        // activation handed to the next segment (0 for the loss segment)
  size_t stash_bytes = 0;      // forward → backward
  // The part of the stash selective recompute keeps through the forward (its first bytes, model/stash_carver.hpp);
  // SegmentType::rerun_tail recomputes the rest. 0: the type has no such split (selective keeps it all).
  size_t stash_kept_bytes = 0;
  size_t wstash_bytes = 0;     // backward-input → backward-weight
  size_t workspace_bytes = 0;  // scratch during a forward or backward (excluding the backend scratch)
  size_t input_bytes = 0;      // activation this segment reads (0 when it reads data)
};

// A stash as runs of 4-byte values in the order the segment carves them (model/stash_carver.hpp): floats that a
// bf16 run stores as bf16, at half the bytes, and values stored as they are (int32 ids; statistics such as a
// norm's rstd or a softmax's log-sum-exp). Stored so, each run starts 4-byte aligned, one after another. A run
// in place (a bf16 activation, kernels.hpp's Act) is written and read by the segment where it is stored: it takes
// no room in the fp32 view of a pass.
struct StashRun {
  uint64_t offset = 0, bytes = 0;  // in the fp32 view (a run in place: where the view would have it)
  bool exact = false;
  bool in_place = false;
};
struct StashLayout {
  std::vector<StashRun> runs;  // in order, one after another from 0
  // Appends a run, or extends the last one where it is of the same kind.
  void add(uint64_t offset, uint64_t bytes, bool exact, bool in_place = false) {
    if (bytes == 0) return;
    if (!runs.empty() && !in_place && !runs.back().in_place && runs.back().exact == exact &&
        runs.back().offset + runs.back().bytes == offset)
      runs.back().bytes += bytes;
    else
      runs.push_back({offset, bytes, exact || in_place, in_place});
  }
  static uint64_t packed_size(const StashRun& r) { return r.exact ? r.bytes : (r.bytes / 2 + 3) / 4 * 4; }
  // The fp32 view of a pass: every run but those in place.
  uint64_t view_bytes() const {
    for (auto r = runs.rbegin(); r != runs.rend(); ++r)
      if (!r->in_place) return r->offset + r->bytes;
    return 0;
  }
  uint64_t packed_bytes() const {
    uint64_t n = 0;
    for (const StashRun& r : runs) n += packed_size(r);
    return n;
  }
  // The runs in place: with the view, the bytes of the stash as one buffer (SegmentSizes::stash_bytes).
  uint64_t in_place_bytes() const {
    uint64_t n = 0;
    for (const StashRun& r : runs) n += r.in_place ? r.bytes : 0;
    return n;
  }
};

// What the executor loads into the start of a segment's stash before its forward.
enum class DataSlot : uint8_t {
  None,
  Tokens,    // int32 (samples, T): input ids
  Targets,   // int32 (samples, T): next-token ids
  Labels,    // int32 (samples): class labels
  Features,  // fp32 (samples, d_in)
};

struct SegmentIO {
  int samples = 0;                  // sequences or samples in this microbatch
  const float* const* w = nullptr;  // parameters, in Segment::params order
  float* const* g = nullptr;        // their gradients, same order
  const uint8_t* overwrite = nullptr;  // [i] != 0: gradient i is written (first write of the step), else added
  const float* in = nullptr;        // activation from the previous segment; null when reading data
  float* out = nullptr;             // activation for the next segment; null for the loss segment
  void* stash = nullptr;            // forward → backward (data is loaded into its start, see DataSlot)
  void* stash_tail = nullptr;       // selective recompute: the stash's recomputed part, apart (null: after its kept part)
  // A stash held in bf16 and used in a view (stash is then the view): where it is held, in its layout's order. The
  // runs in place (bf16 activations) are there, not in the view.
  void* stash_held = nullptr;
  float* wstash = nullptr;          // backward-input → backward-weight
  void* link = nullptr;             // the stash of the segment SegmentType::link_offset away (same microbatch)
  float* workspace = nullptr;       // scratch, SegmentSizes::workspace_bytes
  float* scratch = nullptr;         // backend scratch, SegmentType::scratch_floats
  const float* dout = nullptr;      // gradient of `out`; unused by the loss segment (it starts from the loss)
  float* din = nullptr;             // gradient of `in`; null when the segment reads data
  double* loss_sum = nullptr;       // the loss segment adds loss_scale · Σ token losses (device memory)
  float loss_scale = 1.f;           // 1 / tokens of the global batch
  double* balance_loss = nullptr;   // device memory: segments with a balance loss add theirs (already scaled)
  double* routing = nullptr;        // device memory (forward): a routing segment adds its statistics block
  // Host memory: the part counts of a ragged input (SegmentSizes::ragged_parts), brought to the host by the plan
  // (the exchange that delivered the input, or a read of its counts); null for other segments. Read by every
  // pass: the input stays until the backward weight.
  const int32_t* counts = nullptr;
  int shard = 0, shards = 1;        // a sharded segment's part: this rank's index among the set's ranks
  // Whether gradient i is added to what is there (a later writer of the same parameter this step).
  bool accumulate(int i) const { return !(overwrite && overwrite[i]); }
};

using SegmentFn = void (*)(Kernels& k, const Segment& seg, const ModelDims& d, const SegmentIO& io);

// How a tensor-parallel segment's parameter is held by the k ranks of a tensor-parallel group. Split: rank t holds
// piece t of the flattened tensor seen as (outer, k, inner) — for o < outer the elements [o·k·inner + t·inner,
// + inner), one after another (outer·inner elements). A (R, C) matrix split by rows is {1, R·C/k}; by columns
// {R, C/k} (then the piece is the (R, C/k) matrix of its columns). Copy (outer = 0): every rank holds the whole
// tensor, and its gradient is partial: the sum over the group's ranks is the gradient.
struct ParamSplit {
  int64_t outer = 0, inner = 0;
  bool split() const { return outer > 0; }
  static ParamSplit rows(int64_t r, int64_t c, int k) { return {1, r * c / k}; }
  static ParamSplit cols(int64_t r, int64_t c, int k) { return {r, c / k}; }
  static ParamSplit copy() { return {}; }
};

struct SegmentType {
  std::string name;                  // "gpt2.attention": how plans name it
  DataSlot data = DataSlot::None;    // data loaded before the forward
  bool reads_input = true;           // takes the previous segment's activation (false: starts from data)
  bool computes_loss = false;        // last segment: no output; its backward starts from the loss
  SegmentSizes (*sizes)(const Segment& seg, const ModelDims& d, int samples) = nullptr;
  SegmentFn forward = nullptr;
  SegmentFn backward_input = nullptr;   // null: nothing to do (no input gradient)
  SegmentFn backward_weight = nullptr;
  // With SegmentSizes::stash_kept_bytes: from the kept part of the stash (and the input and parameters), writes
  // the tail exactly as the forward did. Adds to no loss or statistics.
  SegmentFn rerun_tail = nullptr;
  // The runs of its stash (the whole, kept part then tail), for storing it in bf16 between the forward and the
  // backward; null: the stash stays fp32 (segments that read data into it, or share it with a linked segment).
  StashLayout (*stash_layout)(const Segment& seg, const ModelDims& d, int samples) = nullptr;
  // Backend scratch its backward needs, in floats (sized at run time by the backend); null: none.
  size_t (*scratch_floats)(const Kernels& k, const ModelDims& d, int samples) = nullptr;
  // The compiler's estimate of that scratch, in bytes, for `threads` compute threads.
  uint64_t (*scratch_estimate)(const ModelDims& d, int samples, int threads) = nullptr;
  bool adds_balance_loss = false;  // its forward adds to SegmentIO::balance_loss
  // Non-zero: this segment reads and writes the stash of the segment `link_offset` positions away (a
  // block's halves sharing state around an exchange); both must run on the same device set.
  int link_offset = 0;
  // Shardable segments: their parameters come in this many equal parts (experts), which the shard
  // directive spreads over a device set's ranks; input and output are then exchanged (ragged rows).
  int (*shard_units)(const ModelDims& d) = nullptr;
  // Tensor-parallel segments: with Segment::shards = k > 1, rank SegmentIO::shard of a group of k runs its part —
  // parameter `slot` held as tp_split(d, slot, k) says — and its output, its input's gradient and the gradients
  // of its copied parameters are partial: their sum over the group is the whole (so the residual and any bias
  // after a split matmul are added by shard 0 alone). tp_refusal: why k ranks cannot split it ("" when they can).
  ParamSplit (*tp_split)(const ModelDims& d, int slot, int k) = nullptr;
  std::string (*tp_refusal)(const ModelDims& d, int k) = nullptr;
  // What such a segment's output is on rank t: partial (summed over the group: an all-reduce), its t-th of k equal
  // parts, the whole being all of them in rank order (an all-gather), or its own (routed rows, which an exchange
  // carries); and whether its input gradient is partial (summed: an all-reduce) or its own.
  enum class TpOutput : uint8_t { Partial, Gathered, Own } tp_output = TpOutput::Partial;
  bool tp_input_grad_partial = true;
  // Rank t of a group of k works on its share of the microbatch's samples, [t·b/k, (t+1)·b/k) (b must divide).
  bool tp_splits_samples = false;
  // Its forward and backward treat each sample apart: a microbatch run in pieces of its samples, one after another,
  // computes the same (weight gradients summed piece by piece). Lets a stash held in bf16 be used in pieces.
  bool samples_apart = false;
  // Routing segments (a mixture of experts' router): the experts they route to. Their forward adds, per step,
  // a RoutingStats block to SegmentIO::routing: the assignments each expert was chosen for, then the dropped.
  int (*routed_experts)(const ModelDims& d) = nullptr;
  // With routed_experts: how a parameter it names (ParamSpec::statistics_segment) moves after a step, element by
  // element (`delta`, that parameter's numel), from the step's global statistics block of this segment.
  void (*statistics_step)(const ModelDims& d, const double* routing, float* delta) = nullptr;
  // The head of a language model: where its forward left the logits (samples·T, vocab) of the whole vocabulary in
  // its stash (one shard), for sampling. Null for other segments.
  const float* (*logits)(const ModelDims& d, int samples, const void* stash) = nullptr;
};

// Doubles of a routing segment's statistics block: E loads, then the dropped assignments.
inline int routing_stats_size(int experts) { return experts + 1; }

// The registered segment type called `name`, or null.
const SegmentType* find_segment_type(const std::string& name);

inline void segment_forward(Kernels& k, const Segment& s, const ModelDims& d, const SegmentIO& io) {
  s.type->forward(k, s, d, io);
}
inline void segment_backward_input(Kernels& k, const Segment& s, const ModelDims& d, const SegmentIO& io) {
  if (s.type->backward_input) s.type->backward_input(k, s, d, io);
}
inline void segment_backward_weight(Kernels& k, const Segment& s, const ModelDims& d, const SegmentIO& io) {
  if (s.type->backward_weight) s.type->backward_weight(k, s, d, io);
}
inline SegmentSizes segment_sizes(const Segment& s, const ModelDims& d, int samples) {
  return s.type->sizes(s, d, samples);
}
// What a stash held in bf16 holds (ComputeArgs::stash_bf16): the type's stash layout, then with `input` the
// segment's input (SegmentSizes::input_bytes, rounded to bf16 as well).
inline StashLayout held_stash_layout(const Segment& s, const ModelDims& d, int samples, bool input) {
  StashLayout layout = s.type->stash_layout(s, d, samples);
  if (input) layout.add(layout.view_bytes(), segment_sizes(s, d, samples).input_bytes, false);
  return layout;
}

// A stash held in bf16, as its passes use it: a type whose samples are apart may run each pass in `pieces` pieces of
// samples / pieces samples, each piece's stash held after the one before, so that the fp32 view of a pass holds one
// piece; a weight gradient is summed piece by piece. Other types, and segments spread over ranks: one piece.
struct HeldStash {
  int pieces = 1;
  StashLayout piece;  // one piece's held runs (held_stash_layout of samples / pieces samples)
  uint64_t held_bytes() const { return uint64_t(pieces) * piece.packed_bytes(); }
  uint64_t view_bytes() const { return piece.view_bytes(); }
};
// When a pass goes by pieces (Plan::held_pieces): where its whole view would pass `view_limit` bytes, in pieces of
// the most samples whose view stays within it, but never fewer rows than `min_rows` where the microbatch has them
// (smaller matmuls lose speed); view_limit 0: one piece always.
struct HeldPieceRule {
  int64_t min_rows = 512;
  uint64_t view_limit = 0;
};
HeldStash held_stash(const Segment& s, const ModelDims& d, int samples, bool input, const HeldPieceRule& rule);
inline size_t segment_scratch_floats(const Kernels& k, const Segment& s, const ModelDims& d, int samples) {
  return s.type->scratch_floats ? s.type->scratch_floats(k, d, samples) : 0;
}

}  // namespace piper
