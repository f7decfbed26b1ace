// shard: expert parallelism. The matched regions' segments spread their parameters (experts) over each
// expert group of `group` consecutive ranks of the region's device set (the whole set by default); the groups
// hold copies of the experts, data-parallel over the copies. Every activation edge into or out of such a
// region, forward and backward, gets an ALL_TO_ALL node that exchanges the routed rows (counts first) inside
// the expert group, on the shard stream.
#include <algorithm>
#include <map>
#include <tuple>

#include "ir/build.hpp"
#include "model/segment_type.hpp"
#include "passes/passes.hpp"
#include "util/error.hpp"

namespace piper {

void mark_shard(Graph& g, const Directive& d) {
  for (const auto& [tag, m] : d.filter.match)
    if (tag == "MB" || tag == "PASS")
      throw UserError(cat(d.describe(), ": shard works on whole regions; its filter cannot name ", tag));
  int matched = 0;
  for (auto& r : g.regions) {
    if (!filter_matches_region(d.filter, r)) continue;
    ++matched;
    if (r.shard_directive >= 0)
      throw UserError(cat(d.describe(), ": ", r.label(), " is already sharded by directive #", r.shard_directive));
    const int ranks = int(g.sets[size_t(r.device_set)].ranks.size());
    const int group = d.group > 0 ? std::min(d.group, ranks) : ranks;  // one rank: one group of one
    if (d.group > 0 && ranks > 1 && (d.group > ranks || ranks % d.group != 0))
      throw UserError(cat(d.describe(), ": group = ", d.group, " ranks per expert group does not divide the ", ranks,
                          " ranks of ", r.label(), "'s device set; use a divisor of ", ranks));
    for (int s = r.seg_begin; s < r.seg_end; ++s) {
      const Segment& seg = g.model->segments[size_t(s)];
      if (!seg.type->shard_units)
        throw UserError(cat(d.describe(), ": ", r.label(), " holds segment '", seg.name,
                            "', which cannot be sharded; annotate the expert segments alone (e.g. segments = [[\"",
                            seg.name, "\", ...]])"));
      const int units = seg.type->shard_units(g.model->dims);
      if (units % group != 0)
        throw UserError(cat(d.describe(), ": segment '", seg.name, "' has ", units, " experts, which do not divide among the ",
                            group, " ranks of ", group == ranks ? "its device set" : "an expert group"));
      g.segment_shards[size_t(s)] = group;
    }
    r.shard_directive = d.index;
    r.shard_group = group;
    r.shard_stream = d.stream;
  }
  if (matched == 0) throw UserError(cat(d.describe(), ": filter ", d.filter.str(), " matches no region"));
}

void insert_exchanges(Graph& g) {
  // One exchange per (producer, tensor): several consumers (a split backward's BI and BW) share it.
  std::map<std::tuple<int, int, int, int>, int> exchanged;
  const size_t e_before = g.edges.size();
  for (size_t ei = 0; ei < e_before; ++ei) {
    Edge e = g.edges[ei];
    if (e.removed || e.kind != EdgeKind::Data) continue;
    if (e.tensor.kind != TensorRef::Kind::Act && e.tensor.kind != TensorRef::Kind::ActGrad) continue;
    const Node& from = g.nodes[size_t(e.from)];
    const Node& to = g.nodes[size_t(e.to)];
    if (from.region < 0 || to.region < 0 || from.region == to.region) continue;
    // the sharded side of the edge
    const Region& a = g.regions[size_t(from.region)];
    const Region& b = g.regions[size_t(to.region)];
    const Region* sharded = a.shard_directive >= 0 ? &a : (b.shard_directive >= 0 ? &b : nullptr);
    if (!sharded || sharded->shard_group < 2) continue;
    if (a.device_set != b.device_set)
      throw UserError(cat(sharded->label(), " is sharded, and its neighbour ", (sharded == &a ? b : a).label(),
                          " must sit on the same device set (the exchange is inside the set)"));
    g.edges[ei].removed = true;
    auto key = std::make_tuple(e.from, int(e.tensor.kind), e.tensor.index, e.tensor.mb);
    if (auto it = exchanged.find(key); it != exchanged.end()) {
      g.add_edge(it->second, e.to, EdgeKind::Data, e.tensor);
      continue;
    }
    Node x;
    x.kind = NodeKind::ALL_TO_ALL;
    x.tags = sharded->tags;
    x.region = sharded->id;
    x.mb = from.mb;
    x.device_set = sharded->device_set;
    x.stream = sharded->shard_stream;
    x.tensor = e.tensor;
    x.source_directive = sharded->shard_directive;
    int id = g.add_node(x);
    g.add_edge(e.from, id, EdgeKind::Data, e.tensor);
    g.add_edge(id, e.to, EdgeKind::Data, e.tensor);
    exchanged[key] = id;
  }
}

}  // namespace piper
