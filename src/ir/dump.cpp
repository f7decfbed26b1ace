// Text and DOT dumps of the training DAG (see dump.hpp).
#include "ir/dump.hpp"

#include <sstream>

#include "util/error.hpp"

namespace piper {

std::string graph_to_text(const Graph& g) {
  std::ostringstream os;
  os << "# training graph: " << g.live_nodes() << " nodes, " << g.microbatches << " microbatches, world " << g.world
     << "\nregions:\n";
  for (const auto& r : g.regions) {
    os << "  " << r.label() << ": segments " << g.model->segments[size_t(r.seg_begin)].name << ".."
       << g.model->segments[size_t(r.seg_end - 1)].name << ", device set " << r.device_set;
    if (r.zero >= 0) os << ", replicated zero=" << r.zero << " bucket_mb=" << r.bucket_mb;
    if (r.split_backward) os << ", split backward";
    os << "\n";
  }
  os << "device sets:\n";
  for (size_t s = 0; s < g.sets.size(); ++s) {
    os << "  set " << s << ": ranks";
    for (int r : g.sets[s].ranks) os << " " << r;
    os << "\n";
  }
  os << "buckets:\n";
  for (size_t b = 0; b < g.buckets.size(); ++b) {
    os << "  bucket " << b << " (region " << g.buckets[b].region << ", " << g.buckets[b].numel << " params"
       << (g.buckets[b].tied_copy ? ", tied copy" : "") << "):";
    for (int p : g.buckets[b].params) os << " " << g.model->params[size_t(p)].name;
    os << "\n";
  }
  os << "nodes:\n";
  auto in = g.in_edges();
  for (const auto& n : g.nodes) {
    if (n.removed) continue;
    os << "  n" << n.id << " " << n.label();
    if (n.device_set >= 0) os << " @set" << n.device_set;
    if (is_comm(n.kind)) os << " (" << comm_purpose_name(n.purpose) << ", stream " << n.stream << ")";
    if (!in[size_t(n.id)].empty()) {
      os << " <-";
      for (int ei : in[size_t(n.id)]) {
        const Edge& e = g.edges[size_t(ei)];
        os << " n" << e.from << (e.kind == EdgeKind::Order ? "(order)" : "");
      }
    }
    os << "\n";
  }
  return os.str();
}

std::string graph_to_dot(const Graph& g) {
  std::ostringstream os;
  os << "digraph training {\n  rankdir=LR;\n  node [shape=box, fontsize=10];\n";
  for (size_t s = 0; s < g.sets.size(); ++s) {
    os << "  subgraph cluster_set" << s << " {\n    label=\"device set " << s << "\";\n";
    for (const auto& n : g.nodes)
      if (!n.removed && n.device_set == int(s))
        os << "    n" << n.id << " [label=\"" << n.label() << "\"" << (is_comm(n.kind) ? ", shape=ellipse" : "") << "];\n";
    os << "  }\n";
  }
  for (const auto& n : g.nodes)
    if (!n.removed && n.device_set < 0) os << "  n" << n.id << " [label=\"" << n.label() << "\", shape=ellipse];\n";
  for (const auto& e : g.edges) {
    if (e.removed) continue;
    os << "  n" << e.from << " -> n" << e.to;
    if (e.kind == EdgeKind::Order) os << " [style=dashed, color=gray]";
    os << ";\n";
  }
  os << "}\n";
  return os.str();
}

}  // namespace piper
