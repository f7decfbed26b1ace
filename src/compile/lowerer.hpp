// The lowering of one device set's node sequence into its plan (lower.cpp drives it): its state, what it looks up
// in the whole graph, and its parts — buffers (lower_buffers.cpp) and instructions (lower_instructions.cpp).
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "compile/compile.hpp"
#include "model/segment_type.hpp"
#include "passes/passes.hpp"
#include "plan/owned_slices.hpp"

namespace piper::lowering {

// What every set's lowering looks up in the whole graph, built once: the edges into and out of each node,
// and per device set its all-to-all exchanges and its prefetched parameter gathers. (Scanning the graph
// once per set made lowering grow with stages × nodes.)
struct GraphIndex {
  std::vector<std::vector<int>> in, out;
  std::vector<std::vector<int>> exchanges, gathers;  // [device set] -> node ids

  explicit GraphIndex(const Graph& g) : in(g.in_edges()), out(g.out_edges()), exchanges(g.sets.size()),
                                        gathers(g.sets.size()) {
    for (const auto& n : g.nodes) {
      if (n.removed || n.device_set < 0 || size_t(n.device_set) >= g.sets.size()) continue;
      if (n.kind == NodeKind::ALL_TO_ALL) exchanges[size_t(n.device_set)].push_back(n.id);
      if (n.gather_for >= 0) gathers[size_t(n.device_set)].push_back(n.id);
    }
  }
};

class Lowerer {
 public:
  Lowerer(const Graph& g, const GraphIndex& index, const std::vector<Segment>& segs, const JobSpec& spec, int set)
      : g_(g), index_(index), m_(*g.model), segs_(segs), spec_(spec), set_(set) {
    n_ = int(g.sets[size_t(set)].ranks.size());
    b_ = g.samples_per_microbatch;
    for (int id : index.exchanges[size_t(set)]) {  // boundaries whose activations (or gradients) are exchanged here
      const Node& n = g.nodes[size_t(id)];
      exchanged_.insert({int(n.tensor.kind), n.tensor.index});
    }
  }

  Plan run(const std::vector<int>& sequence);

 private:
  struct SegOp {
    int node;
    int segment;
  };
  bool issued_with(const SegOp& op, int id) const;
  const Graph& g_;
  const GraphIndex& index_;
  const Model& m_;
  const std::vector<Segment>& segs_;          // the model's segments, with their shard counts
  std::set<std::pair<int, int>> exchanged_;   // (tensor kind, boundary) exchanged by an all-to-all
  const JobSpec& spec_;
  int set_;
  int n_;  // replicas in this set
  int b_;  // samples per microbatch
  Plan p_;
  std::map<std::string, int> streams_;
  std::map<std::tuple<char, int, int>, int> keyed_;
  std::map<int, int> bucket_index_;     // graph bucket → plan bucket
  std::vector<SegOp> ops_;
  std::map<std::pair<int, int>, int> gather_node_;  // (compute node, graph bucket) → gather node
  std::map<int, int> gathers_of_;                   // R node → the backward node whose gathers it uses
  // compute node → a gather of a boundary held in parts that it reads, issued just before it: the backward's input
  // again, or a received part
  std::multimap<int, int> regather_;
  std::set<int> regathered_;                        // those issued
  std::map<int, int> rerun_of_;                     // backward node → its R node (whose ops sit among its own)
  struct Gathered {
    int buf;       // instance holding the bucket's full parameters
    size_t last;   // last segment op using it so far
  };
  std::map<int, Gathered> gathered_;                      // graph bucket → its current instance
  std::map<std::pair<size_t, int>, int> instance_for_op_;  // (segment op, graph bucket) → instance
  int gather_target_ = -1;                                // instance the next emitted gather fills
  std::set<std::pair<int, int>> grad_written_;      // (gradient buffer, model param)
  std::set<int> shard_written_;                     // gradient shard buffers written this step
  std::map<std::pair<int, int>, std::vector<int>> early_;  // (compute node, segment) → reductions issued after it
  std::set<int> hoisted_;                                  // reductions issued early
  int32_t last_compute_ = -1;                              // index of the last compute instruction
  std::map<size_t, std::vector<int>> receives_for_;        // consumer's compute position → receives
  std::map<int, int32_t> last_reduce_scatter_;             // graph bucket → its latest reduce-scatter
  // Full-gradient buffers of one microbatch (ZeRO 2 and 3) come and go: allocated by the first backward
  // that writes them, freed when their reduce-scatter completes. `grad_buffers_alive_` counts those
  // allocated and not yet known to be freed; `unwaited_reduce_scatters_` holds, oldest first, the posted
  // reduce-scatters of such buffers that no instruction has waited for yet.
  std::set<int> grad_buffers_started_;
  int grad_buffers_alive_ = 0;
  std::deque<int32_t> unwaited_reduce_scatters_;
  int stream_id(const std::string& name);
  int group_id(const GroupRef& ref);
  int new_buffer(uint64_t bytes, BufferKind kind, bool persistent, std::string name);
  int keyed_buffer(char tag, int a, int b, uint64_t bytes, BufferKind kind, const std::string& name);

  // ---------------------------------------------------------------- buckets and parameters
  // Ranks of an expert group over which a sharded region's buckets are sliced (1: not sliced).
  int slices_of(const Region& r) const { return r.shard_directive >= 0 ? r.shard_group : 1; }
  bool replicated(const Bucket& b) const;
  ParamSplit split_of(int param, const Region& r) const;
  GroupRef replica_group(const PlanBucket& pb, const std::string& stream) const;
  void make_buckets();
  int graph_bucket_of_param(int param) const;
  const PlanBucket& plan_bucket(int gb) const;
  int64_t shard_count(const PlanBucket& pb) const { return shard_elements(pb); }

  void wait_for_reduce_scatter(Instr& in, int32_t rs);
  void limit_grad_buffers(Instr& in, int gb, int gbuf);
  int grad_target(int gb, int mb);
  int param_source(int gb, size_t op_index);

  // ---------------------------------------------------------------- activations
  bool on_this_set(int segment) const;
  int64_t full_elems(int boundary) const;
  // Sequence parallelism holds a boundary in parts: a rank of a tensor-parallel group holds its rows.
  bool in_parts(int boundary) const { return g_.in_parts(boundary); }
  int64_t act_elems(int boundary) const;
  int whole_buf(char tag, int boundary, int mb);
  int act_buf(int boundary, int mb);
  bool exchanged(TensorRef::Kind kind, int boundary) const { return exchanged_.count({int(kind), boundary}) > 0; }
  int exchanged_buf(char tag, int boundary, int mb);
  int act_grad_buf(int boundary, int mb);
  bool stash_in_bf16(int seg) const;
  bool input_in_stash(int seg) const;
  HeldStash held(int seg) const;
  HeldPieceRule held_piece_rule() const;
  int stash_buf(int seg, int mb);
  bool recomputed(int seg) const { return g_.segment_recompute[size_t(seg)] != 0; }
  bool selective(int seg) const { return g_.segment_recompute[size_t(seg)] == kRecomputeSelective; }
  int forward_only_stash(int seg, int mb);
  int stash_tail_buf(int seg, int mb);
  int rerun_output(int seg, int mb);
  int wstash_buf(int seg, int mb);
  void make_workspace();

  // ---------------------------------------------------------------- compute
  bool reads_data(const Segment& s) const { return !s.type->reads_input; }
  bool is_head(const Segment& s) const { return s.type->computes_loss; }

  void plan_segment_ops(const std::vector<int>& sequence);
  void plan_early_reductions(const std::vector<int>& sequence);
  void plan_receives(const std::vector<int>& sequence);
  void issue_receives(size_t compute_index);
  void issue_gathers(size_t op_index);
  void issue_regather(size_t op_index);
  bool segment_uses(const SegOp& op, int gb) const;
  static Op compute_op(NodeKind kind);
  void emit_compute(size_t op_index);
  void emit_read_counts(const Node& n, int segment, int mb);

  // ---------------------------------------------------------------- everything else
  static Op comm_op(const Node& n);
  void emit_node(const Node& n, int32_t after = -1);
  void emit_all_reduce(const Node& n, CollectiveArgs& in);
  void wire_in_bf16(const Node& n, CollectiveArgs& in, uint64_t values);
  void emit_reduce_scatter(const Node& n, CollectiveArgs& in);
  void emit_all_to_all(const Node& n, AllToAllArgs& in);
  void emit_all_gather(const Node& n, CollectiveArgs& in);
  Span owned_grads(const PlanBucket& pb) const;
  void emit_tie(const Node& n, Instr& instr);
  void emit_step_sync(Instr& instr);
  void emit_updates(const Node& n);
};

}  // namespace piper::lowering
