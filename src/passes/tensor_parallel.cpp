// tp: tensor parallelism. The matched regions' device sets run in tensor-parallel groups of `group` consecutive
// ranks that work on the same samples; a segment whose type can be split (SegmentType::tp_split) runs its part on
// each rank of the group, and every activation it outputs forward, and every input gradient it outputs backward,
// is partial: an ALL_REDUCE node on the group's stream sums it before anything reads it.
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
  }
  if (matched == 0) throw UserError(cat(d.describe(), ": filter ", d.filter.str(), " matches no region"));
}

void check_tensor_parallel_sets(const Graph& g) {
  for (const auto& s : g.sets)
    if (s.tp != g.sets[0].tp)
      throw UserError(cat("tensor parallelism covers some device sets and not others (groups of ", g.sets[0].tp, " and ",
                          s.tp, " ranks); every set works on the same samples per replica, so give every region one tp"));
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

}  // namespace

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
    if (!splits(g, forward ? r.seg_end - 1 : r.seg_begin)) continue;
    g.edges[ei].removed = true;
    auto key = std::make_tuple(e.from, int(e.tensor.kind), e.tensor.index, e.tensor.mb);
    if (auto it = summed.find(key); it != summed.end()) {
      g.add_edge(it->second, e.to, EdgeKind::Data, e.tensor);
      continue;
    }
    Node x;
    x.kind = NodeKind::ALL_REDUCE;
    x.purpose = CommPurpose::Activation;
    x.tags = r.tags;
    if (from.mb >= 0) x.tags["MB"] = from.mb;
    x.region = r.id;
    x.mb = from.mb;
    x.device_set = r.device_set;
    x.stream = r.tp_stream;
    x.tensor = e.tensor;
    x.source_directive = r.tp_directive;
    const int id = g.add_node(x);
    g.add_edge(e.from, id, EdgeKind::Data, e.tensor);
    g.add_edge(id, e.to, EdgeKind::Data, e.tensor);
    summed[key] = id;
  }
}

}  // namespace piper
