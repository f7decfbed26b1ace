// order: happens-before edges between consecutive slots of matched compute nodes. Nodes inside one slot
// may interleave. Rejects filters that match nothing, orders spanning device sets, and cycles.
// All orders share one index of the compute nodes and one cycle check, so that a job's orders cost
// their matches and edges, not directives x nodes.
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "passes/passes.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

// The live compute nodes, in id order, and the same by the values of the exact tags a filter names: a
// filter is tried only on the nodes that carry all of its exact tag values (MB = m and PP = p, say), so
// that an order costs its matches, not slots × nodes. The index of each combination of tags is built the
// first time a filter names it.
class ComputeIndex {
 public:
  explicit ComputeIndex(const Graph& g) : g_(g) {
    for (const auto& n : g.nodes)
      if (!n.removed && is_compute(n.kind)) all_.push_back(n.id);
  }
  // Nodes that may match `f`, in id order: a superset of its matches.
  const std::vector<int>& candidates(const Filter& f) {
    std::vector<std::string> tags;
    std::vector<int> values;
    for (const auto& [tag, m] : f.match) {  // std::map: tags in name order
      if (tag == "PASS" || m.kind != TagMatch::Kind::Int) continue;
      tags.push_back(tag);
      values.push_back(int(m.value));
    }
    if (tags.empty()) return all_;
    auto by = by_tags_.find(tags);
    if (by == by_tags_.end()) by = by_tags_.emplace(tags, build(tags)).first;
    auto it = by->second.find(values);
    return it == by->second.end() ? none_ : it->second;
  }

 private:
  using ByValues = std::map<std::vector<int>, std::vector<int>>;
  ByValues build(const std::vector<std::string>& tags) const {
    ByValues by;
    std::vector<int> values(tags.size());
    for (int id : all_) {
      const auto& node_tags = g_.nodes[size_t(id)].tags;
      bool has_all = true;
      for (size_t i = 0; i < tags.size() && has_all; ++i) {
        auto t = node_tags.find(tags[i]);
        if (t == node_tags.end()) has_all = false;
        else values[i] = t->second;
      }
      if (has_all) by[values].push_back(id);
    }
    return by;
  }
  const Graph& g_;
  std::vector<int> all_;
  const std::vector<int> none_;
  std::map<std::vector<std::string>, ByValues> by_tags_;
};

// Adds the edges of one order directive.
void add_order_edges(Graph& g, const Directive& d, ComputeIndex& index) {
  std::vector<std::vector<int>> slots;
  std::set<int> seen;
  int set = -1, set_node = -1;
  for (size_t i = 0; i < d.slots.size(); ++i) {
    std::vector<int> nodes;
    for (size_t j = 0; j < d.slots[i].size(); ++j) {
      const Filter& f = d.slots[i][j];
      size_t before = nodes.size();
      for (int id : index.candidates(f)) {
        const Node& n = g.nodes[size_t(id)];
        if (!filter_matches(f, n)) continue;
        if (seen.count(n.id))
          throw UserError(cat(d.describe(), ": ", n.label(), " is matched by two slots (again by slot ", i, " filter ",
                              f.str(), ")"));
        seen.insert(n.id);
        nodes.push_back(n.id);
        if (set < 0) { set = n.device_set; set_node = n.id; }
        if (n.device_set != set)
          throw UserError(cat(d.describe(), ": slot ", i, " filter ", f.str(), " matches ", n.label(), " on device set ",
                              n.device_set, " but ", g.nodes[size_t(set_node)].label(), " is on device set ", set,
                              "; an order applies to one device set (write one order per pipeline rank)"));
      }
      if (nodes.size() == before) {
        // Say why: a PASS the graph does not have is the usual mistake.
        std::string hint;
        auto it = f.match.find("PASS");
        if (it != f.match.end() && it->second.kind == TagMatch::Kind::Name && it->second.name == "B")
          hint = " (this region's backward is split into BI and BW by another order)";
        throw UserError(cat(d.describe(), ": slot ", i, " filter ", f.str(), " matches no compute node", hint));
      }
    }
    slots.push_back(std::move(nodes));
  }
  for (size_t i = 0; i + 1 < slots.size(); ++i)
    for (int a : slots[i])
      for (int b : slots[i + 1]) g.add_edge(a, b, EdgeKind::Order, {}, d.index);
}

}  // namespace

void apply_orders(Graph& g, const std::vector<Directive>& orders) {
  std::vector<size_t> first_edge;
  if (!orders.empty()) {
    ComputeIndex index(g);  // orders add edges only: the compute nodes stay the same
    for (const auto& d : orders) {
      first_edge.push_back(g.edges.size());
      add_order_edges(g, d, index);
    }
    first_edge.push_back(g.edges.size());
  }
  if (g.topo_order().size() == g.live_nodes()) return;  // the one check of the whole graph
  // A cycle: name what closes it, as if the graph were checked before the orders and after each one. Take
  // every order edge out, then put each directive's back and check (only on this error path).
  if (!orders.empty())
    for (size_t e = first_edge.front(); e < first_edge.back(); ++e) g.edges[e].removed = true;
  g.check_acyclic("the training graph");
  for (size_t k = 0; k < orders.size(); ++k) {
    for (size_t e = first_edge[k]; e < first_edge[k + 1]; ++e) g.edges[e].removed = false;
    g.check_acyclic(orders[k].describe());
  }
  g.check_acyclic("the training graph");
}

}  // namespace piper
