// Tied parameters (GPT's token embedding, also the LM head's weight): when the embedding and the head
// sit on different device sets, each holds a copy; their gradients are summed across the two sets
// (same replica index) after data-parallel reduction, so both copies take identical steps.
#include "ir/build.hpp"
#include "passes/passes.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

// Nodes after which bucket b's gradients are final on its set.
std::vector<int> finalizers(const Graph& g, int b, int sync) {
  std::vector<int> out;
  for (const auto& n : g.nodes)
    if (!n.removed && n.purpose == CommPurpose::Gradient && n.bucket == b) out.push_back(n.id);
  if (!out.empty()) return out;
  for (const auto& n : g.nodes)
    if (!n.removed && writes_grads(n) && region_uses_bucket(g, n.region, b)) out.push_back(n.id);
  (void)sync;
  return out;
}

}  // namespace

void insert_tied_sync(Graph& g) {
  const int sync = step_sync_node(g);
  for (size_t k = 0; k < g.buckets.size(); ++k) {
    const Bucket& copy = g.buckets[k];
    if (!copy.tied_copy) continue;
    int home = -1;
    for (size_t h = 0; h < g.buckets.size(); ++h)
      if (!g.buckets[h].tied_copy && g.buckets[h].params == copy.params) home = int(h);
    PIPER_CHECK(home >= 0, "tied copy without a home bucket");
    const Region& rh = g.regions[size_t(g.buckets[size_t(home)].region)];
    const Region& rc = g.regions[size_t(copy.region)];
    if (rh.zero != rc.zero)
      throw UserError(cat("parameter '", g.model->params[size_t(copy.params[0])].name, "' is shared by ", rh.label(),
                          " (zero = ", rh.zero, ") and ", rc.label(), " (zero = ", rc.zero,
                          "); regions sharing a parameter need the same replicate settings"));
    Node t;
    t.kind = NodeKind::ALL_REDUCE;
    t.purpose = CommPurpose::TiedGradient;
    t.stream = "tie";
    t.tie_sets = {rh.device_set, rc.device_set};
    t.tie_buckets = {home, int(k)};
    t.bucket = home;
    t.tensor = {TensorRef::Kind::Grads, home, -1};
    int id = g.add_node(t);
    for (int f : finalizers(g, home, sync)) g.add_edge(f, id, EdgeKind::Data, t.tensor);
    for (int f : finalizers(g, int(k), sync)) g.add_edge(f, id, EdgeKind::Data, t.tensor);
    g.add_edge(id, sync, EdgeKind::Data, t.tensor);
  }
}

}  // namespace piper
