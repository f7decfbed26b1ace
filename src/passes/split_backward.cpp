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
  const size_t n_before = g.nodes.size();
  std::vector<int> to_split;
  for (size_t i = 0; i < n_before; ++i) {
    const Node& b = g.nodes[i];
    if (!b.removed && b.kind == NodeKind::B && g.regions[size_t(b.region)].split_backward) to_split.push_back(int(i));
  }
  if (to_split.empty()) return;
  // Live edges per node, kept up to date as nodes are replaced (a neighbour may itself be split later).
  std::vector<std::vector<int>> in(g.nodes.size() + 2 * to_split.size()), out(in.size());
  for (size_t ei = 0; ei < g.edges.size(); ++ei)
    if (!g.edges[ei].removed) {
      in[size_t(g.edges[ei].to)].push_back(int(ei));
      out[size_t(g.edges[ei].from)].push_back(int(ei));
    }
  auto connect = [&](int from, int to, EdgeKind kind, const TensorRef& t, int directive) {
    int ei = g.add_edge(from, to, kind, t, directive);
    in[size_t(to)].push_back(ei);
    out[size_t(from)].push_back(ei);
  };
  for (int i : to_split) {
    Node& b = g.nodes[size_t(i)];
    Node bi = b, bw = b;
    bi.kind = NodeKind::BI;
    bw.kind = NodeKind::BW;
    b.removed = true;
    int bi_id = g.add_node(bi);
    int bw_id = g.add_node(bw);
    for (int ei : in[size_t(i)]) {
      if (g.edges[size_t(ei)].removed) continue;
      Edge e = g.edges[size_t(ei)];
      g.edges[size_t(ei)].removed = true;
      connect(e.from, bi_id, e.kind, e.tensor, e.source_directive);
      // the weight gradient needs the stash and the incoming gradient too
      if (e.tensor.kind == TensorRef::Kind::Stash || e.tensor.kind == TensorRef::Kind::ActGrad)
        connect(e.from, bw_id, e.kind, e.tensor, e.source_directive);
    }
    for (int ei : out[size_t(i)]) {
      if (g.edges[size_t(ei)].removed) continue;
      Edge e = g.edges[size_t(ei)];
      g.edges[size_t(ei)].removed = true;
      int from = e.tensor.kind == TensorRef::Kind::Grads ? bw_id : bi_id;
      connect(from, e.to, e.kind, e.tensor, e.source_directive);
    }
    connect(bi_id, bw_id, EdgeKind::Data, {TensorRef::Kind::Stash, -1, bi.mb}, -1);
  }
}

}  // namespace piper
