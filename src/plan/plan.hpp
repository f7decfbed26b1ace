// A plan: everything one rank needs to train — the model description, its buffers and their sizes,
// parameter buckets with the slices it owns, communicator groups as rank lists, and an ordered list of
// instructions with streams and waits. DP replicas share one body; a small binding tells them apart.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/data.hpp"
#include "model/model.hpp"
#include "model/segment_type.hpp"
#include "plan/instr.hpp"
#include "util/optimizer_config.hpp"
#include "util/precision.hpp"

namespace piper {

constexpr uint32_t kPlanVersion = 23;

enum class BufferKind : uint8_t { Param, Grad, OptState, Activation, Comm, Workspace };
constexpr int kBufferKinds = 6;
const char* buffer_kind_name(BufferKind k);

struct PlanBuffer {
  uint64_t bytes = 0;
  uint64_t zero_from = UINT64_MAX;  // bytes from here to the end are zeroed when allocated (padding)
  BufferKind kind = BufferKind::Activation;
  bool persistent = false;  // allocated once; otherwise allocated at first use, freed after its last use
  int32_t uses = 0;         // instructions that reference it per step (transient buffers)
  std::string name;         // for printing and traces
};

// A parameter present on this rank: where it lives inside its bucket. In a bucket of tensor-parallel pieces
// (PlanBucket::slices pieces) each parameter has one entry per piece: piece t, in slice t (owned_slices.hpp).
struct PlanParam {
  int32_t model_param = -1;  // index into Plan::params
  int32_t bucket = -1;
  int64_t offset = 0;        // elements from the bucket start
  bool home = true;          // false: a tied copy (not counted in the norm, not saved)
  uint8_t padding0_[3] = {};  // explicit, so that the plan (which copies these bytes) is the same every run
  int32_t piece = -1;        // -1: the whole parameter; else its piece t as the ParamSplit {outer, inner} says
  int64_t split_outer = 0, split_inner = 0;
};

// What a collective group is, independently of which replica runs the plan.
// A set's replicas in blocks of k (an expert group: replicas [j·k, (j+1)·k)) are SetBlock {set, k}; the replicas
// at one position of every block (the copies of one expert slice: i, i + k, i + 2k, ...) are SetStride {set, k}.
struct GroupRef {
  enum class Kind : uint8_t { World, DeviceSet, AcrossSets, SetBlock, SetStride } kind = GroupRef::Kind::World;
  std::vector<int32_t> sets;  // DeviceSet: {set}; AcrossSets: the sets, same replica index in each; SetBlock and
                              // SetStride: {set, k}
  std::string stream;         // one communicator per group and stream keeps each one's order fixed
  bool operator==(const GroupRef&) const = default;
  auto operator<=>(const GroupRef&) const = default;
  std::string str() const;
};

struct PlanBucket {
  int32_t region = -1;
  uint8_t padding0_[4] = {};  // explicit, so that the plan (which copies these bytes) is the same every run
  int64_t numel = 0;    // parameters in it
  int64_t padded = 0;   // numel (of one slice, when sliced) rounded up to a multiple of the group size
  int32_t zero = -1;    // replication level; -1 not replicated
  int32_t group = -1;   // index into Plan::groups of its data-parallel group; -1 none
  int32_t group_size = 1;
  int32_t param_buf = -1;        // full parameters (persistent, or transient when sharded)
  int32_t grad_buf = -1;         // full gradients
  int32_t param_shard_buf = -1;  // owned shard of parameters (sharded parameters only)
  int32_t grad_shard_buf = -1;   // owned shard of gradients (sharded gradients only)
  int32_t m_buf = -1, v_buf = -1;  // AdamW moments: full, or the owned shard
  bool shard_params = false, shard_grads = false, shard_optimizer = false;
  bool tied_copy = false;
  // Sliced (experts spread over an expert group of `slices` replicas): replica r holds and computes with slice
  // r % slices of the bucket (numel / slices elements: whole experts) alone; the replicas holding the same slice
  // (r / slices is their index) form the bucket's group, and everything above applies to the slice.
  int32_t slices = 1;
  uint8_t padding1_[4] = {};
  int64_t slice_numel() const { return numel / slices; }
};

// Predicted per-kind peak bytes (compiler) for printing next to the runtime's measurement.
struct MemoryEstimate {
  uint64_t peak_by_kind[kBufferKinds] = {0};
  uint64_t steady_by_kind[kBufferKinds] = {0};  // held between steps
  uint64_t peak_total = 0;
};

struct Plan {
  // ---- job-wide (identical in every plan) ----
  std::string job_name;
  std::string job_text;
  std::string backend = "cpu";
  Precision precision = Precision::Fp32;  // job.precision: how the backend's matmuls take their operands
  HeldPieceRule held_pieces;  // how a bf16-held stash's passes go by pieces (model/segment_type.hpp)
  uint64_t seed = 0;
  int64_t steps = 0;
  double watchdog_s = 0;  // job.watchdog_s; 0: no watchdog
  int64_t log_every = 1;
  double peak_tflops = 0;  // job.peak_tflops
  bool skip_nonfinite = false;  // job.on_nonfinite = "skip"
  int64_t max_skipped = 5;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int checkpoint_keep = 0;
  bool checkpoint_async = false;  // checkpoint.async
  std::vector<std::string> allow_changes;  // checkpoint.allow_changes: what --resume accepts with a warning
  std::string model_keys;                  // the model as "kind=gpt vocab=256 ..." (model_keys_text)
  int threads = 0;
  OptimizerConfig optimizer;
  DataConfig data;
  // [eval]: every eval_every steps (0: never) and after the last, eval_batches batches of eval_data (the validation
  // file, read in order from its start)
  int64_t eval_every = 0, eval_batches = 0;
  DataConfig eval_data;
  ModelDims dims;
  std::vector<ParamSpec> params;
  std::vector<Segment> segments;
  int world = 1;
  std::vector<std::vector<int32_t>> sets;  // ranks of each device set
  std::vector<GroupRef> all_groups;        // every group of the job, for communicator creation
  int microbatches = 1;
  int samples_per_replica = 0;
  int data_sharing = 1;  // consecutive replicas [j·k, (j+1)·k) of a set read the same samples (k; 1: each its own)

  // ---- body: shared by the replicas of one device set ----
  int set = -1;
  std::vector<std::string> streams;
  std::vector<PlanBuffer> buffers;
  std::vector<PlanParam> plan_params;
  std::vector<PlanBucket> buckets;
  std::vector<GroupRef> groups;  // groups this body uses
  std::vector<Instr> instrs;
  int32_t workspace_buf = -1;
  int32_t scratch_buf = -1;     // backend scratch of the segments, sized at run time (SegmentType::scratch_floats)
  MemoryEstimate memory;
  double predicted_step = 0;    // cost model: seconds per step (the whole job)
  double predicted_bubble = 0;  // cost model: idle share of this set's compute stream

  // ---- binding: this rank ----
  int rank = 0;
  int replica = 0;  // position of this rank in its device set

  std::vector<int32_t> group_ranks(const GroupRef& g) const;  // for this rank's replica
  int peer_rank(int peer_set) const { return sets[size_t(peer_set)][size_t(replica)]; }
};

// Buffers an instruction reads and writes (sorted, unique): its op's operand roles (op_table.hpp).
void instr_accesses(const Instr& in, std::vector<int32_t>& reads, std::vector<int32_t>& writes);
// Bytes this rank sends for `in` in a group of `group_size` ranks (its op's SendRule).
double instr_send_bytes(const Instr& in, int group_size);
// The forward FLOPs per sample a compute instruction's FLOP count is a multiple of (op_table.hpp): the segment's
// forward, or for a rerun of a stash's tail (selective recompute) the part of it that rerun redoes; of a segment
// split over a tensor-parallel group, this rank's part.
double instr_forward_flops(const Plan& p, const Instr& in);

// Serialization: body and job-wide part together; the binding separately so bodies are shared.
std::vector<uint8_t> serialize_plan(const Plan& plan);
// Reads a plan and checks it (check_plan); truncated, corrupt or inconsistent bytes are a SystemError.
Plan deserialize_plan(const uint8_t* data, size_t size);
// Throws SystemError naming the first thing of the plan out of range: an index (buffer, instruction,
// group, stream, set, parameter, bucket, segment), a negative or inconsistent count, a buffer too small for
// what reads or writes it, or a model that its own dimensions do not build.
void check_plan(const Plan& plan);
// "F blocks.3.attn mb2", "SEND act4.mb2 -> rank 1", ...: one instruction for people.
std::string instr_label(const Plan& p, const Instr& in);
// Human-readable dump.
std::string plan_to_text(const Plan& plan);

}  // namespace piper
