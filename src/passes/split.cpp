// split: copies every compute node once per microbatch (tag MB = 0..count-1); each copy reads its own
// slice of the batch. Edges between copied nodes connect equal microbatches; edges to uncopied nodes fan in.
#include "passes/passes.hpp"
#include "util/error.hpp"

namespace piper {

void apply_split(Graph& g, const Directive& d) {
  if (g.microbatches > 1)
    throw UserError(cat(d.describe(), ": the batch is already split; use one split directive"));
  for (const auto& r : g.regions)
    if (!filter_matches_region(d.filter, r))
      throw UserError(cat(d.describe(), ": filter ", d.filter.str(), " leaves ", r.label(),
                          " out; a split must cover every region"));
  for (const auto& [tag, m] : d.filter.match)
    if (tag == "MB" || tag == "PASS") throw UserError(cat(d.describe(), ": a split filter cannot name ", tag));
  const int count = d.count;
  if (count == 1) return;

  std::vector<std::vector<int>> copies(g.nodes.size());
  const size_t n_before = g.nodes.size();
  for (size_t i = 0; i < n_before; ++i) {
    if (g.nodes[i].removed || !is_compute(g.nodes[i].kind)) continue;
    Node base = g.nodes[i];
    g.nodes[i].removed = true;
    for (int m = 0; m < count; ++m) {
      Node c = base;
      c.tags["MB"] = m;
      c.mb = m;
      c.source_directive = d.index;
      copies[i].push_back(g.add_node(c));
    }
  }
  const size_t e_before = g.edges.size();
  for (size_t ei = 0; ei < e_before; ++ei) {
    Edge e = g.edges[ei];
    if (e.removed) continue;
    bool cf = !copies[size_t(e.from)].empty(), ct = size_t(e.to) < copies.size() && !copies[size_t(e.to)].empty();
    if (!cf && !ct) continue;
    g.edges[ei].removed = true;
    for (int m = 0; m < count; ++m) {
      TensorRef t = e.tensor;
      t.mb = m;
      int from = cf ? copies[size_t(e.from)][size_t(m)] : e.from;
      int to = ct ? copies[size_t(e.to)][size_t(m)] : e.to;
      g.add_edge(from, to, e.kind, t, e.source_directive);
    }
  }
  g.microbatches = count;
  g.samples_per_microbatch = g.global_batch / count;  // divided by the replica count after placement
}

}  // namespace piper
