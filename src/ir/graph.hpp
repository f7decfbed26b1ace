// The global training DAG (DESIGN.md §3): regions of the model, the compute, update and communication
// nodes of one training step, and the data/order edges between them. Passes rewrite it; lowering reads it.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "config/job.hpp"
#include "model/model.hpp"

namespace piper {

enum class NodeKind : uint8_t {
  F, B, BI, BW,   // compute per region × microbatch
  UPDATE,         // optimizer step of a region's parameters (or its shard)
  SEND, RECV,     // point-to-point between device sets
  ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER,
  ALL_TO_ALL,     // rows exchanged inside a device set, counts first (a sharded region's inputs and outputs)
  R,              // recompute: a region's recomputed segments run their forward again, just before its backward
};
const char* node_kind_name(NodeKind k);
bool is_compute(NodeKind k);
bool is_comm(NodeKind k);

// What a collective is for; the lowering and the runtime treat them alike, printing tells them apart.
enum class CommPurpose : uint8_t { Activation, Gradient, TiedGradient, ParamGather, StepSync };
const char* comm_purpose_name(CommPurpose p);

// A logical tensor carried by a data edge.
struct TensorRef {
  enum class Kind : uint8_t { None, Act, ActGrad, Stash, Grads, Params, Scalars } kind = Kind::None;
  int index = -1;  // Act/ActGrad: segment boundary (input index of the consuming segment); Grads/Params: bucket
  int mb = -1;
  std::string str() const;
  bool operator==(const TensorRef&) const = default;
};

using Tags = std::map<std::string, int>;

constexpr uint8_t kRecomputeFull = 1, kRecomputeSelective = 2;  // Graph::segment_recompute

struct Node {
  int id = -1;
  NodeKind kind = NodeKind::F;
  Tags tags;             // annotation tags of its region, MB when split
  int region = -1;       // compute/update/gradient collectives: region
  int mb = -1;           // microbatch (compute and activation transfers)
  int device_set = -1;   // where it runs; collectives: the set whose group runs it (-1: all ranks)
  std::string stream = "compute";
  CommPurpose purpose = CommPurpose::Activation;
  int peer_set = -1;     // SEND/RECV: the other side
  int pair = -1;         // SEND/RECV: the matching node
  int bucket = -1;       // gradient/parameter collectives and updates
  std::vector<int> tie_sets;     // TiedGradient: the device sets holding copies
  std::vector<int> tie_buckets;  // TiedGradient: the bucket on each of those sets
  int gather_for = -1;   // a parameter gather issued just before this compute node uses the bucket
  TensorRef tensor;      // what a SEND/RECV/collective carries
  int source_directive = -1;  // the directive that created it, for messages
  bool removed = false;
  std::string label() const;  // "F[PP=1,MB=3]"
};

enum class EdgeKind : uint8_t { Data, Order };

struct Edge {
  int from = -1, to = -1;
  EdgeKind kind = EdgeKind::Data;
  TensorRef tensor;
  int source_directive = -1;  // order edges: the directive that added them
  bool removed = false;
};

// A contiguous run of segments with the same annotation stack: the unit placed and scheduled.
struct Region {
  int id = -1;
  int seg_begin = 0, seg_end = 0;  // segments [begin, end)
  Tags tags;
  int device_set = -1;
  int place_directive = -1;
  // replication (set by the replicate pass; zero = -1 means not replicated)
  int zero = -1;
  double bucket_mb = 25.0;
  int grad_buckets_in_flight = 2;  // zero >= 2: full-gradient buffers alive at once on a rank
  std::string dp_stream = "dp";
  int replicate_directive = -1;
  // sharding (the shard pass): its segments' parameters are spread over each expert group of shard_group
  // consecutive ranks of the set; the groups hold copies, data-parallel like a replicated region
  int shard_directive = -1;
  int shard_group = 0;
  std::string shard_stream = "ep";
  // tensor parallelism (the tp pass): its segments that can be split run over each tensor-parallel group of the
  // set (DeviceSet::tp consecutive ranks), the others on every rank of the group alike
  int tp_directive = -1;
  std::string tp_stream = "tp";
  bool tp_sequence = false;  // sequence parallelism: activations between its split segments held in parts
  bool split_backward = false;
  std::string label() const;
};

struct DeviceSet {
  std::vector<int> ranks;
  int directive = -1;  // the place directive that made it
  std::string origin;  // that directive, described for messages
  // ranks per tensor-parallel group (the tp pass): the consecutive ranks [j·tp, (j+1)·tp) of the set work on the
  // same samples; the set holds ranks / tp data-parallel replicas
  int tp = 1;
};

// Parameters reduced/gathered/updated together; buckets never span regions.
struct Bucket {
  int region = -1;
  std::vector<int> params;  // model parameter indices
  int64_t numel = 0;        // sum of parameter sizes (before padding)
  bool tied_copy = false;   // a copy of a parameter whose home is another device set's region
  // Ranks that hold one part each (1: every rank holds all of it): the expert groups of a sharded region (whole
  // experts each), or a tensor-parallel group (`tp_pieces`: every parameter cut into pieces, ParamSplit)
  int slices = 1;
  bool tp_pieces = false;
};

struct Graph {
  const Model* model = nullptr;
  int world = 1;
  bool bf16 = false;  // job.precision = "bf16": ZeRO-3 keeps bf16 matmul operands in buckets of their own
  int microbatches = 1;
  int samples_per_microbatch = 0;  // per replica
  int global_batch = 0;
  std::vector<Region> regions;
  std::vector<DeviceSet> sets;
  std::vector<Bucket> buckets;
  std::vector<Node> nodes;
  std::vector<Edge> edges;
  std::vector<int> segment_shards;  // per model segment: ranks its parameters are spread over (1: not sharded)
  // per segment boundary (input index of the consuming segment; the tp pass): 1 where sequence parallelism holds
  // the activation and its gradient in parts, rows [t·n/k, (t+1)·n/k) on rank t of a tensor-parallel group
  std::vector<uint8_t> boundary_in_parts;
  bool in_parts(int boundary) const {
    return boundary >= 0 && size_t(boundary) < boundary_in_parts.size() && boundary_in_parts[size_t(boundary)];
  }
  // per model segment (the recompute pass): 0, kRecomputeFull (its forward keeps only its input and runs again
  // before its backward) or kRecomputeSelective (it keeps the kept part of its stash and recomputes the rest)
  std::vector<uint8_t> segment_recompute;

  int add_node(Node n);
  int add_edge(int from, int to, EdgeKind kind, TensorRef t = {}, int directive = -1);
  // Live out/in edge indices per node (rebuilt on demand after rewrites).
  std::vector<std::vector<int>> out_edges() const;
  std::vector<std::vector<int>> in_edges() const;
  // Throws with the nodes of a cycle if the live graph is not a DAG.
  void check_acyclic(const std::string& context) const;
  // Nodes in a topological order (stable: ties by id).
  std::vector<int> topo_order() const;
  size_t live_nodes() const;
};

// Does this filter match the node? PASS is derived from the node kind (F, B, BI, BW, UPDATE).
bool filter_matches(const Filter& f, const Node& n);
// Does this filter match the region (only annotation tags; MB and PASS must be absent)?
bool filter_matches_region(const Filter& f, const Region& r);
const char* pass_name(NodeKind k);

}  // namespace piper
