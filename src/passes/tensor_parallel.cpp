// tp: tensor parallelism. The matched regions' device sets run in tensor-parallel groups of `group` consecutive
// ranks that work on the same samples; a segment whose type can be split (SegmentType::tp_split) runs its part on
// each rank of the group, and every activation it outputs forward, and every input gradient it outputs backward,
// is partial: an ALL_REDUCE node on the group's stream sums it before anything reads it (or, for an output made of
// the ranks' parts, an ALL_GATHER node joins them). With sequence parallelism the activations between split
// segments are held in parts: a REDUCE_SCATTER after the writer, an ALL_GATHER before each reader.
#include <map>
#include <tuple>

#include "model/segment_type.hpp"
#include "passes/passes.hpp"
#include "util/error.hpp"

namespace piper {

void mark_tensor_parallel(Graph& g, const Directive& d) {
  for (const auto& [tag, m] : d.filter.match)
    if (tag == "MB" || tag == "PASS")
      throw UserError(cat(d.describe(), ": tp works on whole regions; its filter cannot name ", tag));
  int matched = 0;
  for (auto& r : g.regions) {
    if (!filter_matches_region(d.filter, r)) continue;
    ++matched;
    if (r.tp_directive >= 0)
      throw UserError(cat(d.describe(), ": ", r.label(), " is already tensor-parallel by directive #", r.tp_directive));
    if (r.shard_directive >= 0)
      throw UserError(cat(d.describe(), ": ", r.label(), " is sharded (experts) by directive #", r.shard_directive,
                          "; leave the expert regions out of the tp filter"));
    DeviceSet& set = g.sets[size_t(r.device_set)];
    const int ranks = int(set.ranks.size());
    if (ranks % d.group != 0)
      throw UserError(cat(d.describe(), ": group = ", d.group, " ranks per tensor-parallel group does not divide the ",
                          ranks, " ranks of ", r.label(), "'s device set; use a divisor of ", ranks));
    if (set.tp != 1 && set.tp != d.group)
      throw UserError(cat(d.describe(), ": ", r.label(), "'s device set already runs tensor-parallel groups of ", set.tp,
                          " ranks; one set has one group size"));
    set.tp = d.group;
    for (int s = r.seg_begin; s < r.seg_end; ++s) {
      const Segment& seg = g.model->segments[size_t(s)];
      if (!seg.type->tp_split) continue;  // runs alike on every rank of the group
      if (r.seg_end - r.seg_begin > 1)
        throw UserError(cat(d.describe(), ": ", r.label(), " holds ", r.seg_end - r.seg_begin, " segments; a tensor-parallel "
                            "region holds one, so that its partial output is summed before the next segment reads it "
                            "(annotate with pattern = \"model.layers.*\", or use [mesh] tp)"));
      const std::string why = seg.type->tp_refusal ? seg.type->tp_refusal(g.model->dims, d.group) : std::string();
      if (!why.empty()) throw UserError(cat(d.describe(), ": segment '", seg.name, "' cannot be split over ", d.group,
                                            " ranks: ", why));
      g.segment_shards[size_t(s)] = d.group;
    }
    r.tp_directive = d.index;
    r.tp_stream = d.stream;
    r.tp_sequence = d.sequence;
  }
  if (matched == 0) throw UserError(cat(d.describe(), ": filter ", d.filter.str(), " matches no region"));
}

void check_tensor_parallel_sets(const Graph& g) {
  for (const auto& s : g.sets)
    if (s.tp != g.sets[0].tp)
      throw UserError(cat("tensor parallelism covers some device sets and not others (groups of ", g.sets[0].tp, " and ",
                          s.tp, " ranks); every set works on the same samples per replica, so give every region one tp"));
  // a router run alike by every rank of a group would send each token to the experts once per rank
  for (const auto& r : g.regions)
    for (int s = r.seg_begin; s < r.seg_end; ++s) {
      const Segment& seg = g.model->segments[size_t(s)];
      if (g.sets[size_t(r.device_set)].tp > 1 && seg.type->tp_splits_samples && g.segment_shards[size_t(s)] == 1)
        throw UserError(cat(r.label(), " holds '", seg.name, "' on a device set of tensor-parallel groups, but no tp "
                            "directive covers it; cover it (filter = {} covers every region)"));
    }
}

void check_tensor_parallel_samples(const Graph& g) {
  const int64_t rows = int64_t(g.samples_per_microbatch) * g.model->dims.rows_per_sample;
  for (size_t s = 0; s < g.model->segments.size(); ++s) {
    const Segment& seg = g.model->segments[s];
    const int k = g.segment_shards[s];
    if (k > 1 && seg.type->tp_splits_samples && g.samples_per_microbatch % k != 0)
      throw UserError(cat("segment '", seg.name, "' splits the ", g.samples_per_microbatch,
                          " sequences of a microbatch among a tensor-parallel group of ", k,
                          " ranks; make the sequences per microbatch a multiple of ", k));
    if (g.in_parts(int(s)) && rows % k != 0)
      throw UserError(cat("sequence parallelism splits the ", rows, " tokens of a microbatch at segment '", seg.name,
                          "' among a tensor-parallel group of ", k, " ranks; make them a multiple of ", k));
  }
}

void reduce_tensor_parallel_regions(Graph& g) {
  for (auto& r : g.regions) {
    const DeviceSet& set = g.sets[size_t(r.device_set)];
    // parameters every rank of a group holds have partial gradients: summed over the group even without replicas
    if (set.tp > 1 && r.zero < 0 && int(set.ranks.size()) == set.tp) {
      r.zero = 0;
      r.dp_stream = r.tp_directive >= 0 ? r.tp_stream : "tp";
    }
  }
}

namespace {

// Whether segment `s` outputs partial tensors (a split segment of a tensor-parallel group).
bool splits(const Graph& g, int s) {
  return s >= 0 && size_t(s) < g.segment_shards.size() && g.segment_shards[size_t(s)] > 1 &&
         g.model->segments[size_t(s)].type->tp_split != nullptr;
}

// A collective of region r's tensor-parallel group on its stream, carrying `tensor` (of microbatch mb).
Node group_collective(const Region& r, NodeKind kind, const TensorRef& tensor, int mb) {
  Node x;
  x.kind = kind;
  x.purpose = CommPurpose::Activation;
  x.tags = r.tags;
  if (mb >= 0) x.tags["MB"] = mb;
  x.region = r.id;
  x.mb = mb;
  x.device_set = r.device_set;
  x.stream = r.tp_stream;
  x.tensor = tensor;
  x.source_directive = r.tp_directive;
  return x;
}

// Puts node x on edge e (a copy of the removed edge): e.from → x → e.to.
int insert_on_edge(Graph& g, const Node& x, const Edge& e) {
  const int id = g.add_node(x);
  g.add_edge(e.from, id, EdgeKind::Data, e.tensor);
  g.add_edge(id, e.to, EdgeKind::Data, e.tensor);
  return id;
}

const Region& region_of(const Graph& g, int s) {
  for (const auto& r : g.regions)
    if (s >= r.seg_begin && s < r.seg_end) return r;
  PIPER_CHECK(false, "segment ", s, " is in no region");
  return g.regions[0];
}

// Sequence parallelism: segment `s` is split over its group, in a region that asks for it, and works on whole rows
// (not on a share of the samples).
bool in_sequence_parallel(const Graph& g, int s) {
  return splits(g, s) && region_of(g, s).tp_sequence && !g.model->segments[size_t(s)].type->tp_splits_samples;
}

}  // namespace

void mark_sequence_parts(Graph& g) {
  const int S = int(g.model->segments.size());
  g.boundary_in_parts.assign(size_t(S), 0);
  for (int b = 1; b < S; ++b) {  // a partial output, summed in parts, read by a segment that gathers its input
    const SegmentType& producer = *g.model->segments[size_t(b) - 1].type;
    const SegmentType& consumer = *g.model->segments[size_t(b)].type;
    g.boundary_in_parts[size_t(b)] = in_sequence_parallel(g, b - 1) && in_sequence_parallel(g, b) &&
                                     producer.tp_output == SegmentType::TpOutput::Partial && consumer.reads_input;
  }
}

void insert_tensor_parallel_sums(Graph& g) {
  std::map<std::tuple<int, int, int, int>, int> summed;  // (producer, tensor) → its all-reduce
  const size_t e_before = g.edges.size();
  for (size_t ei = 0; ei < e_before; ++ei) {
    Edge e = g.edges[ei];
    if (e.removed || e.kind != EdgeKind::Data) continue;
    const bool forward = e.tensor.kind == TensorRef::Kind::Act;
    if (!forward && e.tensor.kind != TensorRef::Kind::ActGrad) continue;
    const Node& from = g.nodes[size_t(e.from)];
    if (!is_compute(from.kind) || from.region < 0) continue;
    const Region& r = g.regions[size_t(from.region)];
    // the segment that wrote the tensor: the region's last going forward, its first going backward
    const int writer = forward ? r.seg_end - 1 : r.seg_begin;
    if (!splits(g, writer)) continue;
    const SegmentType& type = *g.model->segments[size_t(writer)].type;
    if (!forward && !type.tp_input_grad_partial) continue;
    if (forward && type.tp_output == SegmentType::TpOutput::Own) continue;
    const bool gathered = forward && type.tp_output == SegmentType::TpOutput::Gathered;
    g.edges[ei].removed = true;
    auto key = std::make_tuple(e.from, int(e.tensor.kind), e.tensor.index, e.tensor.mb);
    if (auto it = summed.find(key); it != summed.end()) {
      g.add_edge(it->second, e.to, EdgeKind::Data, e.tensor);
      continue;
    }
    const NodeKind kind = gathered                     ? NodeKind::ALL_GATHER
                          : g.in_parts(e.tensor.index) ? NodeKind::REDUCE_SCATTER
                                                       : NodeKind::ALL_REDUCE;
    summed[key] = insert_on_edge(g, group_collective(r, kind, e.tensor, from.mb), e);
  }
}

// Where a boundary is held in parts, its readers gather it first: the forward its activation, the backward its
// gradient; and the backward (and a rerun before it) gathers the activation again rather than keep it whole from
// the forward — that gather is issued just before the backward (Node::gather_for), not when its input is ready.
void insert_sequence_gathers(Graph& g) {
  std::map<std::tuple<int, int, int, int>, int> gathered;  // (source, tensor) → its all-gather
  std::map<std::tuple<int, int, int>, int> shard_source;   // (set, boundary, mb) → the node delivering the part
  const size_t e_before = g.edges.size();
  for (size_t ei = 0; ei < e_before; ++ei) {
    Edge e = g.edges[ei];
    if (e.removed || e.kind != EdgeKind::Data) continue;
    const bool forward = e.tensor.kind == TensorRef::Kind::Act;
    if (!forward && e.tensor.kind != TensorRef::Kind::ActGrad) continue;
    const int b = e.tensor.index;
    if (!g.in_parts(b)) continue;
    const Node& to = g.nodes[size_t(e.to)];
    if (!is_compute(to.kind) || to.region < 0) continue;  // a SEND carries the part itself
    const Region& r = g.regions[size_t(to.region)];
    g.edges[ei].removed = true;
    if (forward) shard_source[{r.device_set, b, e.tensor.mb}] = e.from;
    auto key = std::make_tuple(e.from, int(e.tensor.kind), b, e.tensor.mb);
    if (auto it = gathered.find(key); it != gathered.end()) {
      g.add_edge(it->second, e.to, EdgeKind::Data, e.tensor);
      continue;
    }
    gathered[key] = insert_on_edge(g, group_collective(r, NodeKind::ALL_GATHER, e.tensor, to.mb), e);
  }
  // the backward's gather of its input: one per backward (B, or BI and BW) of a segment reading a boundary in parts
  std::map<std::pair<int, int>, std::vector<int>> backwards;  // (region, mb) → its backward nodes
  for (const auto& n : g.nodes)
    if (!n.removed && (n.kind == NodeKind::B || n.kind == NodeKind::BI || n.kind == NodeKind::BW) && n.region >= 0)
      backwards[{n.region, n.mb}].push_back(n.id);
  for (const auto& [key, nodes] : backwards) {
    const Region& r = g.regions[size_t(key.first)];
    const int b = r.seg_begin;
    if (!g.in_parts(b)) continue;
    auto source = shard_source.find({r.device_set, b, key.second});
    PIPER_CHECK(source != shard_source.end(), "no part of boundary ", b, " reaches ", r.label());
    int first = nodes[0];
    for (int id : nodes)
      if (g.nodes[size_t(id)].kind != NodeKind::BW) first = id;
    Node x = group_collective(r, NodeKind::ALL_GATHER, {TensorRef::Kind::Act, b, key.second}, key.second);
    x.tags = g.nodes[size_t(first)].tags;
    x.gather_for = first;
    const int id = g.add_node(x);
    g.add_edge(source->second, id, EdgeKind::Data, x.tensor);
    for (int n : nodes) g.add_edge(id, n, EdgeKind::Data, x.tensor);
  }
}

}  // namespace piper
