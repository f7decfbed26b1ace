// The instruction set in one table: every op's name, kind, label, whether it is posted and completed later,
// the operands it reads and writes, the bytes it sends and its cost class. A new op is one row here, an
// executor handler, and a payload in instr.hpp when its kind is new (an OpKind is a payload type).
#pragma once
#include <cstddef>
#include <cstdint>

namespace piper {

enum class Op : uint8_t {
  Forward, Backward, BackwardInput, BackwardWeight,  // one segment, one microbatch (and Recompute below)
  Update,                                            // AdamW on a bucket's owned range
  Send, Recv,                                        // point-to-point (posted, completed later)
  AllReduce, ReduceScatter, AllGather,               // collectives on a group
  AllToAll,                                          // counted rows exchanged inside a group (sharded segments)
  StepSync,                                          // all ranks: sum of [grad norm², loss]; sets the clip scale
  ReadCounts,                                        // the counts of ragged rows, read to the host
  Recompute,                                         // a segment's forward again, for its backward's stash
};
constexpr size_t kOpCount = 14;

enum class OpKind : uint8_t {
  Compute,       // a segment's pass on one microbatch
  Update,        // the optimizer on a bucket's range
  PointToPoint,  // send or receive with a peer device set
  Collective,    // all-reduce, reduce-scatter, all-gather on a group
  AllToAll,      // counted rows exchanged inside a group
  StepSync,      // the step's scalar sums over every rank
  HostRead,      // device memory the host must know, read on a stream (the host waits for it)
};
constexpr size_t kOpKindCount = 7;

// The operand roles of an instruction (fields of Instr), as bits of OpInfo::reads and OpInfo::writes.
enum Operand : uint32_t {
  kOperandIn = 1u << 0,       // in
  kOperandOut = 1u << 1,      // out
  kOperandStash = 1u << 2,    // stash
  kOperandWStash = 1u << 3,   // wstash
  kOperandDout = 1u << 4,     // dout
  kOperandDin = 1u << 5,      // din
  kOperandLink = 1u << 6,     // link: read and written by every pass of a linked segment
  kOperandParams = 1u << 7,   // pbuf[]
  kOperandGrads = 1u << 8,    // gbuf[]
  kOperandBuf = 1u << 9,      // buf
  kOperandSrc = 1u << 10,     // src
  kOperandTmp = 1u << 11,     // tmp
  kOperandM = 1u << 12,       // m
  kOperandV = 1u << 13,       // v
  kOperandSpans = 1u << 14,   // spans[].buf
  kOperandStashView = 1u << 15,  // stash_view: the fp32 stash of a stash held in bf16, scratch of one pass
  kOperandWire = 1u << 16,       // wire: the bf16 staging of a collective that travels in bf16
};

// The bytes one rank sends for an instruction of a group of n (instr_send_bytes).
enum class SendRule : uint8_t {
  None,           // nothing on the wire (compute, update; a receive is counted by its sender)
  Message,        // count floats to one peer
  RingAllReduce,  // 2 (n-1)/n · count floats
  PerRankCount,   // (n-1) · count floats: count is each rank's share
  RowsBound,      // (n-1)/n · rows · count floats: a bound on counted rows of width count
};

// How the cost model prices an instruction (CostModel::seconds).
enum class CostRule : uint8_t {
  Flops,         // the segment's forward FLOPs × flops_factor at the device's rate
  MemoryPasses,  // four passes over count floats (parameters, gradients, two moments) at memory bandwidth
  Latency,       // one latency (a handful of scalars)
  Message,       // latency + count floats at point-to-point bandwidth
  Collective,    // latency per peer + the bytes sent (SendRule) at collective bandwidth
};

struct OpInfo {
  Op op;
  const char* name;         // as plans print it: "forward"
  const char* label;        // the start of its label for people and traces: "F", "SEND"
  OpKind kind;
  bool async;               // posted now, observed complete later (a communication handle)
  uint32_t reads, writes;   // Operand bits
  SendRule send;
  double flops_factor;      // compute: FLOPs as a multiple of the segment's forward (cost model)
  const char* trace_category;
  CostRule cost;
};

inline constexpr uint32_t kComputeLink = kOperandLink;  // every compute pass reads and writes a linked stash

inline constexpr OpInfo kOpTable[] = {
    {Op::Forward, "forward", "F", OpKind::Compute, false, kComputeLink | kOperandIn | kOperandParams,
     kComputeLink | kOperandOut | kOperandStash | kOperandStashView, SendRule::None, 1.0, "compute", CostRule::Flops},
    // heads turn probabilities into logit gradients in place: the stash is written
    {Op::Backward, "backward", "B", OpKind::Compute, false, kComputeLink | kOperandIn | kOperandDout | kOperandParams,
     kComputeLink | kOperandStash | kOperandDin | kOperandWStash | kOperandGrads | kOperandStashView, SendRule::None,
     2.0, "compute",
     CostRule::Flops},
    {Op::BackwardInput, "backward_input", "BI", OpKind::Compute, false,
     kComputeLink | kOperandIn | kOperandDout | kOperandParams,
     kComputeLink | kOperandStash | kOperandDin | kOperandWStash | kOperandGrads | kOperandStashView, SendRule::None,
     1.0, "compute",
     CostRule::Flops},
    {Op::BackwardWeight, "backward_weight", "BW", OpKind::Compute, false,
     kComputeLink | kOperandIn | kOperandStash | kOperandDout | kOperandWStash,
     kComputeLink | kOperandGrads | kOperandStashView,
     SendRule::None, 1.0, "compute", CostRule::Flops},
    {Op::Update, "update", "UPDATE", OpKind::Update, false, kOperandSrc, kOperandBuf | kOperandM | kOperandV,
     SendRule::None, 0.0, "optimizer", CostRule::MemoryPasses},
    {Op::Send, "send", "SEND", OpKind::PointToPoint, true, kOperandBuf, 0, SendRule::Message, 0.0, "p2p",
     CostRule::Message},
    {Op::Recv, "recv", "RECV", OpKind::PointToPoint, true, 0, kOperandBuf, SendRule::None, 0.0, "p2p",
     CostRule::Message},
    {Op::AllReduce, "all_reduce", "ALL_REDUCE", OpKind::Collective, true, 0, kOperandBuf | kOperandWire,
     SendRule::RingAllReduce,
     0.0, "collective", CostRule::Collective},
    {Op::ReduceScatter, "reduce_scatter", "REDUCE_SCATTER", OpKind::Collective, true, kOperandSrc,
     kOperandBuf | kOperandTmp | kOperandWire, SendRule::PerRankCount, 0.0, "collective", CostRule::Collective},
    {Op::AllGather, "all_gather", "ALL_GATHER", OpKind::Collective, true, kOperandSrc, kOperandBuf | kOperandWire,
     SendRule::PerRankCount, 0.0, "collective", CostRule::Collective},
    {Op::AllToAll, "all_to_all", "ALL_TO_ALL", OpKind::AllToAll, true, kOperandSrc, kOperandBuf, SendRule::RowsBound,
     0.0, "collective", CostRule::Collective},
    {Op::StepSync, "step_sync", "STEP_SYNC", OpKind::StepSync, false, kOperandSpans, 0, SendRule::None, 0.0,
     "optimizer", CostRule::Latency},
    {Op::ReadCounts, "read_counts", "COUNTS", OpKind::HostRead, false, kOperandBuf, 0, SendRule::None, 0.0, "host",
     CostRule::Latency},
    // the forward once more, its output discarded, its stash kept for the backward; adds to no loss or statistics
    {Op::Recompute, "recompute", "R", OpKind::Compute, false, kComputeLink | kOperandIn | kOperandParams,
     kComputeLink | kOperandOut | kOperandStash, SendRule::None, 1.0, "compute", CostRule::Flops},
};

constexpr bool op_table_in_order() {
  for (size_t i = 0; i < sizeof(kOpTable) / sizeof(kOpTable[0]); ++i)
    if (size_t(kOpTable[i].op) != i) return false;
  return true;
}
static_assert(sizeof(kOpTable) / sizeof(kOpTable[0]) == kOpCount, "one row of kOpTable per Op");
static_assert(op_table_in_order(), "kOpTable's rows are in the order of Op");

constexpr const OpInfo& op_info(Op op) { return kOpTable[size_t(op)]; }
constexpr const char* op_name(Op op) { return size_t(op) < kOpCount ? op_info(op).name : "?"; }
constexpr bool op_is_compute(Op op) { return op_info(op).kind == OpKind::Compute; }
// Posted now, complete later (point-to-point and collectives other than the step sync).
constexpr bool op_is_async(Op op) { return op_info(op).async; }

}  // namespace piper
