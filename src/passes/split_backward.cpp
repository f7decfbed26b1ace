// split-backward: where an order names BI or BW for a region, its fused backward B(r, m) becomes an
// input-gradient node BI(r, m) and a weight-gradient node BW(r, m) that may run later.
#include "passes/passes.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

bool names_split_pass(const Filter& f) {
  auto it = f.match.find("PASS");
  return it != f.match.end() && it->second.kind == TagMatch::Kind::Name &&
         (it->second.name == "BI" || it->second.name == "BW");
}

}  // namespace

void apply_split_backward(Graph& g, const std::vector<Directive>& orders) {
  for (const auto& d : orders) {
    for (const auto& slot : d.slots)
      for (const auto& f : slot) {
        if (!names_split_pass(f)) continue;
        Filter region_filter;
        for (const auto& [tag, m] : f.match)
          if (tag != "PASS" && tag != "MB") region_filter.match[tag] = m;
        for (auto& r : g.regions)
          if (filter_matches_region(region_filter, r)) r.split_backward = true;
      }
  }
  auto out = g.out_edges();
  auto in = g.in_edges();
  const size_t n_before = g.nodes.size();
  for (size_t i = 0; i < n_before; ++i) {
    Node& b = g.nodes[i];
    if (b.removed || b.kind != NodeKind::B || !g.regions[size_t(b.region)].split_backward) continue;
    Node bi = b, bw = b;
    bi.kind = NodeKind::BI;
    bw.kind = NodeKind::BW;
    bi.flops = b.flops / 2;
    bw.flops = b.flops / 2;
    b.removed = true;
    int bi_id = g.add_node(bi);
    int bw_id = g.add_node(bw);
    for (int ei : in[i]) {
      Edge e = g.edges[size_t(ei)];
      g.edges[size_t(ei)].removed = true;
      g.add_edge(e.from, bi_id, e.kind, e.tensor, e.source_directive);
      // the weight gradient needs the stash and the incoming gradient too
      if (e.tensor.kind == TensorRef::Kind::Stash || e.tensor.kind == TensorRef::Kind::ActGrad)
        g.add_edge(e.from, bw_id, e.kind, e.tensor, e.source_directive);
    }
    for (int ei : out[i]) {
      Edge e = g.edges[size_t(ei)];
      g.edges[size_t(ei)].removed = true;
      int from = e.tensor.kind == TensorRef::Kind::Grads ? bw_id : bi_id;
      g.add_edge(from, e.to, e.kind, e.tensor, e.source_directive);
    }
    g.add_edge(bi_id, bw_id, EdgeKind::Data, {TensorRef::Kind::Stash, -1, bi.mb});
  }
}

}  // namespace piper
