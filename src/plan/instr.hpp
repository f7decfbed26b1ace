// One instruction of a plan: a small header (op, stream, IR node, microbatch, waits) and a typed payload per
// op kind (op_table.hpp), each listing the buffers it names once, in its operand roles.
#pragma once
#include <cstdint>
#include <utility>
#include <variant>
#include <vector>

#include "plan/op_table.hpp"

namespace piper {

// A range of a buffer; with per_replica set the offset moves by replica × count on each rank.
struct Span {
  int32_t buf = -1;
  int64_t offset = 0;
  int64_t count = 0;
  bool per_replica = false;  // moved by count × the rank's index among the replicas holding the same slice:
  int32_t slices = 1;        // replica / slices (its bucket's PlanBucket::slices)
};

// Bits of UpdateArgs::flags and CollectiveArgs::flags: which offsets move by replica × count on each rank.
constexpr uint8_t kFlagAccumulate = 1;   // reduce-scatter: add into buf instead of writing
constexpr uint8_t kFlagBufShard = 2;     // buf offset += replica × count
constexpr uint8_t kFlagSrcShard = 4;     // src offset += replica × count
constexpr uint8_t kFlagBucketShard = 8;  // update: the bucket range starts at replica × count
constexpr uint8_t kFlagBf16Wire = 16;    // collective: travels (and sums) in bf16, staged in `wire`

// ComputeArgs::stash_bf16 bits
constexpr uint8_t kStashBf16 = 1;
constexpr uint8_t kStashHoldsInput = 2;

// Forward, Backward, BackwardInput, BackwardWeight, Recompute: one segment's pass over one microbatch.
struct ComputeArgs {
  int32_t segment = -1;
  int32_t sample_offset = 0;  // first sample of the microbatch within this replica's slice
  int32_t samples = 0;
  float loss_scale = 0;
  // buffers (ids or -1): input activation, output activation, forward→backward stash, BI→BW stash,
  // output gradient, input gradient, and the stash of the segment this one's type links to
  int32_t in = -1, out = -1, stash = -1, wstash = -1, dout = -1, din = -1, link = -1;
  int32_t stash_tail = -1;  // selective recompute: the stash's recomputed part, in a buffer of its own
  std::vector<int32_t> pbuf, gbuf;  // per segment parameter: buffer holding it / its gradient
  std::vector<uint8_t> overwrite;   // [i] != 0: gradient of segment param i is written, not accumulated
  // > 1: each block of this many consecutive replicas computes this alike (and sums the gradients); its first
  // computes the weight gradients and adds to the loss and statistics, the others write zero gradients (or add
  // nothing) and add where nothing reads
  int32_t alike_block = 1;
  // Stashes held in bf16 (a bf16 run's segments with a SegmentType::stash_layout). kStashBf16: `stash` holds the
  // layout's runs packed (model/segment_type.hpp); the forward writes the stash in fp32 into `stash_view` and stores
  // it so, and a backward reads it back there first. kStashHoldsInput: the stash also holds the segment's input,
  // after the layout's runs, which a backward then reads from the view (`in` unset): the input's own buffer ends
  // with the forward.
  uint8_t stash_bf16 = 0;
  int32_t stash_view = -1;

  template <typename Fn>  // fn(Operand role, buffer id) for every buffer named (ids may be -1)
  void operands(Fn&& fn) const {
    for (auto [role, b] : {std::pair{kOperandIn, in}, {kOperandOut, out}, {kOperandStash, stash},
                           {kOperandStash, stash_tail}, {kOperandWStash, wstash}, {kOperandDout, dout},
                           {kOperandDin, din}, {kOperandLink, link}, {kOperandStashView, stash_view}})
      fn(role, b);
    for (int32_t b : pbuf) fn(kOperandParams, b);
    for (int32_t b : gbuf) fn(kOperandGrads, b);
  }
};

// Update: AdamW on `count` elements of a bucket's owned range.
struct UpdateArgs {
  int32_t bucket = -1;
  uint8_t flags = 0;  // kFlagBucketShard, kFlagBufShard, kFlagSrcShard
  int32_t buf = -1;   // parameters, from `offset`
  int32_t src = -1;   // gradients, from `src_offset`
  int32_t m = -1, v = -1;  // AdamW moments, from 0
  int64_t offset = 0, src_offset = 0;
  int64_t count = 0;  // elements updated

  template <typename Fn>
  void operands(Fn&& fn) const {
    fn(kOperandBuf, buf);
    fn(kOperandSrc, src);
    fn(kOperandM, m);
    fn(kOperandV, v);
  }
};

// Send, Recv: `count` floats of `buf` from `offset`, to or from the same replica of another device set.
struct MessageArgs {
  int32_t peer_set = -1;
  int32_t tag = 0;  // the IR id of the SEND
  int32_t buf = -1;
  int64_t offset = 0;
  int64_t count = 0;  // floats in the message

  template <typename Fn>
  void operands(Fn&& fn) const {
    fn(kOperandBuf, buf);
  }
};

// AllReduce, ReduceScatter, AllGather on a group: destination `buf`, source `src` (-1: in place), scratch `tmp`.
// With kFlagBf16Wire the floats travel as bf16 through `wire`: an all-reduce's count bf16 values, a reduce-scatter's
// group·count sent then its count received, an all-gather's group·count (this rank's share at rank·count).
struct CollectiveArgs {
  int32_t bucket = -1;
  int32_t group = -1;  // index into Plan::groups
  uint8_t flags = 0;   // kFlagAccumulate, kFlagBufShard, kFlagSrcShard, kFlagBf16Wire
  int32_t buf = -1, src = -1, tmp = -1, wire = -1;
  int64_t offset = 0, src_offset = 0;
  int64_t count = 0;  // all-reduce: floats reduced; reduce-scatter and all-gather: floats of each rank's share

  template <typename Fn>
  void operands(Fn&& fn) const {
    fn(kOperandBuf, buf);
    fn(kOperandSrc, src);
    fn(kOperandTmp, tmp);
    fn(kOperandWire, wire);
  }
};

// AllToAll: counted rows of `row_width` floats from `src` to `buf`, in `parts` parts (part p goes to rank
// p / (parts / n) of the group's n).
struct AllToAllArgs {
  int32_t group = -1;
  int32_t buf = -1, src = -1;
  int32_t parts = 0;
  int32_t row_width = 0;
  int64_t rows = 0;  // rows this rank sends at most (for the cost model)

  template <typename Fn>
  void operands(Fn&& fn) const {
    fn(kOperandBuf, buf);
    fn(kOperandSrc, src);
  }
};

// StepSync: every rank's sums of [loss, grad norm²] over the world group; sets the clip scale.
struct StepSyncArgs {
  int32_t group = -1;
  std::vector<Span> spans;  // gradient ranges this rank counts in the norm

  template <typename Fn>
  void operands(Fn&& fn) const {
    for (const Span& s : spans) fn(kOperandSpans, s.buf);
  }
};

// ReadCounts: the `parts` counts at the start of ragged rows `buf` (backend/ragged_rows.hpp), copied to the host
// for the segments that read those rows (SegmentIO::counts). The stream's work before it finishes first.
struct CountsArgs {
  int32_t buf = -1;
  int32_t parts = 0;

  template <typename Fn>
  void operands(Fn&& fn) const {
    fn(kOperandBuf, buf);
  }
};

// Alternative i is the payload of OpKind i.
using InstrArgs =
    std::variant<ComputeArgs, UpdateArgs, MessageArgs, CollectiveArgs, AllToAllArgs, StepSyncArgs, CountsArgs>;
static_assert(std::variant_size_v<InstrArgs> == kOpKindCount, "one payload per OpKind");

struct Instr {
  Op op = Op::Forward;
  uint8_t stream = 0;
  int32_t node = -1;           // IR node, for traces and messages
  int32_t mb = -1;             // microbatch, for traces and labels (-1: none)
  std::vector<int32_t> waits;  // instructions (on other streams) that must be complete first
  InstrArgs args;              // the payload of op's kind

  Instr() = default;
  explicit Instr(Op o) { set_op(o); }
  // Sets the op and an empty payload of its kind.
  void set_op(Op o);

  // The payload, read-only (a payload is built apart and assigned to args, or changed through std::get).
  const ComputeArgs& compute() const { return std::get<ComputeArgs>(args); }
  const UpdateArgs& update() const { return std::get<UpdateArgs>(args); }
  const MessageArgs& message() const { return std::get<MessageArgs>(args); }
  const CollectiveArgs& collective() const { return std::get<CollectiveArgs>(args); }
  const AllToAllArgs& all_to_all() const { return std::get<AllToAllArgs>(args); }
  const StepSyncArgs& step_sync() const { return std::get<StepSyncArgs>(args); }
  const CountsArgs& counts() const { return std::get<CountsArgs>(args); }

  int32_t group() const;   // the communicator group (index into Plan::groups), or -1
  int32_t bucket() const;  // the bucket updated or communicated, or -1
  // fn(Operand role, buffer id) for every buffer the payload names (ids may be -1).
  template <typename Fn>
  void operands(Fn&& fn) const {
    std::visit([&](const auto& a) { a.operands(fn); }, args);
  }
};

// Offset of this replica's share: replica × count where `flags` has `flag`, else 0.
inline int64_t replica_shift(uint8_t flags, uint8_t flag, int replica, int64_t count) {
  return (flags & flag) ? int64_t(replica) * count : 0;
}

}  // namespace piper
