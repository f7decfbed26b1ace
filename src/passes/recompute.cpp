// recompute: activation recompute as a graph rewrite. The matched regions' segments (of the named `types`, every
// `every`-th eligible one) keep only their input after the forward (policy full), or only the part of their stash
// that is expensive to make (selective: SegmentSizes::stash_kept_bytes); an R node per backward node (B, or BI
// under split backward) reruns the forward, or the cheap rest, just before it, and the backward halves read what
// it stashed.
#include <algorithm>

#include "model/segment_type.hpp"
#include "passes/passes.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

// Segments that keep their stash whatever the directive says: those that share it with another (a block's
// halves around an exchange, SegmentType::link_offset: rerunning one half would rewrite state the other half
// reads), and the loss segment, whose backward follows its forward at once.
std::vector<char> kept_segments(const Model& m) {
  std::vector<char> kept(m.segments.size(), 0);
  for (size_t s = 0; s < m.segments.size(); ++s) {
    if (m.segments[s].type->computes_loss) kept[s] = 1;
    const int offset = m.segments[s].type->link_offset;
    if (offset == 0) continue;
    kept[s] = 1;
    const int64_t partner = int64_t(s) + offset;
    if (partner >= 0 && size_t(partner) < kept.size()) kept[size_t(partner)] = 1;
  }
  return kept;
}

// The segment types of the model, each once, in model order.
std::vector<std::string> segment_types(const Model& m) {
  std::vector<std::string> types;
  for (const Segment& seg : m.segments)
    if (std::find(types.begin(), types.end(), seg.type->name) == types.end()) types.push_back(seg.type->name);
  return types;
}

}  // namespace

void apply_recompute(Graph& g, const std::vector<Directive>& recomputes) {
  g.segment_recompute.assign(g.model->segments.size(), 0);
  if (recomputes.empty()) return;
  const std::vector<char> kept = kept_segments(*g.model);
  const std::vector<std::string> model_types = segment_types(*g.model);
  for (const Directive& d : recomputes) {
    for (const auto& [tag, m] : d.filter.match)
      if (tag == "MB" || tag == "PASS")
        throw UserError(cat(d.describe(), ": recompute works on whole regions; its filter cannot name ", tag));
    const bool selective = d.policy == "selective";
    for (const std::string& t : d.types)
      if (std::find(model_types.begin(), model_types.end(), t) == model_types.end()) {
        std::string known;
        for (const std::string& m : model_types) known += cat(known.empty() ? "" : ", ", "\"", m, "\"");
        throw UserError(cat(d.describe(), ": types: no segment of this model is of type \"", t, "\" (its types: ", known,
                            ")"));
      }
    auto typed = [&](const SegmentType& type) {
      return d.types.empty() || std::find(d.types.begin(), d.types.end(), type.name) != d.types.end();
    };
    int matched = 0, eligible = 0;
    for (const Region& r : g.regions) {
      if (!filter_matches_region(d.filter, r)) continue;
      ++matched;
      for (int s = r.seg_begin; s < r.seg_end; ++s) {
        // selective: only segment types that split their stash; the others keep all of it
        const SegmentType& type = *g.model->segments[size_t(s)].type;
        if (kept[size_t(s)] || !typed(type) || (selective && !type.rerun_tail)) continue;
        if (eligible++ % d.every != 0) continue;
        g.segment_recompute[size_t(s)] = selective ? kRecomputeSelective : kRecomputeFull;
      }
    }
    if (matched == 0) throw UserError(cat(d.describe(), ": filter ", d.filter.str(), " matches no region"));
  }
  std::vector<char> region_recomputes(g.regions.size(), 0);
  for (const Region& r : g.regions)
    for (int s = r.seg_begin; s < r.seg_end; ++s) region_recomputes[size_t(r.id)] |= g.segment_recompute[size_t(s)];
  // R(r, m) before each backward node: ready when that node would be (its compute and order predecessors; not
  // the arrival of its gradient, which the rerun may overlap), and that node then waits for it.
  const auto in = g.in_edges();
  const size_t nodes = g.nodes.size();
  for (size_t i = 0; i < nodes; ++i) {
    const Node x = g.nodes[i];
    const bool backward = x.kind == NodeKind::B || x.kind == NodeKind::BI;
    if (x.removed || !backward || !region_recomputes[size_t(x.region)]) continue;
    Node r = x;
    r.kind = NodeKind::R;
    const int rid = g.add_node(r);
    for (int ei : in[i]) {
      const int from = g.edges[size_t(ei)].from;
      if (!is_comm(g.nodes[size_t(from)].kind)) g.add_edge(from, rid, EdgeKind::Order);
    }
    g.add_edge(rid, int(i), EdgeKind::Data, {TensorRef::Kind::Stash, -1, x.mb});
  }
  g.check_acyclic("the recompute directive");
}

}  // namespace piper
